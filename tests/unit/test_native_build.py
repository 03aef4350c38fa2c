"""The one native build (tpserve/common/native_build.py): one flag set with every warning on, each C unit of the
product clean under -Werror, and a library compiled again only when one of its inputs changed."""

import subprocess
from pathlib import Path

import pytest

from tpserve.common import native_build
from tpserve.common.errors import ServerError

ROOT = Path(__file__).parents[2]
UNITS = sorted((ROOT / "tpserve").rglob("*.c"))


def test_every_c_unit_of_the_product_compiles_without_a_warning():
    import sysconfig

    compiler = native_build.c_compiler()
    if compiler is None:
        pytest.skip("no C compiler (cc/gcc)")
    assert {"-Wall", "-Wextra"} <= set(native_build.FLAGS) and len(UNITS) >= 12
    include = sysconfig.get_config_var("INCLUDEPY")
    for unit in UNITS:
        command = [compiler, "-fsyntax-only", *native_build.FLAGS, "-Werror", f"-I{include}", f"-I{unit.parent}"]
        done = subprocess.run(
            [*command, '-DPYTHON_EXECUTABLE="p"', '-DPYTHON_LIBRARY="l"', str(unit)], text=True, capture_output=True
        )
        assert done.returncode == 0, f"{unit.relative_to(ROOT)}:\n{done.stderr[-2000:]}"


def test_a_library_is_compiled_again_only_when_an_input_changed(tmp_path, monkeypatch):
    if native_build.c_compiler() is None:
        pytest.skip("no C compiler (cc/gcc)")
    source, header = tmp_path / "src" / "one.c", tmp_path / "src" / "one.h"
    source.parent.mkdir()
    header.write_text("#define ANSWER 41\n")
    source.write_text('#include "one.h"\nint answer(void) { return ANSWER; }\n')
    target = tmp_path / "tools" / "libone.so"
    said = []
    monkeypatch.setattr(native_build, "step", said.append)
    args = ([source], target, "a test library", "or not")
    built = native_build.build_library(*args, [f"-I{source.parent}"])
    assert built == target and (target.parent.stat().st_mode & 0o777) == 0o700 and len(said) == 1
    native_build.build_library(*args, [f"-I{source.parent}"])
    assert len(said) == 1, "nothing changed: not compiled again"
    header.write_text("#define ANSWER 42\n")
    native_build.build_library(*args, [f"-I{source.parent}"])
    assert len(said) == 2, "a header beside the source changed: compiled again"
    source.write_text("int answer(void) { return missing; }\n")
    with pytest.raises(ServerError, match="compiling a test library failed"):
        native_build.build_library(*args)
    assert target.exists() and not list(target.parent.glob(".*.partial")), "a failed build leaves the last one alone"


def test_a_host_without_a_compiler_takes_a_library_built_from_exactly_these_sources(tmp_path, monkeypatch):
    """The server image keeps no compiler: the library built in its build stage, from these sources by the compiler
    its stamp names, is taken as it is; a changed source says it must be built again, and how."""
    if native_build.c_compiler() is None:
        pytest.skip("no C compiler (cc/gcc)")
    source = tmp_path / "one.c"
    source.write_text("int answer(void) { return 42; }\n")
    target = tmp_path / "tools" / "libone.so"
    args = ([source], target, "a test library", "or build it elsewhere")
    native_build.build_library(*args)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))  # $CC naming no program: no compiler here
    monkeypatch.setattr(native_build, "step", lambda said: pytest.fail(f"compiled again: {said}"))
    assert native_build.c_compiler() is None and native_build.build_library(*args) == target
    source.write_text("int answer(void) { return 43; }\n")
    with pytest.raises(ServerError, match="must be built again .* no C compiler here: install gcc"):
        native_build.build_library(*args)
