"""Command-line options the CLIs share, defined once: the state folder, the ports, where any Triton is and what
to send it."""

from pathlib import Path

import click

from tpserve.common import endpoints

STATE_DIR = click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=endpoints.STATE_DIR,
    show_default=True,
    help="Holds the pid, ports, log and admin key of the server.",
)
REPO = click.option("--repo", type=click.Path(path_type=Path), default=Path("model_repository"), show_default=True)


def ports(http: str = "", grpc: str = "", metrics: str = ""):
    """--http-port, --grpc-port and --metrics-port with Triton's defaults; the texts say what listens there."""

    def apply(command):
        listeners = (("http", endpoints.HTTP_PORT, http), ("grpc", endpoints.GRPC_PORT, grpc))
        for name, default, text in reversed((*listeners, ("metrics", endpoints.METRICS_PORT, metrics))):
            option = click.option(f"--{name}-port", type=int, default=default, show_default=True, help=text or None)
            command = option(command)
        return command

    return apply


URL = click.option("--url", default=None, help="HOST:PORT of any Triton (default: the server of STATE_DIR).")
HEADER = click.option("--header", "headers", multiple=True, help="'Name: value' sent with every request (repeatable).")
ADMIN_KEY_FILE = click.option(
    "--admin-key-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A Triton's key for its restricted APIs (statistics, model control), read from this file: the key, or "
    "'Header-Name: key' (default header: admin-key). Never in argv; --url's server (STATE_DIR's has its own).",
)
SHAPE = click.option("--shape", "shapes", multiple=True, help="NAME:d1,d2: lengths of an input's dynamic dims.")
INPUT_DATA = click.option(
    "--input-data",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="Your data: perf_analyzer's input-data JSON, an .npz (one array per input), a folder of images.",
)
LENGTHS = click.option(
    "--lengths",
    default="lognormal",
    show_default=True,
    help="Token and text models: sentence lengths, 'lognormal[:MEDIAN]' (seeded, median 40) or 'fixed:N'.",
)
TLS = click.option("--tls", is_flag=True, help="HTTPS / gRPC over TLS (--ca-file: the roots that sign the server).")
CA_FILE = click.option(
    "--ca-file", type=click.Path(exists=True, dir_okay=False), default=None, help="PEM root certificates."
)
