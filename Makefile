# Serve PyTorch models with Triton. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

SPEC ?=
MODELS ?= $(if $(SPEC),,digits_cnn resnet50)
# perf, loadtest and infer measure what the server lists unless MODELS or MODEL names models (either works everywhere)
GIVEN_MODELS = $(strip $(MODEL) $(if $(filter command line environment,$(origin MODELS)),$(MODELS)))
TARGET ?= auto
REPO ?= model_repository
WEIGHTS ?= random
PRECISIONS ?= fp32
CALIBRATION ?=
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
STATE_DIR ?= .triton
MODEL ?=
PROTOCOL ?= grpc
CONCURRENCY ?= 1 2 4
# what `make demo` builds and measures (the README's table; a test holds the two equal)
DEMO_MODELS ?= digits_cnn resnet50
INTERVAL_MS ?= 2000
# any Triton: URL=host:port (PROTOCOL says which port), SHAPE="NAME:d1,d2 ..." for dynamic dims, INPUT_DATA=file
URL ?=
SHAPE ?=
INPUT_DATA ?=
# token and text models: sentence lengths per request ('lognormal[:MEDIAN]', seeded, median 40; or 'fixed:N')
LENGTHS ?= lognormal
# TLS: TLS_CERT= and TLS_KEY= make Envoy's listeners speak TLS; clients then take TLS=1 (CA_FILE= for private roots)
TLS_CERT ?=
TLS_KEY ?=
TLS ?=
CA_FILE ?=
SERVER_TLS = $(if $(TLS_CERT),--tls-cert $(TLS_CERT) --tls-key $(TLS_KEY))
ANY_TRITON = $(if $(TLS),--tls) $(if $(CA_FILE),--ca-file $(CA_FILE)) $(if $(URL),--url $(URL)) $(foreach s,$(SHAPE),--shape $(s)) $(if $(INPUT_DATA),--input-data $(INPUT_DATA))
PYTEST_ARGS ?=
TEST_WORKERS ?= 2
# the tests over TEST_WORKERS processes, a test file to one (2 on the 2-core host: 26-30 min against 47, 2026-12-04); 1: one process
SPLIT_TESTS = $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)
SPEC_TEXT ?= examples/text/models.toml
TEXT_MODEL ?= minilm_l6_random

# RECORD=1: the traffic's shapes in STATE_DIR/traffic (no values); RECORD=values: request bodies too
RECORD ?= 0
RECORDING = --record $(RECORD) $(if $(RECORD_FILE_MB),--record-file-mb $(RECORD_FILE_MB)) $(if $(RECORD_FILES),--record-files $(RECORD_FILES))
SERVER_PORTS := --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT)
HEALTH_PORT ?= 8003
# Triton's per-model latency summaries (p50/p90/p99 in /metrics): 0 saves a server thread ~10-30 us per request
LATENCY_SUMMARIES ?= 1
# the quantiles they keep, "q:error,...": each one more costs every request (default 0.5:0.05,0.9:0.01,0.99:0.001)
LATENCY_QUANTILES ?=
# tritonserver tuning flags, "--flag=value ...": pools and thread counts only (tpserve/server/triton/launcher.py: TUNING_FLAGS)
SERVER_ARGS ?=
SERVER_TUNING = $(if $(SERVER_ARGS),--server-args "$(SERVER_ARGS)") \
	$(if $(filter 0 false no off,$(LATENCY_SUMMARIES)),--no-latency-summaries) \
	$(if $(LATENCY_QUANTILES),--latency-quantiles "$(LATENCY_QUANTILES)")
# requests that may wait per replica behind the edge before refusals (0: two full batches of the largest model)
MAX_WAITING ?= 0
# QUEUE_SLO_MS=20 (or "model=20 *=50"): the edge refuses a model's calls at once while its queue time is over it
QUEUE_SLO_MS ?=
# GRPC_STREAMING=1: serve gRPC ModelStreamInfer (decoupled models need it); off, the front refuses each stream,
# since tritonserver 2.51 crashes under concurrent streams (docs/security.md)
GRPC_STREAMING ?=
# FRONT=server (the checks inside tritonserver's reads), envoy (Envoy in front: RECORD, TLS, CANARY need it) or
# none (unguarded); empty: server, or envoy where RECORD or TLS asks for it
FRONT ?=
NGC_RELEASE ?= $(shell sed -n 's/^NGC_RELEASE=//p' docker/.env)
COMPOSE := docker compose --env-file docker/.env -f docker/compose.yaml
# the admin key's file (created on first use, mode 600): Docker reads it as a secret, nothing passes the key itself
ADMIN_KEY_FILE = $$($(PY) -c 'from tpserve.server.triton.launcher import admin_key; print(admin_key(__import__("pathlib").Path("$(STATE_DIR)")).resolve())')

.PHONY: help install build-engines serve stop status infer perf loadtest replay plan model-analyzer install-model-analyzer test test-unit test-chaos lint demo clean \
	rollout soak cluster monitor fuzz-edge fuzz-native install-prometheus cluster-restart build-engines-docker serve-docker stop-docker perf-docker docker-lint container-engine image bundle gpu-bench text-bench install-browser docs

help: ## List the targets and their variables
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  \033[36m%-15s\033[0m %s\n", $$1, $$2}'
	@echo "Variables: MODELS='$(MODELS)' MODEL=$(MODEL) SPEC=$(SPEC) TARGET=$(TARGET) REPO=$(REPO) WEIGHTS=$(WEIGHTS) PROTOCOL=$(PROTOCOL)"
	@echo "  HTTP_PORT=$(HTTP_PORT) GRPC_PORT=$(GRPC_PORT) METRICS_PORT=$(METRICS_PORT) HEALTH_PORT=$(HEALTH_PORT) STATE_DIR=$(STATE_DIR)"
	@echo "  CONCURRENCY='$(CONCURRENCY)' INTERVAL_MS=$(INTERVAL_MS) DEMO_MODELS='$(DEMO_MODELS)'"

NUMPY_2 ?= 2.3.5
install: $(STAMP) ## Create .venv and install everything (idempotent, quick when done)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	$(PY) -m tpserve.loadtest install-perf-analyzer
	$(PY) -m tpserve.server build-shim
	$(PY) -m pip download -q --no-deps --only-binary=:all: -d .tools/wheels "numpy==$(NUMPY_2)"  # the stub under numpy 2, in the tests
	$(PY) -m pip download -q --no-deps --only-binary=:all: -d .tools/wheels -c constraints.txt numpy  # and the bundle's numpy 1
	@touch $(STAMP)

build-engines: install ## Export, validate, quantize, write the repository: MODELS="..." and/or SPEC=models.toml, TARGET=embedded|ngc PRECISIONS="fp32 int8" COMPILED="fp16 bf16" SHAPES_FROM=<recording or workload> RAGGED=0
	$(PY) -m tpserve.builders build --models "$(MODELS)" $(if $(SPEC),--spec $(SPEC)) --target $(TARGET) --repo $(REPO) $(if $(VERBOSE),-v) \
		--weights $(WEIGHTS) --precisions "$(PRECISIONS)" $(if $(CALIBRATION),--calibration $(CALIBRATION)) \
		$(if $(COMPILED),--compiled "$(COMPILED)") $(if $(SHAPES_FROM),--shapes-from "$(SHAPES_FROM)") \
		$(if $(filter 0,$(RAGGED)),--no-ragged-batching)

serve: install ## Start the embedded tritonserver on REPO, supervised (HEALTH_PORT: readiness for load balancers; LATENCY_SUMMARIES=0: no p99 summaries; RECORD=1|values: record the traffic; MAX_WAITING=n: requests that may wait before refusals; QUEUE_SLO_MS=ms: refuse a model's calls while its queue time is over it; GRPC_STREAMING=1: serve gRPC streams; FRONT=envoy|server|none)
	$(PY) -m tpserve.server start --repo $(REPO) $(SERVER_PORTS) --health-port $(HEALTH_PORT) --state-dir $(STATE_DIR) $(SERVER_TLS) \
		$(if $(FRONT),--front $(FRONT)) $(if $(INTERNAL_HTTP_PORT),--internal-http-port $(INTERNAL_HTTP_PORT)) $(RECORDING) $(SERVER_TUNING) \
		--max-waiting $(MAX_WAITING) $(if $(QUEUE_SLO_MS),--queue-slo-ms "$(QUEUE_SLO_MS)") $(if $(filter 1,$(GRPC_STREAMING)),--grpc-streaming)

stop: ## Stop what `make serve`, `make cluster` or `make monitor` started in STATE_DIR
	@if [ -x $(PY) ]; then $(PY) -m tpserve.loadtest prometheus stop --state-dir $(STATE_DIR) >/dev/null; \
		$(PY) -m tpserve.server stop --state-dir $(STATE_DIR); fi

REPLICAS ?= 2
cluster: install ## REPLICAS supervised tritonservers on REPO behind Envoy on HTTP_PORT/GRPC_PORT (stats: METRICS_PORT); GPU_PER_REPLICA=1 REPLICA_BASE_PORT=9100 RECORD=1; `make stop` ends all
	$(PY) -m tpserve.server cluster --replicas $(REPLICAS) --repo $(REPO) $(SERVER_PORTS) --state-dir $(STATE_DIR) \
		$(if $(GPU_PER_REPLICA),--gpu-per-replica) $(if $(REPLICA_BASE_PORT),--replica-base-port $(REPLICA_BASE_PORT)) \
		$(SERVER_TLS) $(RECORDING) $(SERVER_TUNING) --max-waiting $(MAX_WAITING) \
		$(if $(QUEUE_SLO_MS),--queue-slo-ms "$(QUEUE_SLO_MS)") $(if $(filter 1,$(GRPC_STREAMING)),--grpc-streaming)

cluster-restart: install ## Rolling restart of the cluster's replicas (each back in Envoy before the next)
	$(PY) -m tpserve.server cluster-restart --state-dir $(STATE_DIR)

PROMETHEUS_PORT ?= 9090
monitor: install install-prometheus ## Prometheus on PROMETHEUS_PORT scraping the server or cluster of STATE_DIR (Triton rules loaded)
	$(PY) -m tpserve.loadtest prometheus start --port $(PROMETHEUS_PORT) --state-dir $(STATE_DIR)

install-prometheus: install ## Unpack Prometheus + promtool into .tools/prometheus (Debian's package, no root, no service)
	@$(PY) -m tpserve.loadtest install-prometheus || echo "prometheus unavailable: the Prometheus tests will be skipped (set PROMETHEUS_BINARY to use one)"

install-model-analyzer: install ## NVIDIA Model Analyzer in an environment of its own, .tools/model-analyzer (no root)
	@$(PY) -m tpserve.loadtest install-model-analyzer || echo "Model Analyzer unavailable: its test will be skipped"

model-analyzer: install install-model-analyzer ## Model Analyzer's profile of MODELS (REPO=) on this checkout's tritonserver and perf_analyzer (bin/); reports/ma-<time>/
	@test -n "$(GIVEN_MODELS)" || { echo "usage: make model-analyzer MODELS=\"a b\" [REPO=...]"; exit 2; }
	$(PY) -m tpserve.loadtest model-analyzer --repo $(REPO) --models "$(GIVEN_MODELS)"

install-browser: install ## Unpack a headless browser for the report tests into .tools/chromium (Debian's chromium-headless-shell, no root)
	@$(PY) -m tests.browser || echo "the report tests in a browser will be skipped"

docs: install ## Build the documentation site into site/ (MkDocs, strict: a broken link or a missing page fails it)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

FROM ?=
HOLD ?= 30
LATENCY_RATIO ?= 1.5
LATENCY_SLACK_MS ?= 5
rollout: install ## Roll MODEL's new build from FROM into the served REPO without downtime (rolls back on a failed check); CANARY="1 10 50 100" HOLD=30: by traffic share, gated on p99 <= LATENCY_RATIO x the old one's + LATENCY_SLACK_MS
	@test -n "$(MODEL)" -a -n "$(FROM)" || { echo "usage: make rollout MODEL=<served model> FROM=<repository built by make build-engines>"; exit 2; }
	$(PY) -m tpserve.operations rollout --model "$(MODEL)" --from "$(FROM)" --repo $(REPO) --http-port $(HTTP_PORT) --state-dir $(STATE_DIR) \
		$(if $(CANARY),--share "$(CANARY)" --hold $(HOLD) --latency-ratio $(LATENCY_RATIO) --latency-slack-ms $(LATENCY_SLACK_MS))

status: install ## Show the running server
	$(PY) -m tpserve.server status --state-dir $(STATE_DIR)

infer: install ## One request to MODEL (or MODELS) with top-3 (after `make serve`, or URL=host:port of any Triton) PROTOCOL=grpc
	@test $(words $(GIVEN_MODELS)) -le 1 || { echo "make infer takes one model: MODEL=<name> (got '$(GIVEN_MODELS)')"; exit 2; }
	$(PY) -m tpserve.clients infer $(GIVEN_MODELS) --top-k 3 --protocol $(PROTOCOL) --state-dir $(STATE_DIR) $(ANY_TRITON)

perf: install ## perf_analyzer sweep of MODELS or MODEL (default: every ready model) of `make serve` or URL= (ADMIN_KEY_FILE=: its key for a restricted statistics API); INTERVAL_MS=2000; reports/<time>/
	$(PY) -m tpserve.loadtest perf --models "$(GIVEN_MODELS)" --protocol $(PROTOCOL) --concurrency "$(CONCURRENCY)" \
		--interval-ms $(INTERVAL_MS) --state-dir $(STATE_DIR) --lengths "$(LENGTHS)" $(ANY_TRITON) \
		$(if $(ADMIN_KEY_FILE),--admin-key-file $(ADMIN_KEY_FILE))

SCALE ?= 1
REPLAY_TARGET = --state-dir $(STATE_DIR) $(if $(URL),--url $(URL) --protocol $(PROTOCOL)) \
	$(if $(GIVEN_MODELS),--models "$(GIVEN_MODELS)") $(if $(TLS),--tls) $(if $(CA_FILE),--ca-file $(CA_FILE))
LOCUST_RUN = $(PY) -m tpserve.loadtest locust --models "$(GIVEN_MODELS)" --protocol $(PROTOCOL) --state-dir $(STATE_DIR) \
	--lengths "$(LENGTHS)" $(ANY_TRITON)
WORKLOAD_RUN = $(PY) -m tpserve.loadtest replay --workload "$(WORKLOAD)" --scale $(SCALE) $(REPLAY_TARGET)
loadtest: install ## Headless Locust run against MODEL or MODELS (default: every ready model) of `make serve` or URL=; WORKLOAD=<file> [SCALE=3]: a fitted workload instead; reports/<time>/
	$(if $(WORKLOAD),$(WORKLOAD_RUN),$(LOCUST_RUN))

SPEED ?= 1
replay: install ## Replay FROM (a recording: STATE_DIR/traffic of `make serve RECORD=1`) open loop through Locust; SPEED=3 for 3x; URL= (with PROTOCOL=) for any Triton
	@test -n "$(FROM)" || { echo "usage: make replay FROM=<recording folder or file> [SPEED=1] [URL=host:port PROTOCOL=http|grpc]"; exit 2; }
	$(PY) -m tpserve.loadtest replay --from "$(FROM)" --speed $(SPEED) $(REPLAY_TARGET) \
		$(if $(GENERATOR),--generator $(GENERATOR)) $(if $(filter-out 0,$(MAX_WAITING)),--max-waiting $(MAX_WAITING))

GROWTH ?= 1
plan: install ## The smallest deployment for GROWTH x the traffic of FROM (a recording) at p99 <= SLO_P99_MS, found by replaying it (REPO=; MAX_REPLICAS=); reports/plan-<time>/
	@test -n "$(FROM)" -a -n "$(SLO_P99_MS)" || { echo "usage: make plan FROM=<recording> SLO_P99_MS=<ms> [GROWTH=2] [REPO=...] [MAX_REPLICAS=n]"; exit 2; }
	$(PY) -m tpserve.loadtest plan --from "$(FROM)" --slo-p99-ms $(SLO_P99_MS) --growth $(GROWTH) --repo $(REPO) \
		$(if $(MAX_REPLICAS),--max-replicas $(MAX_REPLICAS)) $(if $(GIVEN_MODELS),--models "$(GIVEN_MODELS)") \
		$(if $(GENERATOR),--generator $(GENERATOR)) $(if $(filter-out 0,$(MAX_WAITING)),--max-waiting $(MAX_WAITING))

MINUTES ?= 10
soak: install ## Bounded load on MODEL (default digits_cnn_pipeline) for MINUTES with RSS sampled (after `make serve`)
	$(PY) -m tpserve.loadtest soak $(if $(MODEL),--model $(MODEL)) --minutes $(MINUTES) --state-dir $(STATE_DIR) \
		$(if $(URL),--url $(URL) --protocols $(PROTOCOL))

test: install install-prometheus install-browser install-model-analyzer ## Run every test: unit, golden fixtures, functional (real tritonserver), the docs site, reports in a browser; what CI runs (TEST_WORKERS=n: over n processes)
	$(PY) -m pytest tests $(SPLIT_TESTS) $(PYTEST_ARGS)

test-unit: install ## The fast tier for the edit-test loop: no server, no training (under 2 minutes)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-chaos: install ## The stub-kill recovery test under load (prints the failed-request count and the window)
	$(PY) -m pytest tests/functional/test_supervisor.py -m chaos -s $(PYTEST_ARGS)

FUZZ_EXAMPLES ?= 20000
fuzz-native: install ## The native request paths, the guard's frame rewriting, the gRPC recorder, the edge's admission reading and the HTTP request checks (alone and in tritonserver's reads) under ASan/UBSan with random and adversarial input: FUZZ_SECONDS (300) per seed, FUZZ_SEEDS="1 2 3"
	$(PY) -c 'import sys; sys.path.insert(0, "tests/native"); from pathlib import Path; import tempfile; from test_native_fuzz import build_fuzzer, run_fuzzer; \
	where = Path(tempfile.mkdtemp()); b = [build_fuzzer(where / f"fuzz_{p}", p) for p in ("paths", "guard", "recorder", "admission", "checks", "front")]; \
	rc = [print(f"seed {s}:", (d := run_fuzzer(f, float("$(or $(FUZZ_SECONDS),300)"), int(s))).stdout.strip(), d.stderr[-3000:]) or d.returncode for f in b for s in "$(or $(FUZZ_SEEDS),1 2 3)".split()]; \
	sys.exit(max(rc))'

fuzz-edge: install ## The edge's differential test, longer and with new seeds: FUZZ_EXAMPLES requests; writes docs/security/edge_fuzz.md
	EDGE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) EDGE_FUZZ_RANDOM=1 EDGE_FUZZ_REPORT=docs/security/edge_fuzz.md \
		$(PY) -m pytest tests/functional/test_edge_differential.py -s -q $(PYTEST_ARGS)

lint: install ## ruff check and format check, and mypy over every package (settings in pyproject.toml)
	$(PY) -m ruff check . && $(PY) -m ruff format --check . && $(PY) -m mypy

demo: install ## Build DEMO_MODELS, serve them, measure with perf_analyzer, print the table, stop
	$(MAKE) --no-print-directory build-engines MODELS="$(DEMO_MODELS)" TARGET=embedded
	$(PY) -m tpserve.server start --repo $(REPO) $(SERVER_PORTS) --health-port $(HEALTH_PORT) --state-dir $(STATE_DIR) $(SERVER_TUNING)
	@status=0; \
	$(PY) -m tpserve.loadtest perf --models "$(DEMO_MODELS)" --protocol grpc --concurrency "1 4" --interval-ms $(INTERVAL_MS) \
		--state-dir $(STATE_DIR) || status=$$?; \
	$(PY) -m tpserve.server stop --state-dir $(STATE_DIR); exit $$status

build-engines-docker: install ## NGC: ONNX + TensorRT plans inside the TensorRT container (GPU host + Docker)
	MODELS="$(MODELS)" $(COMPOSE) --profile build run --rm builder

# a GPU and the NGC image here: the NGC path; otherwise our own image (make image)
NGC_HERE = $(shell command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && \
	docker image inspect nvcr.io/nvidia/tritonserver:$(NGC_RELEASE)-py3 >/dev/null 2>&1 && echo 1)
BASE_IMAGE ?=

container-engine: ## Install a container engine where none runs (Debian's podman, runc, debootstrap; system-wide, needs root)
	@if $(PY) -c 'from tpserve.server.container import no_engine_reason as r; raise SystemExit(1 if r() else 0)' 2>/dev/null; then \
		echo "container engine: one runs here"; else \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			podman runc debootstrap uidmap slirp4netns fuse-overlayfs; fi

image: install ## The server image for hosts without a GPU or NGC (docker/Dockerfile.embedded); BASE_IMAGE=<Debian 12 image>, else one made from Debian's packages
	$(PY) -m tpserve.server image $(if $(BASE_IMAGE),--base-image $(BASE_IMAGE))

serve-docker: install ## Serve REPO from a container: the NGC image where a GPU and it are here, else our image (make image)
ifeq ($(NGC_HERE),1)
	$(PY) -m tpserve.builders guard --repo $(REPO) --image nvcr.io/nvidia/tritonserver:$(NGC_RELEASE)-py3
	ADMIN_KEY_FILE=$(ADMIN_KEY_FILE) REPO=$(abspath $(REPO)) $(COMPOSE) up -d --build --wait tritonserver
else
	$(PY) -m tpserve.server container-start --repo $(REPO) $(SERVER_PORTS) --health-port $(HEALTH_PORT) --state-dir $(STATE_DIR)
endif

stop-docker: ## Stop the container(s) serve-docker started
	@if [ -f $(STATE_DIR)/container.json ]; then $(PY) -m tpserve.server container-stop --state-dir $(STATE_DIR); \
	else ADMIN_KEY_FILE=/dev/null $(COMPOSE) --profile build --profile perf down; fi

perf-docker: install ## NGC: perf_analyzer from the SDK image against MODEL (system shared memory)
	ADMIN_KEY_FILE=$(ADMIN_KEY_FILE) MODEL=$(MODEL) $(COMPOSE) --profile perf run --rm --build sdk

docker-lint: install ## Validate the Docker files statically (hadolint, compose schema): no engine needed
	$(VENV)/bin/hadolint docker/Dockerfile.builder
	$(VENV)/bin/hadolint docker/Dockerfile.server
	$(VENV)/bin/hadolint docker/Dockerfile.embedded
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.compose-spec docker/compose.yaml docker/compose.embedded.yaml

BUNDLE_PYTHON ?= 3.12
bundle: install ## Offline tarball (tritonserver, perf_analyzer, wheels) for GPU hosts: BUNDLE_PYTHON=3.12
	$(PY) -m tpserve.loadtest bundle --python $(BUNDLE_PYTHON)

text-bench: install ## A sentence encoder (SPEC_TEXT, TEXT_MODEL) in-process and served from ids and text, over LENGTHS workloads (LATENCY_SUMMARIES=0: no p99 summaries)
	$(PY) -m tpserve.loadtest text-bench --spec $(SPEC_TEXT) --model $(TEXT_MODEL) --lengths "$(LENGTHS) fixed:32" --interval-ms $(INTERVAL_MS) \
	  $(if $(filter 0 false no off,$(LATENCY_SUMMARIES)),--no-latency-summaries)

gpu-bench: install ## CPU vs GPU vs TensorRT for ResNet-50, in-process and served (needs a CUDA GPU for the GPU rows)
	$(PY) -m tpserve.loadtest gpu-bench --model resnet50

clean: stop ## Remove build caches, reports and the generated repository (keeps .venv)
	rm -rf build reports/2* $(STATE_DIR)
	find $(REPO) -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
