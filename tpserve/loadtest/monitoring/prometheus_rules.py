"""Prometheus recording and alerting rules for Triton, from typed data.

One source for every place the rules are used: the local Prometheus of `make cluster`
(written as rules.yml), the PrometheusRule of the Kubernetes manifests, and the HPA signal
that prometheus-adapter serves (the same queue-time-per-request expression).
"""

from __future__ import annotations

from dataclasses import dataclass

QUEUE_PER_REQUEST = "triton:queue_time_per_request_us"
THROUGHPUT = "triton:inference_throughput"
REQUESTS = "triton:request_success"
P99 = "triton:request_p99_ms"
GPU_UTILIZATION = "triton:gpu_utilization"
BUSY = "triton:busy_instances"  # instance-seconds of compute per second, per model, over every replica
REPLICAS_NEEDED = "tpserve:replicas_needed"
TARGET_UTILISATION = 0.8  # replicas are sized for their capacity at this share (as `plan` sizes them)


@dataclass(frozen=True)
class RuleSettings:
    """The rate window of every recording rule, the queue-time budget of the scale-out alert and the p99 budget of
    the latency alert."""

    window: str = "1m"
    queue_budget_us: float = 10_000.0  # 10 ms of queueing per request: add replicas
    alert_for: str = "2m"
    p99_budget_ms: float = 1_000.0  # a model's p99 above a second: someone should look
    instances: tuple[tuple[str, int], ...] = ()  # instances per replica of a model (any other: 1)

    def __post_init__(self):
        if not self.window[:-1].isdigit() or self.window[-1] not in "smh":
            raise ValueError(f"window {self.window!r}: expected a Prometheus duration such as '30s' or '1m'")
        if self.queue_budget_us <= 0:
            raise ValueError("queue_budget_us must be positive")
        if self.p99_budget_ms <= 0:
            raise ValueError("p99_budget_ms must be positive")


DEFAULT_RULES = RuleSettings()


def queue_time_per_request(window: str, by: str = "model", matchers: str = "") -> str:
    """Mean queue time per successful request in µs over the window (the autoscaling signal).

    by and matchers may be prometheus-adapter's templates (<<.GroupBy>>, <<.LabelMatchers>>).
    """
    labels = f"{{{matchers}}}" if matchers else ""
    queued = f"sum by ({by}) (rate(nv_inference_queue_duration_us{labels}[{window}]))"
    served = f"sum by ({by}) (rate(nv_inference_request_success{labels}[{window}]))"
    return f"{queued} / ({served} > 0)"


def inferences_per_s(window: str) -> str:
    """Inferences (samples) per second per model."""
    return f"sum by (model) (rate(nv_inference_count[{window}]))"


def requests_per_s(window: str) -> str:
    """Successful requests per second per model."""
    return f"sum by (model) (rate(nv_inference_request_success[{window}]))"


def busy_instances(window: str) -> str:
    """Instance-seconds of compute per second per model, over every replica: each request's compute time (input,
    infer, output), which tritonserver counts once per request of a batch, times executions per request."""
    compute = " + ".join(
        f"sum by (model) (rate(nv_inference_compute_{phase}_duration_us[{window}]))"
        for phase in ("input", "infer", "output")
    )
    per_request = (
        f"sum by (model) (rate(nv_inference_exec_count[{window}])) / "
        f"(sum by (model) (rate(nv_inference_request_success[{window}])) > 0)"
    )
    return f"({compute}) / 1e6 * ({per_request})"


def replicas_needed(s: RuleSettings) -> str:
    """Replicas the live load needs: the busiest model's busy instances over its instances per replica at
    TARGET_UTILISATION, rounded up; and, while a model's queue time per request is over the scale-out budget, one
    more than run now (a saturated replica's busy time cannot show how much more is asked of it)."""
    busy = f"{BUSY}:rate{s.window}"
    if s.instances:
        per_model = " or ".join(f'label_replace(vector({int(k)}), "model", "{m}", "", "")' for m, k in s.instances)
        capacity = f"(({per_model}) or on(model) (0 * {busy} + 1))"
        load = f"{busy} / on(model) group_left() {capacity}"
    else:
        load = busy
    running = "count(count by (instance) (nv_inference_request_success))"
    queued = f"max({QUEUE_PER_REQUEST}:rate{s.window}) > bool {s.queue_budget_us:g}"
    by_load = f'label_replace(ceil(max({load}) / {TARGET_UTILISATION:g}), "term", "load", "", "")'
    by_queue = f'label_replace(({running} + 1) * ({queued}), "term", "queue", "", "")'
    return f"max({by_load} or {by_queue})"


HPA_METRIC = "triton_queue_time_per_request_us"
REPLICAS_NEEDED_METRIC = "tpserve_replicas_needed"  # as prometheus-adapter serves it (External)


def prometheus_rule(s: RuleSettings = DEFAULT_RULES) -> dict:
    """The rules as a Prometheus Operator PrometheusRule."""
    meta = {"name": "triton", "labels": {"app.kubernetes.io/name": "triton"}}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": meta,
        "spec": rule_groups(s),
    }


def adapter_config(window: str = "1m") -> dict:
    """prometheus-adapter's rule that serves the HPA metric per pod: queue time per request."""
    rule = {
        "seriesQuery": 'nv_inference_queue_duration_us{namespace!="",pod!=""}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": "^nv_inference_queue_duration_us$", "as": HPA_METRIC},
        "metricsQuery": queue_time_per_request(window, "<<.GroupBy>>", "<<.LabelMatchers>>"),
    }
    needed = {  # the fleet's replicas needed, for the HPA's External metric (the recording rule above)
        "seriesQuery": REPLICAS_NEEDED,
        "resources": {"namespaced": False},
        "name": {"matches": f"^{REPLICAS_NEEDED}$", "as": REPLICAS_NEEDED_METRIC},
        "metricsQuery": REPLICAS_NEEDED,
    }
    return {"rules": [rule], "externalRules": [needed]}


def adapter_configmap(window: str = "1m") -> dict:
    """The ConfigMap prometheus-adapter reads (--config=/etc/adapter/config.yaml)."""
    import yaml

    meta = {"name": "prometheus-adapter-triton", "labels": {"app.kubernetes.io/name": "triton"}}
    data = {"config.yaml": yaml.safe_dump(adapter_config(window), sort_keys=False, width=200)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


BACKEND_HISTOGRAM = "torch_inprocess_request_duration_ms"  # the in-process backend's own (metrics.c)


def p99_ms(window: str) -> str:
    """p99 request latency (ms) per model, from the first source a model has:
    1. Triton's latency histograms (--metrics-config=histogram_latencies=true, newer releases);
    2. the in-process backend's own histogram (torch_inprocess_request_duration_ms: a batch's start to the answer;
       the queue before it is the scale-out rule's signal). It stays on with the summaries off, and costs no lock
       that serializes requests: `LATENCY_SUMMARIES=0` keeps this p99 for in-process models;
    3. the worst replica's p99 summary (--metrics-config=summary_latencies=true, which 2.51 has and `make serve`
       turns on)."""
    triton = f"sum by (model, le) (rate(nv_inference_first_response_histogram_ms_bucket[{window}]))"
    backend = f"sum by (model, le) (rate({BACKEND_HISTOGRAM}_bucket[{window}]))"
    summary = 'max by (model) (nv_inference_request_summary_us{quantile="0.99"}) / 1000'
    return f"histogram_quantile(0.99, {triton}) or histogram_quantile(0.99, {backend}) or {summary}"


def recording_rules(s: RuleSettings) -> list[dict]:
    """Throughput and requests per model, queue time per request, p99 (histograms on), GPU utilization."""
    w = s.window
    return [
        {"record": f"{THROUGHPUT}:rate{w}", "expr": inferences_per_s(w)},
        {"record": f"{REQUESTS}:rate{w}", "expr": requests_per_s(w)},
        {"record": f"{QUEUE_PER_REQUEST}:rate{w}", "expr": queue_time_per_request(w)},
        {"record": f"{P99}:rate{w}", "expr": p99_ms(w)},
        {"record": f"{GPU_UTILIZATION}:avg", "expr": "avg by (gpu_uuid) (nv_gpu_utilization)"},
        {"record": f"{BUSY}:rate{w}", "expr": busy_instances(w)},
        {"record": REPLICAS_NEEDED, "expr": replicas_needed(s)},
    ]


def alerting_rules(s: RuleSettings) -> list[dict]:
    """'Scale out' when a model's requests queue longer than the budget for a while; 'latency high' when its p99
    stays above the budget."""
    return [
        {
            "alert": "TritonScaleOut",
            "expr": f"{QUEUE_PER_REQUEST}:rate{s.window} > {s.queue_budget_us:g}",
            "for": s.alert_for,
            "labels": {"severity": "warning", "action": "scale-out"},
            "annotations": {
                "summary": "Scale out: {{ $labels.model }} requests queue {{ $value | humanize }} µs each",
                "description": f"Mean queue time per request above {s.queue_budget_us:g} µs for {s.alert_for}: "
                "add replicas (the HPA acts on the same signal).",
            },
        },
        {
            "alert": "TritonLatencyHigh",
            "expr": f"{P99}:rate{s.window} > {s.p99_budget_ms:g}",
            "for": s.alert_for,
            "labels": {"severity": "warning", "action": "investigate"},
            "annotations": {
                "summary": "{{ $labels.model }}: p99 {{ $value | humanize }} ms",
                "description": f"p99 latency above {s.p99_budget_ms:g} ms for {s.alert_for} (Triton's histograms, "
                "the in-process backend's, or the summaries: whichever the model has).",
            },
        },
    ]


def rule_groups(s: RuleSettings = DEFAULT_RULES) -> dict:
    """The rule file's content ({'groups': [...]}) as Prometheus and the PrometheusRule spec read it."""
    return {
        "groups": [
            {"name": "triton-recording", "rules": recording_rules(s)},
            {"name": "triton-alerts", "rules": alerting_rules(s)},
        ]
    }
