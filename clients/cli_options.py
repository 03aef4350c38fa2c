"""Command-line options shared by the client and measurement CLIs: where any Triton is and what to send it."""

from pathlib import Path

import click

URL = click.option("--url", default=None, help="HOST:PORT of any Triton (default: the server of STATE_DIR).")
HEADER = click.option("--header", "headers", multiple=True, help="'Name: value' sent with every request (repeatable).")
SHAPE = click.option("--shape", "shapes", multiple=True, help="NAME:d1,d2: lengths of an input's dynamic dims.")
INPUT_DATA = click.option(
    "--input-data",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="Your data: perf_analyzer's input-data JSON, an .npz (one array per input), a folder of images.",
)
TLS = click.option("--tls", is_flag=True, help="HTTPS / gRPC over TLS (--ca-file: the roots that sign the server).")
CA_FILE = click.option(
    "--ca-file", type=click.Path(exists=True, dir_okay=False), default=None, help="PEM root certificates."
)
