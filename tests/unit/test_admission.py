"""Admission by queue time, without a server: the budgets a user gives, the controller's reading of tritonserver's
counters and what it marks in the edge's table, the table's layout and hash as the edge's C reads them."""

import subprocess

import pytest

from tpserve.common.errors import ServerError
from tpserve.common.native_build import c_compiler
from tpserve.server.edge import admission_table
from tpserve.server.supervision.admission_control import HOLD_S, Controller, QueueBudgets, counters


def test_budgets_are_one_for_every_model_or_per_model():
    assert QueueBudgets.parse("20").of("any") == 20.0
    budgets = QueueBudgets.parse("resnet50=5 *=50")
    assert (budgets.of("resnet50"), budgets.of("other")) == (5.0, 50.0) and budgets.enabled
    assert QueueBudgets.parse(budgets.to_arg()) == budgets
    assert not QueueBudgets.parse("").enabled and QueueBudgets.parse("m=3").of("other") == 0.0
    for bad in ("0", "-1", "m=x", "fast"):
        with pytest.raises(ServerError, match="not a budget"):
            QueueBudgets.parse(bad)


def _text(queue_us: float, success: float, pending: float = 0.0, model: str = "m") -> str:
    return "\n".join(
        [
            "# HELP nv_inference_queue_duration_us ...",
            f'nv_inference_queue_duration_us{{model="{model}",version="1"}} {queue_us}',
            f'nv_inference_request_success{{model="{model}",version="1"}} {success}',
            f'nv_inference_pending_request_count{{model="{model}",version="1"}} {pending}',
            'nv_inference_request_success{model="other",version="1"} 7',
        ]
    )


def test_counters_are_summed_per_model_over_versions():
    text = _text(100, 4) + '\nnv_inference_request_success{model="m",version="2"} 6'
    assert counters(text)["m"]["nv_inference_request_success"] == 10
    assert "nv_inference_request_success" in counters(text)["other"]
    quoted = 'nv_inference_request_success{model="a\\"b",version="1"} 3'  # a label value as Prometheus escapes it
    assert counters(quoted) == {'a"b': {"nv_inference_request_success": 3.0}}


def test_the_controller_marks_a_model_over_its_budget_and_lifts_the_mark_when_it_is_not(tmp_path):
    region = admission_table.Region(admission_table.make_table(tmp_path), 0)
    controller = Controller(QueueBudgets.parse("m=10"), region)
    controller.step(_text(0, 0), now_ns=1_000)
    controller.step(_text(50_000 * 100, 100), now_ns=2_000)  # 100 requests waited 50 ms each: over 10 ms
    assert controller.models["m"].queue_ms == 50.0 and controller.models["m"].over
    assert _until(tmp_path, "m") == 2_000 + int(HOLD_S * 1e9)
    assert "other" not in controller.models, "a model without a budget is never marked"
    controller.step(_text(50_000 * 100 + 2_000 * 10, 110), now_ns=3_000)  # 10 more at 2 ms: under
    assert not controller.models["m"].over and _until(tmp_path, "m") == 0
    controller.step(_text(50_000 * 100 + 2_000 * 10, 110, pending=5), now_ns=4_000, elapsed_s=0.25)
    controller.step(_text(50_000 * 100 + 2_000 * 10, 110, pending=5), now_ns=5_000, elapsed_s=0.25)
    assert controller.models["m"].queue_ms == 500.0 and controller.models["m"].over, "waiting, none finishing"
    text = controller.prometheus()
    assert 'tpserve_admission_refusing{model="m"} 1' in text and 'tpserve_queue_budget_ms{model="m"} 10' in text


def _until(folder, model: str) -> int:
    data = (folder / admission_table.FILE).read_bytes()
    wanted = admission_table.name_hash(model)
    for at in range(0, admission_table.MODELS * admission_table.ENTRY, admission_table.ENTRY):
        if int.from_bytes(data[at : at + 8], "little") == wanted:
            return int.from_bytes(data[at + 8 : at + 16], "little")
    raise AssertionError(f"{model} has no entry")


def test_each_replica_marks_its_own_region_and_the_refusals_are_read_back(tmp_path):
    path = admission_table.make_table(tmp_path)
    assert path.stat().st_mode & 0o777 == 0o600 and path.stat().st_size == admission_table.SIZE
    first, second = admission_table.Region(path, 0), admission_table.Region(path, 1)
    first.mark("m", 5, 1.0)
    second.mark("m", 9, 1.0)
    data = path.read_bytes()
    base = admission_table.MODELS * admission_table.ENTRY
    assert int.from_bytes(data[8:16], "little") == 5 and int.from_bytes(data[base + 8 : base + 16], "little") == 9
    assert first.refused("m") == 0 and first.refused("never seen") == 0
    with pytest.raises(ValueError):
        admission_table.Region(path, admission_table.REGIONS)


def test_the_edge_hashes_a_name_as_the_table_does(tmp_path):
    compiler = c_compiler()
    if compiler is None:
        pytest.skip("no C compiler: the edge's module is built where it serves")
    source = tmp_path / "hash.c"
    source.write_text(
        '#include <stdio.h>\n#include "admission_parse.h"\n'
        'int main(int c, char **v) { printf("%llu", (unsigned long long)admission_hash(v[1], strlen(v[1]))); }\n'
    )
    headers = admission_table.Path(admission_table.__file__).parent
    subprocess.run([compiler, f"-I{headers}", "-o", str(tmp_path / "hash"), str(source)], check=True)
    for name in ("digits_cnn", "résumé", "a"):
        done = subprocess.run([str(tmp_path / "hash"), name], capture_output=True, text=True, check=True)
        assert int(done.stdout) == admission_table.name_hash(name)
