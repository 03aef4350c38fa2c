"""The README's "Call it from your own code" snippets, as written, against a real tritonserver (its port put in
place of 8000): the Python one prints a digit, the curl one returns the model's logits."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.functional
README = (Path(__file__).parents[2] / "README.md").read_text()
SECTION = README.split("Call it from your own code", 1)[1].split("Your own traffic", 1)[0]


def _block(language: str) -> str:
    return re.search(rf"```{language}\n(.*?)```", SECTION, re.S).group(1)


def test_the_python_snippet_prints_a_digit(served):
    code = _block("python").replace("localhost:8000", served.state.http_url)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"\[\d\]\n", done.stdout)


@pytest.mark.skipif(shutil.which("curl") is None or shutil.which("bash") is None, reason="no curl or bash here")
def test_the_curl_snippet_returns_the_logits(served):
    import json

    script = _block("bash").replace("localhost:8000", served.state.http_url)
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    (output,) = json.loads(done.stdout)["outputs"]
    assert output["name"] == "logits" and output["shape"] == [1, 10] and len(output["data"]) == 10
