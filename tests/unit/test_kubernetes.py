"""The Kubernetes manifests, validated offline: core kinds against the Kubernetes 1.37 OpenAPI schemas
(kubernetes-validate, strict), custom resources by what can be checked without their operators (the
KServe predictor as a core Container, the PrometheusRule against the rules generator, promtool where
installed), and the wiring between them (selectors, ports, probes, secret, metric names)."""

import copy
import subprocess
from pathlib import Path

import pytest
import yaml

from tpserve.loadtest.monitoring import kubernetes as kubernetes_monitoring
from tpserve.loadtest.monitoring import prometheus_rules
from tpserve.loadtest.monitoring.prometheus_tools import find_tool

ROOT = Path(__file__).parents[2]
FOLDER = ROOT / "kubernetes"
K8S = "1.37.0"
CUSTOM = {"ServiceMonitor", "PrometheusRule", "InferenceService"}


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((FOLDER / name).read_text()) if d]


def _all() -> dict[str, dict]:
    found = {}
    for path in sorted(FOLDER.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") != "Kustomization":
                found[f"{path.relative_to(FOLDER)}:{doc['kind']}"] = doc
    return found


def _validate(doc: dict) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(doc, K8S, strict=True)


@pytest.mark.parametrize("name", [n for n, d in _all().items() if d["kind"] not in CUSTOM])
def test_core_manifests_validate_strictly(name):
    _validate(_all()[name])


@pytest.mark.parametrize(
    "breakage",
    [
        lambda d: d["spec"].__setitem__("replicas", "two"),
        lambda d: d["spec"]["template"]["spec"]["containers"][0].__setitem__("livenessProbes", {}),
        lambda d: d["spec"]["template"]["spec"]["containers"][0]["ports"][0].__setitem__("containerPort", "http"),
        lambda d: d["spec"].pop("selector"),
    ],
    ids=["replicas-string", "unknown-field", "port-name-as-number", "no-selector"],
)
def test_a_broken_manifest_is_rejected(breakage):
    import kubernetes_validate

    deployment = copy.deepcopy(_docs("deployment.yaml")[0])
    breakage(deployment)
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(deployment)


def test_kustomization_lists_every_manifest_and_only_existing_ones():
    listed = set(_docs("kustomization.yaml")[0]["resources"])
    assert listed == {p.name for p in FOLDER.glob("*.yaml") if p.name != "kustomization.yaml"}


def _container() -> dict:
    return _docs("deployment.yaml")[0]["spec"]["template"]["spec"]["containers"][0]


def test_service_and_servicemonitor_select_the_pods_and_their_ports():
    deployment, service, monitor = (
        _docs("deployment.yaml")[0],
        _docs("service.yaml")[0],
        _docs("servicemonitor.yaml")[0],
    )
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    container_ports = {p["name"]: p["containerPort"] for p in _container()["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports.keys()
    assert container_ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}


def test_probes_gpu_and_the_admin_key_secret():
    container = _container()
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "TRITON_ADMIN_KEY" not in env and not any("valueFrom" in e for e in container["env"])  # no key in env
    assert not any("admin-key=" in a for a in container["args"])  # nor on a command line
    assert "command" not in container  # the image's entrypoint: serve.sh with the shim built into the image
    volumes = {v["name"]: v for v in _docs("deployment.yaml")[0]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["admin-key"]["secret"]["secretName"] == "triton-admin-key"
    assert volumes["admin-key"]["secret"]["defaultMode"] == 0o400
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert env["TRITON_ADMIN_KEY_FILE"] == f"{mounts['admin-key']}/admin-key"
    assert "initContainers" not in _docs("deployment.yaml")[0]["spec"]["template"]["spec"]  # nothing built per start


def test_the_pods_keep_the_latency_quantiles_make_serve_keeps():
    from tpserve.server.triton.launcher import DEFAULT_QUANTILES

    wanted = f"--metrics-config=summary_quantiles={DEFAULT_QUANTILES}"
    assert wanted in _container()["args"]
    assert wanted in _docs("kserve/inferenceservice.yaml")[0]["spec"]["predictor"]["model"]["args"]


def test_the_image_is_the_ngc_release_of_docker_env():
    release = next(
        line.split("=", 1)[1]
        for line in (ROOT / "docker/.env").read_text().splitlines()
        if line.startswith("NGC_RELEASE=")
    )
    image = f"triton-pytorch-serving-server:{release}"  # docker/Dockerfile.server FROM the NGC release, shim inside
    assert _container()["image"] == image
    predictor = _docs("kserve/inferenceservice.yaml")[0]["spec"]["predictor"]
    assert predictor["model"]["image"] == image and predictor["model"]["command"] == ["/opt/triton_shim/serve.sh"]
    assert "initContainers" not in predictor
    compose = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())["services"]["tritonserver"]
    assert compose["image"] == "triton-pytorch-serving-server:${NGC_RELEASE}" and compose["build"]["target"] == "server"
    (entry,) = _docs("kustomization.yaml")[0]["images"]
    assert entry["name"] == image.split(":")[0] and entry["newTag"] == release
    dockerfile = (ROOT / "docker/Dockerfile.server").read_text()
    assert "/src/triton/triton_shim.c /src/triton/front/*.c" in dockerfile  # the shim and the guard, in the image


def test_the_prometheus_rule_and_adapter_are_what_the_generator_writes(tmp_path):
    written = {p.name: p.read_text() for p in kubernetes_monitoring.write_kubernetes(tmp_path)}
    for name, text in written.items():
        assert (FOLDER / name).read_text() == text, (
            f"{name} drifted: run `python -m tpserve.loadtest kubernetes-monitoring`"
        )


def test_the_hpa_scales_on_the_adapters_queue_time_metric():
    hpa, adapter = _docs("hpa.yaml")[0], _docs("prometheus-adapter.yaml")[0]
    rule = yaml.safe_load(adapter["data"]["config.yaml"])["rules"][0]
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert metric == rule["name"]["as"] == prometheus_rules.HPA_METRIC
    assert hpa["spec"]["scaleTargetRef"]["name"] == _docs("deployment.yaml")[0]["metadata"]["name"]
    expected = prometheus_rules.queue_time_per_request("1m", "<<.GroupBy>>", "<<.LabelMatchers>>")
    assert rule["metricsQuery"] == expected


def test_the_hpa_also_scales_to_the_replicas_the_live_load_needs():
    hpa, adapter = _docs("hpa.yaml")[0], _docs("prometheus-adapter.yaml")[0]
    (external,) = yaml.safe_load(adapter["data"]["config.yaml"])["externalRules"]
    (metric,) = [m for m in hpa["spec"]["metrics"] if m["type"] == "External"]
    assert metric["external"]["metric"]["name"] == external["name"]["as"] == prometheus_rules.REPLICAS_NEEDED_METRIC
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}  # exactly that many
    recorded = {
        r["record"]
        for g in _docs("prometheus-rules.yaml")[0]["spec"]["groups"]
        for r in g.get("rules", [])
        if "record" in r
    }
    assert external["metricsQuery"] == prometheus_rules.REPLICAS_NEEDED in recorded


@pytest.mark.skipif(find_tool("promtool") is None, reason="promtool not installed: make install-prometheus")
def test_promtool_accepts_the_rules(tmp_path):
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(_docs("prometheus-rules.yaml")[0]["spec"]))
    done = subprocess.run([str(find_tool("promtool")), "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_kserve_predictor_is_a_valid_container_spec():
    model = copy.deepcopy(_docs("kserve/inferenceservice.yaml")[0]["spec"]["predictor"]["model"])
    assert model.pop("modelFormat") == {"name": "triton"} and model.pop("storageUri").startswith("pvc://")
    assert model.pop("protocolVersion") == "v2"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "check"},
        "spec": {"containers": [{"name": "kserve-container", **model}]},
    }
    _validate(pod)
    assert model["image"] == _container()["image"] and model["env"] == _container()["env"]
    assert not any("admin-key=" in a for a in model["args"])


def _entrypoint() -> list[str]:
    import json

    dockerfile = (ROOT / "docker" / "Dockerfile.embedded").read_text()
    (line,) = [x for x in dockerfile.splitlines() if x.startswith("ENTRYPOINT ")]
    return json.loads(line.removeprefix("ENTRYPOINT "))


def test_the_embedded_deployment_is_our_image_s_entry_point_with_options_it_takes(tmp_path):
    """kubernetes/embedded/deployment.yaml runs the image `make image` builds: its args parsed by the entry point's
    own command (`tpserve server start`), the ports, probes, mounts and user those options and the image name."""
    from tpserve.server import container as containers
    from tpserve.server.__main__ import cli

    (deployment,) = [d for d in yaml.safe_load_all((FOLDER / "embedded" / "deployment.yaml").read_text()) if d]
    pod = deployment["spec"]["template"]["spec"]
    (box,) = pod["containers"]
    assert "command" not in box and _entrypoint()[:3] == ["tpserve", "server", "start"]
    args = [a.replace("=/models", f"={tmp_path}") for a in box["args"]]  # a repository that exists here
    context = cli.commands["start"].make_context("start", [*_entrypoint()[3:], *args])
    given = context.params
    assert given["foreground"] and given["host"] == "0.0.0.0" and given["front"] == "auto"  # the default front
    ports = {p["name"]: p["containerPort"] for p in box["ports"]}
    assert ports == {
        "http": given["http_port"], "grpc": given["grpc_port"], "metrics": given["metrics_port"],
        "health": given["health_port"],
    }  # fmt: skip
    assert {p["targetPort"] for p in _docs("service.yaml")[0]["spec"]["ports"]} <= ports.keys()
    assert box["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "health"}
    assert box["startupProbe"]["httpGet"] == box["readinessProbe"]["httpGet"]
    env = {e["name"]: e["value"] for e in box["env"]}
    assert env["TPSERVE_HEALTH_PORT"] == str(given["health_port"])  # what the image's HEALTHCHECK asks
    mounts = {m["mountPath"]: m for m in box["volumeMounts"]}
    assert mounts["/models"]["readOnly"] and str(given["state_dir"]) in mounts and "/tmp" in mounts
    assert pod["securityContext"]["runAsUser"] == containers.UID and box["securityContext"]["readOnlyRootFilesystem"]
    assert box["image"] == containers.IMAGE and "nvidia.com/gpu" not in box["resources"].get("limits", {})
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert _docs("service.yaml")[0]["spec"]["selector"].items() <= labels.items()


def test_an_option_the_entry_point_does_not_take_is_caught():
    import click

    from tpserve.server.__main__ import cli

    with pytest.raises(click.UsageError, match="--model-repository"):
        cli.commands["start"].make_context("start", ["--foreground", "--model-repository=/models"])
