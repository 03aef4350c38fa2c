"""Code that runs inside tritonserver: the Python-backend model.py files of the embedded target.

The builders copy these files into <repository>/<model>/<version>/model.py. They depend on
nothing of the builders (the torch runtime loads a torch.export program, not the model's
source), so the layers stay one way: spec -> artifacts -> repository -> server -> measurement.
"""

from pathlib import Path

ONNXRUNTIME_MODEL = Path(__file__).with_name("onnxruntime_model.py")
TORCH_MODEL = Path(__file__).with_name("torch_model.py")
IMAGE_PREPROCESS = Path(__file__).with_name("image_preprocess.py")
CLASSIFY_POSTPROCESS = Path(__file__).with_name("classify_postprocess.py")
TEXT_TOKENIZE = Path(__file__).with_name("text_tokenize.py")
TEXT_POOL = Path(__file__).with_name("text_pool.py")
INPROCESS_SHIM = Path(__file__).with_name("inprocess_shim.c")
INPROCESS_NATIVE = Path(__file__).with_name("inprocess_native.c")  # compiled into the same library
INPROCESS_BATCH_CALLS = Path(__file__).with_name("inprocess_batch_calls.c")  # Python's per-batch calls, same library
# the native path of sequence models and its plan, compiled into it too (headers: inprocess_native.h, ragged_plan.h)
INPROCESS_RAGGED = (Path(__file__).with_name("inprocess_ragged_native.c"), Path(__file__).with_name("ragged_plan.c"))
INPROCESS_METRICS = Path(__file__).with_name("inprocess_metrics.c")  # the backend's latency histogram, same library
# the tokenize step's native path (BERT-style tokenizers, ASCII texts), same library
INPROCESS_TOKENIZE = (
    Path(__file__).with_name("inprocess_tokenize_native.c"),
    Path(__file__).with_name("bert_tokenize.c"),
)
