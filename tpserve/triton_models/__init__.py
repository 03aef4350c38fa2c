"""Code that runs inside tritonserver, by the process it runs in:

- python_backend/: the Python backend's stubs (the model.py files the builders copy into repositories);
- runtime/: serving code without Triton's API (torch runtime, ragged planning and running, the tokenizer core);
- inprocess/: the in-process backend, embedded in tritonserver's own process, with its C in inprocess/native/.

It imports no other part of tpserve (the torch runtime loads a torch.export program, not the model's source), so
the layers stay one way: spec -> artifacts -> repository -> server -> measurement.
"""

from pathlib import Path

_HERE = Path(__file__).parent
STUBS = _HERE / "python_backend"
NATIVE = _HERE / "inprocess" / "native"

ONNXRUNTIME_MODEL = STUBS / "onnxruntime_model.py"
TORCH_MODEL = STUBS / "torch_model.py"
IMAGE_PREPROCESS = STUBS / "image_preprocess.py"
CLASSIFY_POSTPROCESS = STUBS / "classify_postprocess.py"
TEXT_TOKENIZE = STUBS / "text_tokenize.py"
TEXT_POOL = STUBS / "text_pool.py"
# the in-process backend's library: the shim that starts Python inside tritonserver, and the native request paths
INPROCESS_SHIM = NATIVE / "shim.c"
INPROCESS_SOURCES = tuple(
    NATIVE / name
    for name in (
        "shim.c",
        "common.c",  # the helpers every path shares (native.h)
        "image_path.c",
        "batch_calls.c",  # Python's per-batch calls
        "ragged_path.c",
        "ragged_plan.c",
        "metrics.c",  # the backend's latency histogram
        "tokenize_path.c",  # the tokenize step (BERT-style tokenizers, ASCII texts)
        "bert_tokenize.c",
    )
)
