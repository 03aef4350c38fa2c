"""Invalid specs and configs, one folder per case with the expected error substring."""

import json
from pathlib import Path

import pytest

from tpserve.builders.repository import model_config
from tpserve.builders.spec.model_spec import ModelSpec
from tpserve.common.errors import ConfigError, SpecError

CASES = sorted((Path(__file__).parents[1] / "fixtures" / "invalid").iterdir())


def _load(case: Path):
    data = json.loads((case / "input.json").read_text())
    expected = (case / "expected_error.txt").read_text().strip()
    return data["kind"], data["data"], expected


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_invalid_case_is_refused_with_its_message(case):
    kind, data, expected = _load(case)
    build = {"spec": ModelSpec.from_dict, "config": model_config.from_dict, "pbtxt": model_config.parse_pbtxt}[kind]
    with pytest.raises((SpecError, ConfigError)) as info:
        build(data)
    assert expected in str(info.value)


def test_there_are_cases_of_every_kind():
    kinds = {_load(c)[0] for c in CASES}
    assert kinds == {"spec", "config", "pbtxt"}
