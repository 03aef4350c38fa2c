"""Launching Triton: the embedded tritonserver from the nvidia-pytriton wheel."""
