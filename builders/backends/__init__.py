"""Python-backend model files copied into embedded-target model versions (as model.py)."""

from pathlib import Path

ONNXRUNTIME_MODEL = Path(__file__).with_name("onnxruntime_model.py")
TORCH_MODEL = Path(__file__).with_name("torch_model.py")
IMAGE_PREPROCESS = Path(__file__).with_name("image_preprocess.py")
CLASSIFY_POSTPROCESS = Path(__file__).with_name("classify_postprocess.py")
TEXT_TOKENIZE = Path(__file__).with_name("text_tokenize.py")
TEXT_POOL = Path(__file__).with_name("text_pool.py")
