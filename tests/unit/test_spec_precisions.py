"""`make build-engines SPEC=models.toml PRECISIONS="fp32 int8"` (the README's line) quantizes the spec's models
too: precisions typed on the command line are added to each spec model's own; left out, the spec's alone."""

from click.testing import CliRunner

SPEC = """
[[model]]
name = "acme_scorer"
factory = "common.scorer:build"
python_path = ["src"]
max_batch_size = 8
inputs  = [ { name = "features", dtype = "FP32", dims = [10] } ]
outputs = [ { name = "scores", dtype = "FP32", dims = [3] } ]
"""


def _precisions(tmp_path, monkeypatch, *args) -> list[tuple]:
    from tpserve.builders import __main__ as builders

    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "models.toml").write_text(SPEC)
    seen = []
    monkeypatch.setattr(builders, "_build_one", lambda request, pipelines: seen.append(request.precisions))
    command = ["build", "--spec", str(tmp_path / "models.toml"), "--target", "embedded", "--repo", str(tmp_path / "r")]
    result = CliRunner().invoke(builders.cli, [*command, *args])
    assert seen, result.output
    return seen


def test_precisions_typed_on_the_command_line_reach_the_spec_models(tmp_path, monkeypatch):
    assert _precisions(tmp_path, monkeypatch, "--precisions", "fp32 int8") == [("fp32", "int8")]
    assert _precisions(tmp_path, monkeypatch) == [("fp32",)]
