"""Image pipeline ensembles generated from a spec: preprocess → classifier → postprocess.

<model>_pipeline takes encoded image bytes; <model>_pipeline_u8 takes raw uint8 NHWC pixels
(4x fewer bytes on the wire than float32). The classifier is any served variant of the model
(its ONNX model, the INT8 one, a torch-runtime one) named by `classifier`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tpserve.builders.repository import writer as repository
from tpserve.builders.repository.model_config import (
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    ModelConfig,
    TensorConfig,
    on_gpu,
    parse_pbtxt,
)
from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.common.errors import SpecError
from tpserve.triton_models import CLASSIFY_POSTPROCESS, IMAGE_PREPROCESS, TEXT_POOL, TEXT_TOKENIZE

DEFAULT_TOP_K = 5


def _check(spec: ModelSpec) -> None:
    if spec.preprocessing is None or spec.image_input is None or not spec.labels:
        raise SpecError(f"{spec.name}: an image pipeline needs an image input with preprocessing and labels")


def preprocess_config(spec: ModelSpec, raw: bool, options: repository.ServingOptions) -> ModelConfig:
    """The preprocess step: bytes (or uint8 NHWC pixels) in, the classifier's input out."""
    pre, image = spec.preprocessing, spec.image_input
    if pre is None or image is None:
        raise SpecError(f"{spec.name}: an image pipeline needs an image input with preprocessing")
    height, width = pre.image_size
    source = (
        TensorConfig("IMAGE", "TYPE_UINT8", (height, width, pre.channels), "FORMAT_NHWC")
        if raw
        else TensorConfig("IMAGE", "TYPE_STRING", (1,))
    )
    fmt = f"FORMAT_{image.image_format}"
    return ModelConfig(
        name=f"{spec.name}_preprocess{'_u8' if raw else ''}",
        backend="python",
        max_batch_size=spec.max_batch_size,
        inputs=[source],
        outputs=[TensorConfig("PIXELS", "TYPE_FP32", image.dims, fmt)],
        dynamic_batching=_batching(spec, options),
        instance_groups=[InstanceGroup(options.instances or 1, "KIND_CPU")],
        parameters={
            "image_size": f"{height} {width}",
            "channels": pre.channels,
            "layout": image.image_format,
            "mean": " ".join(map(str, pre.mean)),
            "std": " ".join(map(str, pre.std)),
        },
    )


def postprocess_config(spec: ModelSpec, top_k: int, options: repository.ServingOptions) -> ModelConfig:
    """The postprocess step: logits in; top-k class ids, probabilities and labels out."""
    classes = spec.outputs[0].dims[-1]
    if not 1 <= top_k <= classes:
        raise SpecError(f"{spec.name}: top_k {top_k} must lie within 1..{classes} classes")
    return ModelConfig(
        name=f"{spec.name}_postprocess",
        backend="python",
        max_batch_size=spec.max_batch_size,
        inputs=[TensorConfig("LOGITS", "TYPE_FP32", spec.outputs[0].dims)],
        outputs=[
            TensorConfig("CLASS_IDS", "TYPE_INT64", (top_k,)),
            TensorConfig("SCORES", "TYPE_FP32", (top_k,)),
            TensorConfig("LABELS", "TYPE_STRING", (top_k,)),
        ],
        dynamic_batching=_batching(spec, options),
        instance_groups=[InstanceGroup(options.instances or 1, "KIND_CPU")],
        parameters={"top_k": top_k},
    )


def ensemble_config(spec: ModelSpec, classifier: str, raw: bool, pre: ModelConfig, post: ModelConfig) -> ModelConfig:
    """The ensemble wiring the three steps together."""
    return ModelConfig(
        name=f"{spec.name}_pipeline{'_u8' if raw else ''}",
        platform="ensemble",
        max_batch_size=spec.max_batch_size,
        inputs=[pre.inputs[0]],
        outputs=list(post.outputs),
        ensemble_steps=[
            EnsembleStep(pre.name, {"IMAGE": "IMAGE"}, {"PIXELS": "pixels"}),
            EnsembleStep(classifier, {spec.inputs[0].name: "pixels"}, {spec.outputs[0].name: "logits"}),
            EnsembleStep(post.name, {"LOGITS": "logits"}, {t.name: t.name for t in post.outputs}),
        ],
    )


def write_image_pipelines(
    repo: Path,
    spec: ModelSpec,
    classifier: str | None = None,
    top_k: int = DEFAULT_TOP_K,
    options: repository.ServingOptions | None = None,
) -> list[str]:
    """Write both pipelines (bytes and uint8) and their steps; return the model names written."""
    _check(spec)
    options = options or repository.ServingOptions()
    classifier = classifier or spec.name
    if not (repo / classifier / "config.pbtxt").exists():
        raise SpecError(f"classifier {classifier!r} is not in {repo}: build it first (make build-engines)")
    top_k = min(top_k, spec.outputs[0].dims[-1]) if top_k == DEFAULT_TOP_K else top_k  # fewer classes than 5
    post = postprocess_config(spec, top_k, options)
    written = [_write(repo, spec, post, CLASSIFY_POSTPROCESS)]
    for raw in (False, True):
        pre = preprocess_config(spec, raw, options)
        written.append(_write(repo, spec, pre, IMAGE_PREPROCESS))
        written.append(_write(repo, spec, ensemble_config(spec, classifier, raw, pre, post), None))
    return written


def text_pipeline_configs(
    spec: ModelSpec, options: repository.ServingOptions, inprocess: bool = False, tokenize_instances: int = 1
) -> list[ModelConfig]:
    """tokenize → encoder (→ pool, where the encoder does not pool itself), and the ensemble <model>_pipeline
    (TEXT in, EMBEDDING out). The tokenize step batches dynamically: one Rust encode_batch per batch; inprocess:
    it runs in the in-process backend (triton_models/inprocess/tokenize_serving.py) instead of a Python-backend stub."""
    ids, mask = (TensorConfig(t.name, f"TYPE_{t.dtype}", t.dims) for t in spec.inputs)
    hidden = spec.outputs[0].dims[-1]
    common: dict[str, Any] = dict(
        backend="python",
        max_batch_size=spec.max_batch_size,
        instance_groups=[InstanceGroup(options.instances or 1, "KIND_CPU")],
    )
    tokenize = ModelConfig(
        name=f"{spec.name}_tokenize",
        inputs=[TensorConfig("TEXT", "TYPE_STRING", (1,))],
        outputs=[ids, mask],
        dynamic_batching=_batching(spec, options),
        parameters={"max_length": spec.longest_sequence(), "dlpack_outputs": 1},
        **common,
    )
    if inprocess:
        params = {"max_length": spec.longest_sequence(), "runtime": "tokenize"}
        # each instance's child processes tokenize its batch in parallel (tokenize_serving.py)
        groups = [InstanceGroup(tokenize_instances, "KIND_CPU")]
        tokenize = dataclasses.replace(
            tokenize, backend=repository.INPROCESS_BACKEND, parameters=params, instance_groups=groups
        )
    embedding = [TensorConfig("EMBEDDING", "TYPE_FP32", (hidden,))]
    steps = [EnsembleStep(tokenize.name, {"TEXT": "TEXT"}, {ids.name: "ids", mask.name: "mask"})]
    encoder_in = {ids.name: "ids", mask.name: "mask"}
    if spec.pooling:  # the encoder's engine pools: two steps
        steps.append(EnsembleStep(spec.name, encoder_in, {spec.outputs[0].name: "EMBEDDING"}))
        models = [tokenize]
    else:
        tokens = TensorConfig("token_embeddings", "TYPE_FP32", (-1, hidden))
        pool = ModelConfig(name=f"{spec.name}_pool", inputs=[tokens, mask], outputs=embedding, **common)
        steps.append(EnsembleStep(spec.name, encoder_in, {spec.outputs[0].name: "tokens"}))
        steps.append(
            EnsembleStep(pool.name, {"token_embeddings": "tokens", mask.name: "mask"}, {"EMBEDDING": "EMBEDDING"})
        )
        models = [tokenize, pool]
    ensemble = ModelConfig(
        name=f"{spec.name}_pipeline",
        platform="ensemble",
        max_batch_size=spec.max_batch_size,
        inputs=tokenize.inputs,
        outputs=embedding,
        ensemble_steps=steps,
    )
    return models + [ensemble]


def write_text_pipeline(
    repo: Path,
    spec: ModelSpec,
    tokenizer_json: Path,
    options: repository.ServingOptions | None = None,
    inprocess: bool = False,
) -> list[str]:
    """Write <model>_tokenize (and <model>_pool where the encoder does not pool) and the <model>_pipeline ensemble;
    inprocess: the tokenize step in the in-process backend (no stub; any numpy)."""
    if not (repo / spec.name / "config.pbtxt").exists():
        raise SpecError(f"encoder {spec.name!r} is not in {repo}: build it first (make build-engines)")
    instances = tokenize_instances(repo / spec.name / "config.pbtxt") if inprocess else 1
    configs = text_pipeline_configs(spec, options or repository.ServingOptions(), inprocess, instances)
    sources = {f"{spec.name}_pool": TEXT_POOL, **({} if inprocess else {f"{spec.name}_tokenize": TEXT_TOKENIZE})}
    for config in configs:
        extra = {"tokenizer.json": tokenizer_json} if config.name.endswith("_tokenize") else None
        _write(repo, spec, config, sources.get(config.name), extra)
    return [c.name for c in configs]


def tokenize_instances(engine_config: Path) -> int:
    """Instances of the in-process tokenize step beside this engine: two beside an engine on a GPU (one instance's
    children tokenize while the other reads its batch and answers in the server: on an H200 host raw text served
    108,640 sentences/s against 83,659 with one instance of four children and 101,493 with one of eight), one
    beside an engine on the CPU (the CPU host's cores are the engine's: two instances served raw text 75-85
    against 96-100 sentences/s on 2 cores)."""
    return 2 if on_gpu(parse_pbtxt(engine_config.read_text())) else 1


def _write(repo: Path, spec: ModelSpec, config: ModelConfig, model_py: Path | None, extra: dict | None = None) -> str:
    artifacts = {**({"model.py": model_py} if model_py else {}), **(extra or {})}
    labelled = dataclasses.replace(spec, name=config.name)
    repository.write_model(repo, labelled, config, artifacts, "embedded")
    return config.name


def _batching(spec: ModelSpec, options) -> DynamicBatching:
    """A step's dynamic batcher: the model's queue delay, and its queue bounded as the model's own is."""
    policy = options.queue_policy or repository.default_queue_policy(spec, "embedded", options)
    return DynamicBatching(max_queue_delay_microseconds=options.max_queue_delay_us, queue_policy=policy)
