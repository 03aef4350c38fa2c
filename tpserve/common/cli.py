"""Helpers shared by the project's click CLIs."""

import functools
import sys

import click

from tpserve.common.errors import ToolError


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


def private_files() -> None:
    """umask 077 for this process and what it starts: state, logs, sockets and reports readable by the owner
    only (the server's, the measuring tools'; a built repository keeps the default so a server can read it)."""
    import os

    os.umask(0o077)


def clean_exit_on_sigterm() -> None:
    """A SIGTERM ends this command the way an error does, by SystemExit(143) in the main thread: every with-block
    stops what it started (servers, their supervisors, load generators) before the process exits, where the
    default action would leave them running. A second SIGTERM during that cleanup is ignored (SIGKILL is not)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def leave(signum, _frame) -> None:
        signal.signal(signal.SIGTERM, lambda *_: None)  # not SIG_IGN: what the cleanup starts must stay stoppable
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)


def words(text: str) -> tuple[str, ...]:
    """A list option's words: 'a b,c' -> ('a', 'b', 'c')."""
    return tuple(text.replace(",", " ").split())


def numbers(text: str, kind=int) -> tuple:
    """A list option's numbers: '1 4,16' -> (1, 4, 16)."""
    return tuple(kind(v) for v in words(text))


def step(message: str) -> None:
    """Print one progress line for a build or run step."""
    click.secho(f"==> {message}", fg="cyan", err=True)
