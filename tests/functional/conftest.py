"""A real tritonserver on free ports, serving digits_cnn (2 instances) and a small ResNet-18; and a user's own
project built from its spec file and served as `server start` serves it."""

import contextlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tpserve.builders.build import build_model, build_torch_variant
from tpserve.builders.repository.pipelines import write_image_pipelines, write_text_pipeline
from tpserve.builders.repository.writer import ServingOptions, TorchRuntime
from tpserve.builders.request import BuildRequest
from tpserve.builders.spec import zoo
from tpserve.builders.spec.zoo import text
from tpserve.common import endpoints
from tpserve.common.endpoints import Endpoint
from tpserve.server.triton import launcher

RESNET = dict(image_size=64, max_batch_size=4)


@dataclass
class Served:
    state: endpoints.ServerState
    repo: Path
    models: dict  # name -> (spec, BuiltModel)

    @property
    def state_dir(self) -> Path:
        return Path(self.state.log).parent

    def endpoint(self, protocol: str) -> Endpoint:
        return endpoint_of(self.state, self.repo, protocol)


@contextlib.contextmanager
def user_project_served(root: Path, package: str, module: str, spec: str):
    """A user's project in root (src/<package>/model.py holding module, models.toml holding spec) built with the
    builder's CLI for the embedded target with its compiled engine beside ONNX Runtime (`--compiled fp32`), then
    served as `make serve` serves it (`server start`'s default front, on free ports); stopped on leaving. Yields the
    server's state, the repository and the state folder."""
    (root / "src" / package).mkdir(parents=True)
    (root / "src" / package / "__init__.py").write_text("")
    (root / "src" / package / "model.py").write_text(module)
    (root / "models.toml").write_text(spec)
    command = [sys.executable, "-m", "tpserve.builders", "build", "--spec", "models.toml", "--target", "embedded"]
    command += ["--compiled", "fp32", "--repo", "repo"]
    built = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    state_dir, ports = root / "state", [str(p) for p in endpoints.free_ports(4)]
    server = [sys.executable, "-m", "tpserve.server"]
    start = [*server, "start", "--repo", str(root / "repo"), "--state-dir", str(state_dir)]
    start += ["--http-port", ports[0], "--grpc-port", ports[1], "--metrics-port", ports[2], "--health-port", ports[3]]
    try:
        started = subprocess.run(start, capture_output=True, text=True, timeout=300)
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        yield endpoints.read_state(state_dir), root / "repo", state_dir
    finally:
        subprocess.run([*server, "stop", "--state-dir", str(state_dir)], capture_output=True, timeout=120)


def served_variant(state: endpoints.ServerState, repo: Path, model: str, backend: str) -> str:
    """The served variant of a user's model: "onnxruntime" (ONNX Runtime) or "compiled" (its torch.compile engine,
    named by its graphs on a GPU host); skipped with why where the server left it out (ONNX Runtime under numpy 2)."""
    names = sorted(p.name for p in repo.iterdir() if (p / "config.pbtxt").exists())
    name = model if backend == "onnxruntime" else next(n for n in names if n.startswith(f"{model}_inductor_"))
    if name in state.left_out:
        pytest.skip(f"{name} is not served here: {state.left_out[name]}")
    return name


def start_digits(digits_build, root: Path, *options: str) -> Path:
    """digits_cnn built into root/repo and served by `server start` with options, on free ports: the state folder."""
    import subprocess
    import sys

    spec, built, _ = digits_build
    build_model(BuildRequest(spec=spec, target="embedded", repo=root / "repo", work_dir=root / "work"), built)
    ports = [str(p) for p in endpoints.free_ports(4)]
    command = [sys.executable, "-m", "tpserve.server", "start", *options, "--repo", str(root / "repo"),
               "--http-port", ports[0], "--grpc-port", ports[1], "--metrics-port", ports[2], "--health-port", ports[3],
               "--state-dir", str(root / "state")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return root / "state"


def stop_digits(state_dir: Path) -> None:
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "tpserve.server", "stop", "--state-dir", str(state_dir)], timeout=120)


def endpoint_of(state: endpoints.ServerState, repo: Path, protocol: str) -> Endpoint:
    """The Endpoint of a server the tests started, with its admin key and repository."""
    return state.endpoint(protocol, repo)


def _build(repo, work, spec, built, options, precisions=("fp32",)):
    build_model(
        BuildRequest(spec=spec, target="embedded", repo=repo, work_dir=work, options=options, precisions=precisions),
        built,
    )
    return spec.name, (spec, built)


@pytest.fixture(scope="session")
def served(tmp_path_factory, digits_build):
    root = tmp_path_factory.mktemp("served")
    repo, work = root / "repo", root / "work"
    digits_spec, digits_built, _ = digits_build
    resnet_spec = zoo.get_spec("resnet18", **RESNET)
    models = dict(
        [
            _build(
                repo,
                work,
                digits_spec,
                digits_built,
                ServingOptions(instances=2, max_queue_delay_us=2000),
                precisions=("fp32", "int8"),
            ),
            _build(repo, work, resnet_spec, zoo.build_module(resnet_spec), ServingOptions()),
        ]
    )
    for runtime in (TorchRuntime(precision="fp32"), TorchRuntime(precision="fp32", uint8_input=True)):
        build_torch_variant(BuildRequest(spec=resnet_spec, target="embedded", repo=repo, work_dir=work), runtime)
    write_image_pipelines(repo, digits_spec, top_k=3)
    minilm = zoo.get_spec("minilm", max_batch_size=8)
    build_model(BuildRequest(spec=minilm, target="embedded", repo=repo, work_dir=work, options=ServingOptions()))
    write_text_pipeline(repo, minilm, text.model_dir() / "tokenizer.json")
    with launcher.running(repo, root / "state") as state:
        yield Served(state, repo, models)


def behind_edge(repo: Path, state_dir: Path, record=None, grpc_streaming: bool = False, **edge):
    """ClusterSettings of one supervised server behind Envoy (what `make serve FRONT=envoy` starts), on free ports;
    edge: EdgeLimits fields (echo_reading=True for the differential test); record: a RecordSettings;
    grpc_streaming: ModelStreamInfer served (`--grpc-streaming`)."""
    from tpserve.server.edge.request_checks import EdgeLimits
    from tpserve.server.single import one_behind_edge

    return one_behind_edge(repo, state_dir, edge=EdgeLimits(**edge), record=record, grpc_streaming=grpc_streaming)
