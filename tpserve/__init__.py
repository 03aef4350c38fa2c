"""tpserve: serve PyTorch models with NVIDIA Triton (export, check, build repositories, launch, measure).

The one import package this project installs (docs/architecture.md): its parts are subpackages, so a user's own
`common`, `server` or `clients` never meets ours. Nothing is imported here: each part loads what it needs.
"""
