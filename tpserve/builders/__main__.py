"""Command line of the builders: `python -m tpserve.builders build ...`."""

import dataclasses
import logging
from pathlib import Path

import click

from tpserve.common import options
from tpserve.common.cli import step, user_errors


@click.group()
def cli():
    """Export PyTorch models to ONNX, validate them, and write a Triton model repository."""


def _split(value: str) -> list[str]:
    return [v for v in value.replace(",", " ").split() if v]


@cli.command()
@click.option(
    "--models", default="", help="Zoo models, space- or comma-separated (default: digits_cnn, unless --spec is given)."
)
@click.option(
    "--spec",
    "spec_file",
    type=click.Path(path_type=Path),
    default=None,
    help="A TOML file declaring your own models (docs/building.md, 'Your own models'); with --models, both are built.",
)
@click.option(
    "--target",
    type=click.Choice(["auto", "embedded", "ngc"]),
    default="auto",
    show_default=True,
    help="embedded: Python backend for the pip tritonserver; ngc: native backends of the NGC images; "
    "auto: ngc where a Docker engine answers, else embedded.",
)
@options.REPO
@click.option(
    "--work-dir",
    type=click.Path(path_type=Path),
    default=Path("work"),
    show_default=True,
    help="Where exported ONNX models and validation reports are cached.",
)
@click.option("--weights", default=None, help="'random' (default) or a torchvision weights name, e.g. DEFAULT.")
@click.option("--max-batch", type=int, default=None, help="Override the spec's max_batch_size.")
@click.option(
    "--instances",
    type=int,
    default=0,
    show_default=True,
    help="Instances per model (0: two for a sequence model on the CPU, the cores shared between them; else one).",
)
@click.option("--kind", type=click.Choice(["KIND_CPU", "KIND_GPU", "KIND_AUTO"]), default="KIND_CPU", show_default=True)
@click.option("--max-queue-delay-us", type=int, default=100, show_default=True)
@click.option(
    "--intra-op-threads",
    type=int,
    default=0,
    show_default=True,
    help="ONNX Runtime threads per instance (embedded target); 0: one per physical core.",
)
@click.option("--preferred-batch", default="", help="Preferred batch sizes, e.g. '4 8'.")
@click.option("--no-dynamic-batching", is_flag=True, help="Serve without Triton's dynamic batcher.")
@click.option(
    "--no-ragged-batching",
    is_flag=True,
    help="Sequence models (ONNX Runtime, embedded target): batch only requests of the same length, as Triton does "
    "by default (default: every length in one batch; on a 2-core host the same-length layout had the lower p99, "
    "docs/benchmarks.md).",
)
@click.option("--force", is_flag=True, help="Rebuild even if the inputs are unchanged.")
@click.option(
    "--pipelines/--no-pipelines",
    default=True,
    show_default=True,
    help="Also write <model>_pipeline and <model>_pipeline_u8 ensembles for image classifiers.",
)
@click.option(
    "--precisions", default="fp32", show_default=True, help="'fp32' and/or 'int8' (QDQ, served as <model>_int8)."
)
@click.option(
    "--calibration",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="INT8 calibration data: a folder of images or an .npy array (default: the spec's).",
)
@click.option(
    "--compiled",
    default="",
    help="Also build compiled engines (torch.compile/inductor, gated, with their compile cache) in these "
    "precisions, e.g. 'fp16 bf16': <model>_inductor_<precision>. On a CUDA GPU: KIND_GPU, channels_last, "
    "CUDA graphs; without one: KIND_CPU.",
)
@click.option("--uint8-input", is_flag=True, help="Compiled engines take uint8 NHWC images, normalized in the engine.")
@click.option(
    "--inprocess",
    is_flag=True,
    help="Compiled engines are served by the in-process backend (inside tritonserver, no stub process; "
    "<model>_inductor_<precision>[_u8]_inproc). The server builds it at start: needs cc and the Python headers.",
)
@click.option(
    "--shapes-from",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="A traffic recording (STATE_DIR/traffic of `make serve RECORD=1`) or a fitted workload: pick length "
    "buckets, graph batch sizes, preferred batch sizes and the queue delay from its shapes and rates.",
)
@click.option("-v", "--verbose", is_flag=True, help="Show the exporter's warnings (hidden by default).")
@user_errors
def build(
    models,
    spec_file,
    target,
    repo,
    work_dir,
    weights,
    max_batch,
    instances,
    kind,
    max_queue_delay_us,
    preferred_batch,
    no_dynamic_batching,
    no_ragged_batching,
    force,
    intra_op_threads,
    precisions,
    calibration,
    pipelines,
    compiled,
    uint8_input,
    inprocess,
    shapes_from,
    verbose,
):
    """Build MODELS (zoo) and the models of --spec into the repository REPO, one validated model at a time."""
    from tpserve.builders.formats import export
    from tpserve.builders.repository.writer import ServingOptions, default_target
    from tpserve.builders.request import BuildRequest
    from tpserve.builders.spec import spec_file as spec_files
    from tpserve.builders.spec import zoo

    if verbose:  # the exporter's warnings and log lines too
        logging.getLogger(export.LOG_NAME).setLevel(logging.DEBUG)
    target = default_target() if target == "auto" else target
    _check_compiled(_split(compiled))
    preferred = tuple(int(b) for b in _split(preferred_batch))
    options = ServingOptions(
        instances=instances,
        kind=kind,
        max_queue_delay_us=max_queue_delay_us,
        preferred_batch_sizes=preferred,
        dynamic_batching=not no_dynamic_batching,
        intra_op_threads=intra_op_threads,
        ragged_batching=not no_ragged_batching,
    )
    names = _split(models) or ([] if spec_file else ["digits_cnn"])
    requests = [
        (
            BuildRequest(
                spec=zoo.get_spec(n, weights=weights, max_batch_size=max_batch),
                target=target,
                repo=repo,
                work_dir=work_dir,
                options=options,
                force=force,
                precisions=tuple(_split(precisions)),
                calibration=calibration,
            ),
            pipelines,
        )
        for n in names
    ]
    given = _given_serving(click.get_current_context(), options)
    typed = click.get_current_context().get_parameter_source("precisions") == click.core.ParameterSource.COMMANDLINE
    extra = tuple(_split(precisions)) if typed else ()  # PRECISIONS="fp32 int8" adds int8 to the spec's models too
    for user in spec_files.load(spec_file) if spec_file else []:
        request = BuildRequest(
            spec=_with_max_batch(user.spec, max_batch),
            target=target,
            repo=repo,
            work_dir=work_dir,
            options=dataclasses.replace(user.serving, **given),
            force=force,
            precisions=tuple(dict.fromkeys((*user.precisions, *extra))),
            calibration=user.calibration or calibration,
            eval_data=user.eval_data,
        )
        requests.append((request, pipelines and user.pipelines))
    if _split(compiled):
        _check_ragged_with_compiled([r for r, _ in requests])
    tunings = _tunings(shapes_from, [r for r, _ in requests], work_dir) if shapes_from else {}
    for i, (request, with_pipelines) in enumerate(requests, start=1):
        step(f"[{i}/{len(requests)}] {request.spec.name}")
        tuning = tunings.get(request.spec.name)
        if tuning is not None:
            request = _tuned(request, tuning)
        _build_one(request, with_pipelines)
        for precision in _split(compiled):
            _build_compiled(request, precision, uint8_input, inprocess, tuning)
    click.echo(f"repository ready: {repo} (manifest: {repo / 'manifest.json'})")


# command-line options -> the ServingOptions field each sets
_SERVING_OPTIONS = {
    "instances": "instances",
    "kind": "kind",
    "max_queue_delay_us": "max_queue_delay_us",
    "preferred_batch": "preferred_batch_sizes",
    "no_dynamic_batching": "dynamic_batching",
    "intra_op_threads": "intra_op_threads",
    "no_ragged_batching": "ragged_batching",
}


def _with_max_batch(spec, max_batch: int | None):
    """A spec file's model with --max-batch over its max_batch_size (its validation batches kept within it)."""
    if not max_batch:
        return spec
    sizes = tuple(sorted({min(b, max_batch) for b in spec.validation_batch_sizes}))
    return dataclasses.replace(spec, max_batch_size=max_batch, validation_batch_sizes=sizes)


def _given_serving(ctx, options) -> dict:
    """The serving options typed on the command line (not defaults), as ServingOptions fields: they apply to a
    spec file's models too, over the spec's `serving` table."""
    from click.core import ParameterSource

    typed = [o for o in _SERVING_OPTIONS if ctx.get_parameter_source(o) is ParameterSource.COMMANDLINE]
    return {_SERVING_OPTIONS[o]: getattr(options, _SERVING_OPTIONS[o]) for o in typed}


def _tunings(path: Path, requests, work_dir: Path) -> dict:
    """Per spec, what the traffic of path says to build; written to work_dir/tuning.json and shown."""
    import dataclasses
    import json

    from tpserve.builders.repository.tuning import tune
    from tpserve.common.traffic import traffic_shapes

    shapes, found = traffic_shapes(path), {}
    for request in requests:
        tuning = tune(request.spec, *shapes.for_model(request.spec.name))
        if tuning is None:
            step(f"{request.spec.name}: not in the traffic of {path}; built with its own settings")
            continue
        found[request.spec.name] = tuning
        lengths = f", length buckets {list(tuning.length_buckets)}" if tuning.length_buckets else ""
        step(
            f"{request.spec.name} from {tuning.requests} recorded requests: queue delay {tuning.max_queue_delay_us} "
            f"us, preferred batches {list(tuning.preferred_batch_sizes)}{lengths}; {tuning.figures}"
        )
    work_dir.mkdir(parents=True, exist_ok=True)
    report = {name: dataclasses.asdict(t) for name, t in found.items()}
    (work_dir / "tuning.json").write_text(json.dumps({"source": str(path), "models": report}, indent=1))
    return found


def _tuned(request, tuning):
    import dataclasses

    options = dataclasses.replace(
        request.options,
        max_queue_delay_us=tuning.max_queue_delay_us,
        preferred_batch_sizes=tuning.preferred_batch_sizes,
    )
    return dataclasses.replace(request, options=options)


def _build_one(request, with_pipelines: bool) -> None:
    from tpserve.builders.build import build_model

    entry = build_model(request)
    if with_pipelines:
        _write_pipelines(request.repo, request.spec, request.options)
    accuracy = f", held-out accuracy {entry['accuracy']:.4f}" if entry.get("accuracy") is not None else ""
    click.echo(
        f"built {request.spec.name} ({request.target}, {entry['backend']}) in {entry['build_seconds']} s{accuracy}"
    )


def _check_compiled(precisions: list) -> None:
    from tpserve.builders.repository.writer import TORCH_PRECISIONS
    from tpserve.common.errors import ConfigError

    unknown = [p for p in precisions if p not in TORCH_PRECISIONS]
    if unknown:
        raise ConfigError(f"--compiled {unknown}: unknown precision; choose among {list(TORCH_PRECISIONS)}")


def _check_ragged_with_compiled(requests) -> None:
    """Before any build: compiled engines of sequence models always batch across lengths."""
    from tpserve.builders.repository.writer import ragged_off_problem

    for request in requests:
        problem = ragged_off_problem(request.spec, request.options)
        if problem is not None:
            raise problem


def _build_compiled(request, precision: str, uint8_input: bool, inprocess: bool = False, tuning=None) -> None:
    """A compiled engine of a built model: on the GPU when there is one (KIND_GPU, CUDA graphs), else the CPU."""
    import dataclasses

    import torch

    from tpserve.builders.build import build_torch_variant
    from tpserve.builders.repository.writer import TorchRuntime

    gpu = torch.cuda.is_available()
    options = dataclasses.replace(request.options, kind="KIND_GPU" if gpu else "KIND_CPU")
    runtime = TorchRuntime(
        precision=precision,
        channels_last=gpu,
        cuda_graphs=gpu,
        uint8_input=uint8_input,
        compiler="inductor",
        host_outputs=gpu,
        inprocess=inprocess,
        length_buckets=tuning.length_buckets if tuning else (),
        graph_batch_sizes=tuning.graph_batch_sizes if tuning and gpu else (),
    )
    entry = build_torch_variant(dataclasses.replace(request, options=options), runtime)
    click.echo(f"built {entry['name']} (compiled in {entry['compiled']['compile_seconds']} s, {options.kind})")


def _write_pipelines(repo, spec, options):
    from tpserve.builders.repository import pipelines

    if spec.preprocessing and spec.labels and len(spec.inputs) == 1:
        names = pipelines.write_image_pipelines(repo, spec, options=options)
    elif spec.builder == "sentence_encoder":
        from tpserve.builders.spec.zoo.text import model_dir

        names = pipelines.write_text_pipeline(repo, spec, model_dir() / "tokenizer.json", options)
    elif spec.builder_args.get("tokenizer"):  # a spec file's encoder with its tokenizer.json
        names = pipelines.write_text_pipeline(repo, spec, Path(spec.builder_args["tokenizer"]), options)
    else:
        return
    click.echo(f"pipelines: {', '.join(n for n in names if 'pipeline' in n)}")


@cli.command()
@click.option("--models", default="digits_cnn", show_default=True)
@click.option("--precisions", default="fp16", show_default=True, help="fp32, fp16 and/or int8.")
@options.REPO
@click.option("--work-dir", type=click.Path(path_type=Path), default=Path("work"), show_default=True)
@click.option("--max-batch", type=int, default=None, help="Profile max batch (default: the spec's).")
@click.option("--opt-batch", type=int, default=None, help="Profile opt batch (default: half the max).")
@click.option("--static-batch", type=int, default=None, help="Build a static-shape engine for this batch.")
@click.option("--optimization-level", type=int, default=3, show_default=True)
@click.option("--workspace-mib", type=int, default=4096, show_default=True)
@click.option("--hardware-compatible", is_flag=True, help="Ampere+ hardware-compatible plan.")
@click.option("--version-compatible", is_flag=True, help="Version-compatible plan (lean runtime).")
@click.option("--instances", type=int, default=1, show_default=True)
@click.option("--calibration", type=click.Path(path_type=Path, exists=True), default=None)
@user_errors
def engines(
    models,
    precisions,
    repo,
    work_dir,
    max_batch,
    opt_batch,
    static_batch,
    optimization_level,
    workspace_mib,
    hardware_compatible,
    version_compatible,
    instances,
    calibration,
):
    """Build TensorRT plans of built models (needs TensorRT: the NGC container)."""
    from tpserve.builders.formats.tensorrt_plans import build_plan_variant
    from tpserve.builders.formats.tensorrt_profile import EngineOptions
    from tpserve.builders.repository.writer import ServingOptions
    from tpserve.builders.spec import zoo

    serving = ServingOptions(instances=instances, kind="KIND_GPU")
    for name in _split(models):
        spec = zoo.get_spec(name)
        for precision in _split(precisions):
            options = EngineOptions(
                precision=precision,
                max_batch=max_batch,
                opt_batch=opt_batch,
                static_batch=static_batch,
                optimization_level=optimization_level,
                workspace_mib=workspace_mib,
                hardware_compatible=hardware_compatible,
                version_compatible=version_compatible,
            )
            entry = build_plan_variant(spec, repo, work_dir, options, serving, calibration)
            click.echo(f"built {entry['name']}: {entry['timing']}")


@cli.command()
@options.REPO
@click.option("--image", default=None, help="Check against this server image (needs Docker); default: this host.")
@user_errors
def guard(repo, image):
    """Refuse plans that do not fit the server's TensorRT or the GPU present."""
    from tpserve.builders.checks.guard import check_manifest, image_target, local_target
    from tpserve.builders.repository.manifest import read_manifest

    target = image_target(image) if image else local_target()
    check_manifest(read_manifest(repo), target)
    click.echo(
        f"plans in {repo} fit {target.where} (TensorRT {target.tensorrt}, {target.gpu} {target.compute_capability})"
    )


@cli.command("list")
@click.option("--spec", "spec_file", type=click.Path(path_type=Path), default=None, help="Also list (and validate) it.")
@user_errors
def list_models(spec_file):
    """List the models of the zoo (and of a spec file, validated)."""
    from tpserve.builders.spec import spec_file as spec_files
    from tpserve.builders.spec import zoo

    specs = [zoo.get_spec(name) for name in zoo.available()]
    specs += [user.spec for user in spec_files.load(spec_file)] if spec_file else []
    for spec in specs:
        tensors = lambda ts: [(t.name, t.dtype, list(t.dims)) for t in ts]  # noqa: E731
        click.echo(
            f"{spec.name:16s} inputs={tensors(spec.inputs)} outputs={tensors(spec.outputs)} "
            f"max_batch={spec.max_batch_size}"
        )


if __name__ == "__main__":
    cli()
