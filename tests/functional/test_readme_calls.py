"""The "Call it from your own code" snippets of the README and of docs/quickstart.md, as written, against a real
tritonserver (its port put in place of 8000): the Python one prints a digit, the curl one returns the logits."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional
ROOT = Path(__file__).parents[2]
PAGES = ("README.md", "docs/quickstart.md")


def _block(page: str, language: str) -> str:
    section = (ROOT / page).read_text().split("Call it from your own code", 1)[1].split("\n## ", 1)[0]
    return re.search(rf"```{language}\n(.*?)```", section, re.S).group(1)


def test_both_pages_show_the_same_snippets():
    for language in ("python", "bash"):
        assert _block(PAGES[0], language) == _block(PAGES[1], language)


@pytest.mark.parametrize("page", PAGES)
def test_the_python_snippet_prints_a_digit(served, page):
    code = _block(page, "python").replace("localhost:8000", served.state.http_url)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"\[\d\]\n", done.stdout)


@pytest.mark.skipif(shutil.which("curl") is None or shutil.which("bash") is None, reason="no curl or bash here")
@pytest.mark.parametrize("page", PAGES)
def test_the_curl_snippet_returns_the_logits(served, page):
    import json

    script = _block(page, "bash").replace("localhost:8000", served.state.http_url)
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (output,) = json.loads(done.stdout)["outputs"]
    assert output["name"] == "logits" and output["shape"] == [1, 10] and len(output["data"]) == 10
