"""Every struct Python hands to the native paths has the layout C gives it: the ctypes mirrors in native_path.py
and native_tokenize.py against specs.h and bert_tokenize.h, compiled here: each struct's size and every field's
offset and size agree (a field added on one side only, a bound changed in one place, fails)."""

import ctypes
import subprocess
from pathlib import Path

import pytest

from tpserve.common.native_build import c_compiler
from tpserve.triton_models import NATIVE
from tpserve.triton_models.inprocess import native_path, native_tokenize

MIRRORS = {  # C type -> its ctypes mirror
    "ipn_spec": native_path.Spec,
    "ipr_grid": native_path.Grid,
    "ipr_spec": native_path.RaggedSpec,
    "ipt_spec": native_tokenize.TokenizeSpec,
}


def _c_layout(tmp_path: Path) -> dict[str, list[int]]:
    """Per C type: its size, then each mirrored field's offset and size, as the compiler lays them out."""
    compiler = c_compiler()
    if compiler is None:
        pytest.skip("no C compiler (cc/gcc)")
    lines = []
    for c_type, mirror in MIRRORS.items():
        fields = [name for name, *_ in mirror._fields_]
        parts = [f"sizeof({c_type})"]
        for f in fields:
            parts += [f"offsetof({c_type}, {f})", f"sizeof((({c_type} *)0)->{f})"]
        values = ", ".join(f"(unsigned long)({p})" for p in parts)
        count = 1 + 2 * len(fields)
        lines.append(
            f'  {{ unsigned long v[] = {{{values}}}; printf("{c_type}"); '
            f'for (int i = 0; i < {count}; i++) printf(" %lu", v[i]); printf("\\n"); }}'
        )
    source = tmp_path / "layout.c"
    source.write_text(
        '#include <stddef.h>\n#include <stdio.h>\n#include "specs.h"\n#include "bert_tokenize.h"\n'
        "int main(void) {\n" + "\n".join(lines) + "\n  return 0;\n}\n"
    )
    binary = tmp_path / "layout"
    flags = ["-Wall", "-Wextra", "-Werror", f"-I{NATIVE}"]
    subprocess.run([compiler, *flags, "-o", str(binary), str(source)], check=True, capture_output=True)
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    return {line.split()[0]: [int(v) for v in line.split()[1:]] for line in out.splitlines()}


def _ctypes_layout(mirror) -> list[int]:
    found = [ctypes.sizeof(mirror)]
    for name, kind, *_ in mirror._fields_:
        found += [getattr(mirror, name).offset, ctypes.sizeof(kind)]
    return found


def test_every_struct_handed_to_c_has_the_layout_c_gives_it(tmp_path):
    c_side = _c_layout(tmp_path)
    for c_type, mirror in MIRRORS.items():
        assert _ctypes_layout(mirror) == c_side[c_type], f"{c_type} and {mirror.__name__} disagree"
