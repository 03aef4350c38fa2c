"""Text workloads (loadtest/workloads/text.py): seeded lengths, token rows, perf_analyzer data; the load
client's request serialization (loadtest/workloads/ragged_load.py)."""

import json

import numpy as np
import pytest

from tpserve.common.errors import MeasurementError
from tpserve.loadtest.workloads import ragged_load
from tpserve.loadtest.workloads import text as tw


def test_lognormal_lengths_are_seeded_and_shaped_like_sentences():
    lengths = tw.Lengths().sample(20000)
    assert np.array_equal(lengths, tw.Lengths().sample(20000))
    assert not np.array_equal(lengths, tw.Lengths(seed=1).sample(20000))
    summary = tw.summary(lengths)
    assert 38 <= summary["median"] <= 42 and 50 <= summary["mean"] <= 58 and 130 <= summary["p95"] <= 165
    assert lengths.min() >= 3 and summary["max"] == 256


def test_fixed_lengths_and_parsing():
    assert set(tw.Lengths.parse("fixed:32").sample(10).tolist()) == {32}
    assert tw.Lengths.parse("lognormal:20", longest=128).median == 20
    assert "all 32 tokens" == tw.Lengths(fixed=32).describe()
    assert "lognormal, median 40" in tw.Lengths().describe()
    for bad in ("uniform", "fixed:x", "fixed:999"):
        with pytest.raises(MeasurementError):
            tw.Lengths.parse(bad)


def test_token_rows_mark_real_tokens_with_cls_and_sep():
    ids, mask = tw.token_rows(np.array([3, 7, 5]))
    assert ids.shape == mask.shape == (3, 7) and ids.dtype == mask.dtype == np.int64
    assert mask.sum(axis=1).tolist() == [3, 7, 5]
    assert (ids[:, 0] == tw.CLS).all() and ids[0, 2] == tw.SEP and ids[1, 6] == tw.SEP
    assert (ids[mask == 0] == 0).all()


def test_requests_are_padded_to_their_own_longest():
    lengths = np.array([3, 9, 4, 4, 12, 5])
    made = tw.requests(lengths, 2)
    assert [ids.shape for ids, _ in made] == [(2, 9), (2, 4), (2, 12)]


def test_perf_data_groups_share_one_shape(tmp_path):
    lengths = np.array([3, 9, 4, 4])
    data = json.loads(tw.perf_input_data(lengths, 2, tmp_path / "d.json").read_text())["data"]
    assert [e["input_ids"]["shape"] for e in data] == [[9], [9], [4], [4]]
    assert sum(data[0]["attention_mask"]["content"]) == 3
    texts = json.loads(tw.perf_input_data(lengths, 2, tmp_path / "t.json", text=True).read_text())["data"]
    assert len(texts) == 4 and texts[0]["TEXT"]["shape"] == [1]


def test_texts_tokenize_to_about_their_lengths():
    tokenizers = pytest.importorskip("tokenizers")
    from tpserve.builders.spec.zoo.text import model_dir

    tokenizer = tokenizers.Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    lengths = tw.Lengths().sample(200)
    got = np.array([len(e.ids) for e in tokenizer.encode_batch(tw.texts(lengths))])
    assert np.array_equal(got, np.maximum(lengths, 3))


def test_serialized_requests_carry_each_requests_shape():
    from tritonclient.grpc import service_pb2

    made = [dict(zip(("input_ids", "attention_mask"), pair)) for pair in tw.requests(np.array([3, 9, 4, 4]), 2)]
    payloads = ragged_load.serialize("m", made, ["embedding"])
    message = service_pb2.ModelInferRequest.FromString(payloads[1])
    assert message.model_name == "m" and [list(t.shape) for t in message.inputs] == [[2, 4], [2, 4]]
    assert message.inputs[0].datatype == "INT64" and len(message.raw_input_contents[0]) == 2 * 4 * 8
    assert [o.name for o in message.outputs] == ["embedding"]


def test_http_requests_carry_each_requests_shape_and_its_raw_contents():
    made = [dict(zip(("input_ids", "attention_mask"), pair)) for pair in tw.requests(np.array([3, 9, 4, 4]), 2)]
    payloads = ragged_load.serialize_http("m", made, ["embedding"], "127.0.0.1:8000", {"x-team": "a"})
    head, _, body = payloads[1].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines[1:])
    assert lines[0] == "POST /v2/models/m/infer HTTP/1.1" and fields["x-team"] == "a"
    assert int(fields["Content-Length"]) == len(body)
    size = int(fields["Inference-Header-Content-Length"])
    header, raw = json.loads(body[:size]), body[size:]
    assert [(i["name"], i["shape"], i["datatype"]) for i in header["inputs"]] == [
        ("input_ids", [2, 4], "INT64"),
        ("attention_mask", [2, 4], "INT64"),
    ]
    assert [i["parameters"]["binary_data_size"] for i in header["inputs"]] == [64, 64] and len(raw) == 128
    assert raw[:64] == made[1]["input_ids"].tobytes()
    assert header["outputs"] == [{"name": "embedding", "parameters": {"binary_data": True}}]


@pytest.mark.parametrize(
    "answer, expected",
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcNEXT", (200, b"abc")),
        (b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}", (400, b"{}")),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc", ValueError),
        (b"HTTP/1.1 200 OK\r\nServer: x\r\n\r\n", ValueError),
        (b"SSH-2.0-OpenSSH\r\n\r\n", ValueError),
    ],
)
def test_the_http_client_reads_an_answer_by_its_content_length_and_refuses_what_it_cannot_read(answer, expected):
    import asyncio

    async def read():
        reader = asyncio.StreamReader()
        reader.feed_data(answer)
        reader.feed_eof()
        return await ragged_load.read_answer(reader)

    if expected is ValueError:
        with pytest.raises(ValueError):
            asyncio.run(read())
    else:
        assert asyncio.run(read()) == expected


def test_an_answer_that_closes_its_connection_says_so():
    import asyncio

    async def read(answer: bytes):
        reader = asyncio.StreamReader()
        reader.feed_data(answer)
        reader.feed_eof()
        return await ragged_load.read_answer_closing(reader)

    closed = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno"
    assert asyncio.run(read(closed)) == (503, b"no", True)
    assert asyncio.run(read(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"))[2] is False


def test_text_bench_fills_its_sizes_for_the_host_and_keeps_what_was_given():
    from tpserve.loadtest.benches.text_bench import TextBenchSettings, for_device

    gpu, cpu = for_device(TextBenchSettings(), True), for_device(TextBenchSettings(concurrency=(2,)), False)
    assert (gpu.sentences, gpu.concurrency, gpu.single_concurrency, gpu.max_batch, gpu.instances) == (
        8192,
        (16, 64, 128),
        (256,),
        1024,
        1,
    )
    assert (cpu.sentences, cpu.concurrency, cpu.single_concurrency, cpu.max_batch, cpu.instances) == (
        256,
        (2,),
        (16,),
        0,
        1,
    )


def test_locust_requests_follow_the_distribution_for_token_and_text_models_only():
    from tpserve.clients.model_plan import ModelPlan, TensorPlan

    tokens = ModelPlan(
        name="enc",
        max_batch_size=8,
        inputs=(TensorPlan("input_ids", "INT64", (-1,)), TensorPlan("attention_mask", "INT64", (-1,))),
        outputs=("e",),
    )
    made = tw.workload_requests(tokens, None, "lognormal", 4, seed=3)
    assert len(made) == 256 and all(r["input_ids"].shape[0] == 4 for r in made)
    widths = {r["input_ids"].shape[1] for r in made}
    assert len(widths) > 10 and max(widths) <= 256  # each request its own longest
    assert all((r["attention_mask"].sum(axis=1) >= 3).all() for r in made)
    text = ModelPlan(name="pipe", max_batch_size=8, inputs=(TensorPlan("TEXT", "BYTES", (1,)),), outputs=("EMBEDDING",))
    assert tw.workload_requests(text, None, "fixed:10", 2, seed=0)[0]["TEXT"].shape == (2, 1)
    image = ModelPlan(name="cnn", max_batch_size=8, inputs=(TensorPlan("x", "FP32", (3, 8, 8)),), outputs=("y",))
    assert tw.workload_requests(image, None, "lognormal", 1, seed=0) is None


def test_text_bench_rows_round_trip_through_csv_and_plot(tmp_path):
    import csv
    import dataclasses

    from tpserve.loadtest.benches.text_bench import TextRow, markdown, plot, rows_from_csv

    rows = [
        TextRow(
            path="in-process", runtime="eager", lengths="all 32 tokens", sentences_s=1000.0, padding_efficiency=1.0
        ),
        TextRow(
            path="served ids",
            runtime="m",
            lengths="lognormal, median 40 tokens",
            per_request=32,
            concurrency=64,
            sentences_s=900.0,
            tokens_s=48600.0,
            p50_ms=2.0,
            p99_ms=5.0,
            mean_batch=100.0,
            padding_efficiency=0.7,
            gpu_mib=4.0,
            direct_sentences_s=1200.0,
            direct_p50_ms=1.5,
        ),
        TextRow(
            path="served ids",
            runtime="m",
            lengths="all 32 tokens",
            per_request=1,
            concurrency=1,
            sentences_s=500.0,
            p50_ms=1.9,
        ),  # a latency row: not plotted
    ]
    path = tmp_path / "text_bench.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[f.name for f in dataclasses.fields(TextRow) if f.name != "extra"])
        writer.writeheader()
        writer.writerows({k: v for k, v in dataclasses.asdict(r).items() if k != "extra"} for r in rows)
    back = rows_from_csv(path)
    assert [(r.per_request, r.concurrency, r.sentences_s, r.mean_batch, r.direct_p50_ms) for r in back] == [
        (0, 0, 1000.0, None, None),
        (32, 64, 900.0, 100.0, 1.5),
        (1, 1, 500.0, None, None),
    ]
    table = markdown(back, "# t")  # through the edge first, tritonserver's own port beside
    assert (
        "| served ids | m | lognormal, median 40 tokens | 32 | 64 | 900 | 48,600 | 2.00 | 5.00 | 1,200, 1.50 | 100.0 "
        "| 0.70 | 4 |" in table
    )
    assert "| served ids | m | all 32 tokens | 1 | 1 | 500 | — | 1.90 | — | — |" in table
    pytest.importorskip("matplotlib")
    assert plot(back, tmp_path / "t.png").stat().st_size > 0


def test_the_tokenize_steps_note_is_its_batches_between_two_readings():
    from tpserve.loadtest.benches.text_bench import _tokenize_step

    def row(requests, executions, texts, us):
        phases = {f"{p}_us": us for p in ("queue", "compute_input", "compute_infer", "compute_output")}
        return {"model": "m_tokenize", "requests": requests, "executions": executions, "inferences": texts, **phases}

    before, after = row(10, 10, 320, 100.0), row(110, 20, 3520, 200.0)  # 100 requests in 10 batches
    note = _tokenize_step([before], [after])
    assert "m_tokenize: 10.0 requests (320 texts) a batch" in note
    assert "compute_infer 0.21" in note  # (200 µs x 110 - 100 µs x 10) / 100 requests = 0.21 ms
    assert _tokenize_step([before], [before]) == ""


def test_where_a_batch_went_names_the_native_steps_per_request():
    from tpserve.loadtest.benches.text_bench import _time_per_batch

    delta = {
        "batches": 10,
        "requests": 40,
        "time:native: read and check": 0.0004,
        "time:native: answer": 0.0008,
        "time:native: wait for a slot": 0.0,  # a step that took nothing is left out
        "time:plan and stage": 0.001,
    }
    said = _time_per_batch(delta)
    assert said.startswith("; ms per batch: ")
    assert "native: read and check 0.04" in said and "plan and stage 0.10" in said and "slot" not in said
    assert said.endswith("; native µs per request: read and check 10.0, answer 20.0")
    assert _time_per_batch({"batches": 0}) == ""
    assert "µs per request" not in _time_per_batch({"batches": 2, "time:plan and stage": 0.001})


def test_the_native_paths_unload_line_gives_each_step_per_request():
    from tpserve.triton_models.inprocess.native_path import RAGGED_COUNTS, RAGGED_TIMERS, per_request_us

    counted = dict.fromkeys(RAGGED_COUNTS, 0) | {name: 0 for name in RAGGED_TIMERS}
    assert per_request_us(counted) == ""
    counted |= {"requests": 4, "native: answer": 80_000, "native: read and check": 2_000}
    said = per_request_us(counted)
    assert said.startswith("; µs per request: read and check 0.5, plan, stage and launch 0.0")
    assert "answer 20.0" in said and said.count(",") == len(RAGGED_TIMERS) - 1 + 1  # "plan, stage and launch"


def test_the_http_client_says_why_no_request_succeeded_where_nothing_listens():
    from tpserve.common.endpoints import free_ports

    url = f"127.0.0.1:{free_ports(1)[0]}"
    payloads = ragged_load.serialize_http("m", [{"x": np.zeros((1, 2), np.float32)}], ["y"], url)
    with pytest.raises(MeasurementError, match="ConnectionRefusedError"):
        ragged_load.run(url, payloads, [1], concurrency=2, seconds=0.3, processes=1, warmup_s=0.1, protocol="http")
    with pytest.raises(MeasurementError, match="grpc or http"):
        ragged_load.run(url, payloads, [1], concurrency=2, protocol="websocket")


@pytest.mark.parametrize("busy, bound", [(0.5, False), (0.89, False), (0.9, True), (1.7, True)])
def test_a_client_process_busy_nearly_all_along_marks_the_figure_as_possibly_the_clients(busy, bound):
    from tpserve.loadtest.benches.text_bench import client_load

    result = ragged_load.LoadResult(
        requests=10, rows=10, seconds=1.0, p50_ms=1.0, p99_ms=2.0, errors=0, processes=2, client_busy=busy
    )
    assert result.client_bound is bound
    assert ("client-bound" in client_load(result)) is bound and "the client's 2 processes" in client_load(result)


def test_a_models_own_ids_range_and_axis_are_honoured_not_berts(tmp_path):
    """A user's text model (ids in [0, 1000), a mask in [0, 2), a seq axis of 1..64): perf's and Locust's data
    stay inside its value_range and its axis, masks are prefix masks, and nothing of BERT is assumed."""
    from types import SimpleNamespace

    from tpserve.builders.spec.model_spec import ModelSpec, TensorSpec
    from tpserve.loadtest.workloads import text as tw

    spec = ModelSpec(
        name="topic_textcls",
        builder="factory",
        inputs=(
            TensorSpec("input_ids", "INT64", (-1,), axes=("seq",), value_range=(0, 1000)),
            TensorSpec("attention_mask", "INT64", (-1,), axes=("seq",), value_range=(0, 2)),
        ),
        outputs=(TensorSpec("logits", "FP32", (4,)),),
        max_batch_size=16,
        dynamic_axes={"seq": (1, 64)},
    )
    assert tw.spec_ids_range(spec) == (0, 1000) and tw.spec_longest(spec) == 64
    inputs = (SimpleNamespace(name="input_ids", optional=False), SimpleNamespace(name="attention_mask", optional=False))
    plan = SimpleNamespace(token_inputs=True, text_input=False, inputs=inputs)
    made = tw.workload_requests(plan, spec, "lognormal", batch=4, seed=3, count=64)
    for request in made:
        ids, mask = request["input_ids"], request["attention_mask"]
        assert ids.min() >= 0 and ids.max() < 1000 and 1 <= ids.shape[1] <= 64
        lengths = mask.sum(axis=1)
        assert (mask == (np.arange(mask.shape[1])[None, :] < lengths[:, None])).all(), "prefix masks"
    path, said = tw.workload_data(plan, tw.Lengths.parse("lognormal", longest=64), 1, tmp_path / "d.json", spec=spec)
    entries = json.loads(path.read_text())["data"]
    assert max(max(e["input_ids"]["content"]) for e in entries) < 1000
