"""The Grafana dashboard, as code: typed panels rendered to Grafana's dashboard JSON model.

Every panel query is a PromQL expression over Triton's metrics, the recording rules of
loadtest/monitoring/prometheus_rules.py and Envoy's; the functional test evaluates each one against a live
Prometheus. Kubernetes gets it as a ConfigMap that Grafana's dashboard sidecar picks up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tpserve.loadtest.monitoring.prometheus_rules import (
    DEFAULT_RULES,
    GPU_UTILIZATION,
    P99,
    QUEUE_PER_REQUEST,
    REQUESTS,
    THROUGHPUT,
    RuleSettings,
)

ENVOY_LEGEND = "{{envoy_cluster_name}}"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """A time-series panel: title, unit (Grafana's unit id) and its queries."""

    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str = ""


ENVOY_5XX = 'envoy_cluster_upstream_rq_xx{envoy_response_code_class="5"}'


def panels(rules: RuleSettings = DEFAULT_RULES) -> list[Panel]:
    """The dashboard's panels, top to bottom."""
    w = rules.window
    return [
        Panel("Inferences/s per model", "ops", (Query(f"{THROUGHPUT}:rate{w}", "{{model}}"),)),
        Panel("Successful requests/s per model", "reqps", (Query(f"{REQUESTS}:rate{w}", "{{model}}"),)),
        Panel(
            "Queue time per request (the autoscaling signal)",
            "µs",
            (Query(f"{QUEUE_PER_REQUEST}:rate{w}", "{{model}}"), Query(f"vector({rules.queue_budget_us:g})", "max")),
            "Mean wait in Triton's queue per request; above the budget TritonScaleOut fires, the HPA adds pods.",
        ),
        Panel("p99 latency (histogram or summaries)", "ms", (Query(f"{P99}:rate{w}", "{{model}}"),)),
        Panel(
            "Failed requests/s per model",
            "reqps",
            (Query(f"sum by (model) (rate(nv_inference_request_failure[{w}]))", "{{model}}"),),
        ),
        Panel("GPU utilization", "percentunit", (Query(f"{GPU_UTILIZATION}:avg", "{{gpu_uuid}}"),)),
        Panel("Replicas up", "short", (Query('sum(up{job="triton"})', "scraped replicas"),)),
        Panel(
            "Envoy: requests/s by upstream cluster",
            "reqps",
            (Query(f"sum by (envoy_cluster_name) (rate(envoy_cluster_upstream_rq_total[{w}]))", ENVOY_LEGEND),),
        ),
        Panel(
            "Envoy: 5xx answers/s by upstream cluster",
            "reqps",
            (Query(f"sum by (envoy_cluster_name) (rate({ENVOY_5XX}[{w}]))", ENVOY_LEGEND),),
            "What clients were answered. Triton counts an error that a Python-backend model returns in its response "
            "as a success, so only the edge sees those.",
        ),
        Panel(
            "Envoy: healthy replicas",
            "short",
            (Query("sum by (envoy_cluster_name) (envoy_cluster_membership_healthy)", ENVOY_LEGEND),),
        ),
    ]


def _panel_json(panel: Panel, index: int) -> dict:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": q.expr, "legendFormat": q.legend, "datasource": DATASOURCE}
            for i, q in enumerate(panel.queries)
        ],
    }


def dashboard(rules: RuleSettings = DEFAULT_RULES) -> dict:
    """Grafana's dashboard JSON model."""
    variable = {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"}
    return {
        "uid": "triton-serving",
        "title": "Triton serving",
        "tags": ["triton"],
        "timezone": "browser",
        "schemaVersion": 39,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {"list": [variable]},
        "panels": [_panel_json(p, i) for i, p in enumerate(panels(rules))],
    }


def configmap(rules: RuleSettings = DEFAULT_RULES) -> dict:
    """The dashboard as a ConfigMap for Grafana's dashboard sidecar (label grafana_dashboard: "1")."""
    labels = {"app.kubernetes.io/name": "triton", "grafana_dashboard": "1"}
    meta = {"name": "triton-grafana-dashboard", "labels": labels}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {"triton.json": json.dumps(dashboard(rules), indent=2)},
    }


def queries(rules: RuleSettings = DEFAULT_RULES) -> list[str]:
    """Every PromQL expression of the dashboard."""
    return [q.expr for p in panels(rules) for q in p.queries]
