"""The in-process tokenize step on its own, natively and through Python, in one server: two copies of the zoo
MiniLM's tokenize step (one with `native_path 0`), single texts one at a time (p50 over gRPC) and requests of 32
texts from several clients at once (texts/s), the two copies taking turns. Texts: the zoo's ASCII sentences.

    .venv/bin/python -m benchmarks.tokenize_step --out reports/tokenize_step

Writes tokenize_step.md; docs/cpu/tokenize_step_2core.md holds a run.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

PATHS = {"native": "1", "python": "0"}  # the copies: native_path as the config says it


def write_repo(repo: Path, processes: int) -> dict[str, str]:
    """The two copies of the tokenize step; returns {path: model name}."""
    from tpserve.builders.repository import pipelines
    from tpserve.builders.repository import writer as repository
    from tpserve.builders.spec import zoo
    from tpserve.builders.spec.zoo.text import model_dir

    spec = zoo.get_spec("minilm")
    configs = pipelines.text_pipeline_configs(spec, repository.ServingOptions(max_queue_delay_us=0), True, 1)
    (step,) = [c for c in configs if c.name.endswith("_tokenize")]
    names = {}
    for path, flag in PATHS.items():
        name = f"tokenize_{path}"
        params = {**step.parameters, "native_path": flag, "tokenize_processes": str(processes)}
        config = dataclasses.replace(step, name=name, parameters=params)
        labelled = dataclasses.replace(spec, name=name)
        repository.write_model(repo, labelled, config, {"tokenizer.json": model_dir() / "tokenizer.json"}, "embedded")
        names[path] = name
    return names


def _payload(texts: list[str]) -> np.ndarray:
    return np.array([[t.encode()] for t in texts], dtype=object)


def single_p50_ms(client, model: str, texts: list[str], count: int) -> float:
    import tritonclient.grpc as grpcclient

    times = []
    for k in range(count):
        feed = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        feed.set_data_from_numpy(_payload([texts[k % len(texts)]]))
        start = time.perf_counter()
        client.infer(model, [feed])
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def texts_per_s(url: str, model: str, texts: list[str], clients: int, seconds: float) -> float:
    import tritonclient.grpc as grpcclient

    batch = [texts[k % len(texts)] for k in range(32)]

    def one(_):
        client, done = grpcclient.InferenceServerClient(url), 0
        feed = grpcclient.InferInput("TEXT", [32, 1], "BYTES")
        feed.set_data_from_numpy(_payload(batch))
        ends = time.perf_counter() + seconds
        while time.perf_counter() < ends:
            client.infer(model, [feed])
            done += 32
        client.close()
        return done

    with ThreadPoolExecutor(clients) as pool:
        return sum(pool.map(one, range(clients))) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("reports/tokenize_step"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=0, help="tokenize_processes of both copies (0: none)")
    args = parser.parse_args()
    import tritonclient.grpc as grpcclient

    from tpserve.builders.spec.zoo.text import SENTENCES
    from tpserve.server.triton import launcher

    args.out.mkdir(parents=True, exist_ok=True)
    repo = args.out / "repo"
    names = write_repo(repo, args.processes)
    texts = [s for s in SENTENCES if s.isascii()]
    found: dict[str, dict[str, list[float]]] = {p: {"p50": [], "rate": []} for p in PATHS}
    with launcher.running(repo, args.out / "state") as state:
        url = state.grpc_url
        client = grpcclient.InferenceServerClient(url)
        for path in PATHS:  # warm both
            single_p50_ms(client, names[path], texts, 50)
        for round_ in range(args.rounds):
            order = list(PATHS) if round_ % 2 == 0 else list(PATHS)[::-1]
            for path in order:
                found[path]["p50"].append(single_p50_ms(client, names[path], texts, 1000))
                found[path]["rate"].append(texts_per_s(url, names[path], texts, 4, 5.0))
                print(
                    path, round(found[path]["p50"][-1], 3), "ms", round(found[path]["rate"][-1]), "texts/s", flush=True
                )
        client.close()
    lines = [
        f"Rounds: {args.rounds} (order reversed every round); tokenize_processes {args.processes}.",
        "",
        "| path | one text, p50 gRPC (median of rounds) | 32 texts a request, 4 clients (median) | each round |",
        "|---|---:|---:|---|",
    ]
    for path in PATHS:
        p50, rate = statistics.median(found[path]["p50"]), statistics.median(found[path]["rate"])
        rounds = ", ".join(f"{a:.3f} ms / {b:,.0f}/s" for a, b in zip(found[path]["p50"], found[path]["rate"]))
        lines.append(f"| {path} | {p50:.3f} ms | {rate:,.0f} texts/s | {rounds} |")
    (args.out / "tokenize_step.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
