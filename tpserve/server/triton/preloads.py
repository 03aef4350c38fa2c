"""The admin key reaches tritonserver without appearing in its argv or environment.

Triton 2.51 reads restricted-API keys only from its command line, which every local user can read
in /proc/<pid>/cmdline. The command line therefore carries PLACEHOLDER; the key travels through a
pipe whose read end the server inherits, and server/triton/triton_shim.c (LD_PRELOAD, built into
.tools/triton_shim/ by `make install`; it also keeps shared memory private) fills it in before
tritonserver's main() runs. The launcher then proves the substitution: the real key must open the
admin API and the placeholder must not.
"""

from __future__ import annotations

import os
from pathlib import Path

from tpserve.common import native_build
from tpserve.common.errors import ServerError
from tpserve.paths import TOOLS

PLACEHOLDER = "@TRITON_ADMIN_KEY@"
FD_VARIABLE = "TRITON_SECRET_FD"
SOURCE = Path(__file__).with_name("triton_shim.c")
FRONT = Path(__file__).with_name("front")  # the guard and the front in tritonserver's reads (front/wrappers.c)
FRONT_SOURCES = tuple(sorted(FRONT.glob("*.c")))
SOURCES = (SOURCE, *FRONT_SOURCES)
TOOLS_DIR = TOOLS / "triton_shim"
LIBRARY = TOOLS_DIR / "libtriton_shim.so"


REFUSAL = """# Started by triton_shim in place of a model file it refused: the load fails at once with why.
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("{why}")
"""
REFUSALS = {
    "outside": "refused by the server's shim: the config names a model file outside the model's version folder, "
    "or one whose path holds characters other than letters, digits and _ . / : = + -",
    "missing": "the model file the config names does not exist in the model's version folder",
}


def write_refusal_models(folder: Path) -> None:
    """folder/refused/<reason>/0/model.py: the models the shim starts instead of a refused or missing file
    (tritonserver 2.51 waits forever for a stub that cannot start, so the shim never lets that happen)."""
    for reason, why in REFUSALS.items():
        target = folder / "refused" / reason / "0"
        text, path = REFUSAL.format(why=why), target / "model.py"
        if path.is_file() and path.read_text() == text:
            continue  # as built (an image's read-only copy included)
        target.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.write_text(text)


def build_library(force: bool = False) -> Path:
    """Compile triton_shim.c and the front (front/*.c: the guard's wrappers, the HTTP/1.1 and HTTP/2 reading) into
    .tools/triton_shim/ (tpserve/common/native_build.py: again
    only when an input changed).

    Raises:
        ServerError: no C compiler, or the compile failed.
    """
    built = native_build.build_library(
        SOURCES, LIBRARY, "the admin-key shim", "or serve without it", ["-ldl", "-lpthread", "-lm"], force
    )
    write_refusal_models(TOOLS_DIR)
    return built


def library() -> Path:
    """The built shim ($TRITON_SHIM overrides), building it when a compiler is at hand.

    Raises:
        ServerError: not built and cannot be; the message says how to fix it.
    """
    given = os.environ.get("TRITON_SHIM")
    if given:
        if not Path(given).is_file():
            raise ServerError(f"TRITON_SHIM={given} is not a file; unset it or point it at libtriton_shim.so")
        return Path(given)
    return build_library()


def pass_secret(env: dict, secret: str) -> tuple[dict, int]:
    """An environment that loads the shim, and the read end of a pipe holding the secret.

    The caller passes the descriptor to the child (`pass_fds`) and closes it after the start.
    """
    preload = " ".join(p for p in (str(library()), env.get("LD_PRELOAD", "")) if p)
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as pipe:
        pipe.write(secret)
    return {**env, "LD_PRELOAD": preload, FD_VARIABLE: str(read_end)}, read_end
