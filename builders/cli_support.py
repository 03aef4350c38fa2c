"""Helpers shared by the project's click CLIs."""

import functools
import sys

import click

from builders.errors import ToolError


def user_errors(func):
    """Turn a ToolError into a one-line message and a non-zero exit, without a traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except ToolError as err:
            click.secho(f"error: {err}", fg="red", err=True)
            sys.exit(err.exit_code)

    return wrapper


def step(message: str) -> None:
    """Print one progress line for a build or run step."""
    click.secho(f"==> {message}", fg="cyan", err=True)
