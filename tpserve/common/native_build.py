"""The one way the project compiles its C: one flag set, into folders of .tools/ only we can write (0700), again
only when an input changed.

Every library is a shared object built with FLAGS (warnings on; the tests add -Werror through WERROR_VARIABLE).
Beside it a stamp holds the digest of everything that went in (the compiler, the flags, the sources and the
headers of their folders) and the compiler's path: a library whose stamp matches is used as it is, so `make install`
builds each once and a server start only checks, also where no compiler is (the server image keeps none). A failed
build leaves nothing behind (it compiles to a partial file first).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from tpserve.common.cli import step
from tpserve.common.errors import ServerError

FLAGS = ("-O2", "-shared", "-fPIC", "-Wall", "-Wextra")
WERROR_VARIABLE = "TPSERVE_NATIVE_WERROR"  # "1": every warning an error (the tests set it)


def c_compiler() -> str | None:
    """The C compiler ($CC, cc or gcc) as a path, None where there is none ($CC naming no program is None too:
    the one asked for is missing, not replaced)."""
    if os.environ.get("CC"):
        return shutil.which(os.environ["CC"])
    return shutil.which("cc") or shutil.which("gcc")


def flags() -> list[str]:
    """The flag set, with -Werror where WERROR_VARIABLE asks for it."""
    return [*FLAGS, *(["-Werror"] if os.environ.get(WERROR_VARIABLE) == "1" else [])]


def _digest(compiler: str, command: Sequence[str], sources: Sequence[Path]) -> str:
    """What a build depends on: the compiler, its arguments, every source and the headers beside them."""
    digest = hashlib.sha256(compiler.encode() + b"\0" + "\0".join(command).encode())
    headers = sorted({h for s in sources for h in Path(s).parent.glob("*.h")})
    for path in (*sources, *headers):
        digest.update(str(path).encode() + b"\0" + Path(path).read_bytes())
    return digest.hexdigest()


def build_library(
    sources: Sequence[Path],
    target: Path,
    what: str,
    instead: str,
    arguments: Sequence[str] = (),
    force: bool = False,
) -> Path:
    """Compile sources into the shared library target (its folder made 0700), unless the library there was built
    from exactly these inputs. arguments: includes, defines and libraries after the sources. instead: what the
    user can do without it (said when there is no compiler).

    Raises:
        ServerError: no C compiler, or the compile failed (the compiler's last words in the message).
    """
    target = Path(target)
    stamp = target.with_name(target.name + ".inputs")
    partial = target.with_name(f".{target.name}.partial")
    command = [*flags(), "-o", str(partial), *map(str, sources), *arguments]
    recorded = stamp.read_text().splitlines() if stamp.exists() else []
    # the stamp: the inputs' digest, then the compiler that built them (a host without one, the server image, takes
    # a library built from exactly these sources by the compiler the stamp names)
    found = c_compiler()
    compiler = found or (recorded[1] if len(recorded) == 2 and not force else None)
    if compiler is None:
        raise ServerError(
            f"no C compiler ($CC, cc or gcc) to build {what}: install gcc (Debian: apt-get install gcc) and "
            f"run `make install` again, {instead}"
        )
    wanted = _digest(compiler, [c for c in command if c != "-Werror"], sources)  # the same library either way
    if not force and target.exists() and recorded[:1] == [wanted]:
        return target
    if found is None:
        raise ServerError(
            f"{what} must be built again (its sources changed) and there is no C compiler here: install gcc "
            f"(Debian: apt-get install gcc), {instead}"
        )
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(target.parent, 0o700)  # code we load comes from a folder only we can write
    step(f"{what}: compiling {', '.join(Path(s).name for s in sources)} into {target}")
    done = subprocess.run([compiler, *command], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise ServerError(f"compiling {what} failed ({compiler} {' '.join(flags())}):\n{done.stderr.strip()[-2000:]}")
    partial.chmod(0o700)
    partial.replace(target)
    stamp.write_text(f"{wanted}\n{compiler}\n")
    return target
