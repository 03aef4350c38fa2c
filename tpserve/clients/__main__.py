"""Client commands: `python -m tpserve.clients health|models|infer`."""

from pathlib import Path

import click

from tpserve.common import options
from tpserve.common.cli import private_files, user_errors
from tpserve.common.errors import ClientError

_PROTOCOL = click.option("--protocol", type=click.Choice(["http", "grpc"]), default="http", show_default=True)
_URL = options.URL
_TLS, _CA, _HEADER, _SHAPE, _DATA = options.TLS, options.CA_FILE, options.HEADER, options.SHAPE, options.INPUT_DATA


@click.group()
def cli():
    """Talk to a running Triton server over HTTP or gRPC."""
    private_files()


def _endpoint(protocol, url, state_dir, headers=(), tls=False, ca_file=None):
    from tpserve.clients.connection import endpoint, parse_headers

    return endpoint(protocol, url, state_dir, parse_headers(headers), tls, ca_file)


@cli.command()
@_PROTOCOL
@_URL
@_TLS
@_CA
@options.STATE_DIR
@user_errors
def health(protocol, url, tls, ca_file, state_dir):
    """Server liveness, readiness and version."""
    ep = _endpoint(protocol, url, state_dir, (), tls, ca_file)
    with ep.client() as client:
        live, ready = _probe(client.is_server_live), _probe(client.is_server_ready)
        version = _probe(lambda: _field(client.get_server_metadata(), "version")) if live else None
    click.echo(f"{ep.url} ({protocol}): live={live} ready={ready} version={version}")
    if not live:
        raise SystemExit(1)


def _probe(call):
    try:
        return call()
    except Exception:  # connection refused: report as not live
        return False


def _field(meta, name):
    return meta[name] if isinstance(meta, dict) else getattr(meta, name)


@cli.command()
@_PROTOCOL
@_URL
@options.STATE_DIR
@user_errors
def models(protocol, url, state_dir):
    """Models of the repository with their state (needs the admin key of `make serve`)."""
    from tpserve.clients.admin import repository_index

    ep = _endpoint(protocol, url, state_dir)
    with ep.client() as client:
        for entry in repository_index(ep, client):
            reason = f"  ({entry['reason']})" if entry.get("reason") else ""
            click.echo(f"{entry['name']:24s} v{entry.get('version', '-'):3s} {entry.get('state', 'UNKNOWN')}{reason}")


@cli.command()
@click.argument("model")
@_PROTOCOL
@_URL
@options.STATE_DIR
@user_errors
def stats(model, protocol, url, state_dir):
    """Per-step latency breakdown of MODEL (or of each step of an ensemble), from Triton's statistics."""
    from tpserve.clients.breakdown import breakdown, markdown

    click.echo(markdown(breakdown(_endpoint(protocol, url, state_dir), model)))


@cli.command()
@click.argument("model", required=False)
@click.option(
    "--input",
    "source",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="A .npy array or an image file (single-input models), an .npz with one array per input; "
    "default: random data shaped by the model's spec.",
)
@click.option("--batch", type=int, default=1, show_default=True, help="Batch size of random input.")
@click.option("--top-k", type=int, default=0, help="Return the k best classes (classifiers).")
@click.option("--repeat", type=int, default=1, show_default=True, help="Send the request N times; report latency.")
@click.option("--repo", type=click.Path(path_type=Path), default=None, help="Repository (for image preprocessing).")
@_SHAPE
@_DATA
@_PROTOCOL
@_URL
@_HEADER
@_TLS
@_CA
@options.STATE_DIR
@user_errors
def infer(
    model, source, batch, top_k, repeat, repo, shapes, input_data, protocol, url, headers, tls, ca_file, state_dir
):
    """Run MODEL (default: the first model of the server's manifest) on random data, a .npy/.npz array or an
    image; print outputs, top-k and latency."""
    from tpserve.clients.infer import infer as run
    from tpserve.clients.model_plan import parse_shapes, plan
    from tpserve.clients.served import served_models

    ep = _endpoint(protocol, url, state_dir, headers, tls, ca_file)
    if model is None:
        model = served_models(ep)[0]
        click.echo(f"model: {model} (the first model the server has ready)")
    with ep.client() as client:
        arrays = _arrays(ep, client, model, source, batch, repo, parse_shapes(shapes), input_data)
        described = plan(client, model, ep.headers)
        if described.decoupled:
            return _print_stream(ep, model, arrays, repeat, client)
        if described.sequence:  # one sequence of `repeat` requests (at least 2), under one correlation id
            return _print_sequence(ep, model, arrays, max(repeat, 2), client)
        results = [run(ep, model, arrays, top_k, client) for _ in range(max(repeat, 1))]
    _print_result(results, model, protocol)


def _print_stream(ep, model, arrays, repeat, client):
    from tpserve.clients.streaming import stream_infer

    for _ in range(max(repeat, 1)):
        result = stream_infer(ep, model, arrays, client=client)
        click.echo(
            f"{model} (decoupled, gRPC stream): {result.responses} response(s), first after "
            f"{result.first_ms:.2f} ms, last after {result.last_ms:.2f} ms"
        )
    for name, array in result.outputs.items():
        click.echo(f"{name} (last response): shape {list(array.shape)} dtype {array.dtype}")


def _print_sequence(ep, model, arrays, length, client):
    from tpserve.clients.infer import infer as run
    from tpserve.clients.streaming import sequence_ids

    corrid = sequence_ids()
    results = [run(ep, model, arrays, client=client, sequence=(corrid, i == 0, i == length - 1)) for i in range(length)]
    click.echo(f"{model} (sequence batching): one sequence of {length} requests, correlation id {corrid}")
    _print_result(results, model, ep.protocol)


def _arrays(ep, client, model, source, batch, repo, shapes, input_data):
    from tpserve.clients import inputs as make
    from tpserve.clients.infer import model_inputs
    from tpserve.clients.model_plan import plan
    from tpserve.clients.served import served_spec

    if source is None:
        model_plan = plan(client, model, ep.headers)
        if input_data is not None:
            return make.data_inputs(input_data, model_plan)
        return make.plan_inputs(model_plan, batch, shapes, served_spec(Path(repo) if repo else ep.repo, model))
    meta = model_inputs(client, model)
    if source.suffix == ".npz":
        return _npz_arrays(source, meta, model)
    if len(meta) != 1:
        raise ClientError(f"{model} has {len(meta)} inputs; give --input an .npz with one array per input")
    array = make.load_npy(source) if source.suffix == ".npy" else make.load_image(source, _spec(ep, model, repo))
    return {meta[0]["name"]: array}


def _npz_arrays(source, meta, model):
    import numpy as np

    try:
        with np.load(source, allow_pickle=False) as archive:
            arrays = {k: archive[k] for k in archive.files}
    except (OSError, ValueError) as err:
        raise ClientError(f"could not read {source} as an .npz archive: {err}") from err
    missing = [m["name"] for m in meta if m["name"] not in arrays]
    if missing:
        raise ClientError(f"{source} lacks arrays for inputs {missing} of {model}; it has {sorted(arrays)}")
    return {m["name"]: arrays[m["name"]] for m in meta}


def _spec(ep, model, repo):
    from tpserve.builders.repository.manifest import read_manifest
    from tpserve.builders.spec.model_spec import ModelSpec

    repo = repo or ep.repo
    entry = read_manifest(Path(repo)).get("models", {}).get(model) if repo else None
    if entry is None:
        raise ClientError(f"no spec for {model!r} in the manifest of {repo}; pass --repo or send a .npy")
    return ModelSpec.from_dict(entry["spec"])


def _print_result(results, model, protocol):
    import numpy as np

    last = results[-1]
    for name, array in last.outputs.items():
        click.echo(f"{name}: shape {list(array.shape)} dtype {array.dtype}")
    for i, ranked in enumerate(last.top_k or []):
        best = ", ".join(f"{label or idx} ({score:.3f})" for score, idx, label in ranked)
        click.echo(f"sample {i}: {best}")
    latencies = np.array([r.latency_ms for r in results])
    click.echo(
        f"{model} over {protocol}: {len(latencies)} request(s), latency p50 {np.percentile(latencies, 50):.2f} ms"
        f", max {latencies.max():.2f} ms"
    )


if __name__ == "__main__":
    cli()
