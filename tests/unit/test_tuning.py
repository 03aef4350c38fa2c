"""Serving settings from recorded traffic (builders/repository/tuning.py, `make build-engines SHAPES_FROM=`):
length buckets that pad the recorded lengths least, a queue delay from the peak rate, batch sizes from the rows
a batch gathers, and a recording or a workload file read alike."""

from collections import Counter

import numpy as np
import pytest

from tpserve.builders.repository.tuning import choose_length_buckets, padding_efficiency, tune
from tpserve.builders.spec import zoo
from tpserve.common.traffic import RecordedInput, RecordedRequest, RecordingWriter, traffic_shapes


def _lognormal_lengths(n=4000, seed=0) -> Counter:
    rng = np.random.default_rng(seed)
    return Counter(int(v) for v in np.clip(np.exp(rng.normal(np.log(40), 0.8, n)), 3, 256).round())


def test_tuned_buckets_pad_less_than_the_defaults_and_keep_the_longest():
    lengths = _lognormal_lengths()
    chosen = choose_length_buckets(lengths, 256, 8)
    assert len(chosen) <= 8 and chosen[-1] == 256 and all(b % 8 == 0 for b in chosen)
    assert padding_efficiency(lengths, chosen) > padding_efficiency(lengths, (64, 128, 256))
    assert choose_length_buckets(Counter({30: 5, 31: 2}), 256) == (32, 256)  # few lengths: one bucket each


def test_the_choice_is_the_best_one_on_a_small_case():
    lengths = Counter({8: 10, 16: 1, 24: 10, 256: 1})
    assert choose_length_buckets(lengths, 256, 3) == (8, 24, 256)


def _sentences(lengths, rate_per_s: float, model="minilm") -> list[RecordedRequest]:
    return [
        RecordedRequest(
            arrival_us=int(i * 1e6 / rate_per_s),
            model=model,
            protocol="grpc",
            inputs=(RecordedInput("input_ids", "INT64", (1, n)), RecordedInput("attention_mask", "INT64", (1, n))),
        )
        for i, n in enumerate(lengths)
    ]


def test_a_sequence_model_gets_buckets_a_delay_and_batch_sizes(tmp_path):
    spec = zoo.get_spec("minilm")
    lengths = list(_lognormal_lengths(2000).elements())
    with RecordingWriter(tmp_path / "rec") as writer:
        for request in _sentences(lengths, 300.0):
            writer.write(request)
    histogram, rate = traffic_shapes(tmp_path / "rec").for_model("minilm")
    tuning = tune(spec, histogram, rate)
    assert tuning.requests == 2000 and rate == pytest.approx(300, rel=0.05)
    assert tuning.max_queue_delay_us == 5000  # two gaps at 300/s, capped at 5 ms
    assert tuning.preferred_batch_sizes == (tuning.figures["rows_per_batch_at_peak"],) == (3,)
    assert tuning.graph_batch_sizes == (1, 2, 4, 6)
    assert tuning.figures["padding_efficiency_tuned"] >= tuning.figures["padding_efficiency_default"]
    assert tuning.length_buckets[-1] == spec.longest_sequence()


def test_an_image_model_gets_no_length_buckets_and_a_short_delay_at_a_high_rate():
    spec = zoo.get_spec("digits_cnn")
    signature = (("input", "FP32", (4, 1, 8, 8)),)
    tuning = tune(spec, Counter({signature: 100}), 20000.0)
    assert tuning.length_buckets == () and tuning.max_queue_delay_us == 100
    assert tuning.figures["rows_per_request_p99"] == 4 and tuning.preferred_batch_sizes == (12,)
    lone = tune(spec, Counter({(("input", "FP32", (1, 1, 8, 8)),): 100}), 1.0)
    assert lone.preferred_batch_sizes == () and lone.max_queue_delay_us == 5000


def test_variants_share_the_model_s_traffic(tmp_path):
    with RecordingWriter(tmp_path / "rec") as writer:
        for request in _sentences([16] * 10, 10.0, "minilm_inductor_fp16") + _sentences([32] * 5, 10.0):
            writer.write(request)
    histogram, _ = traffic_shapes(tmp_path / "rec").for_model("minilm")
    assert sum(histogram.values()) == 15
