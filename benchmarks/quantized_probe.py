"""Does 8-bit pay on this GPU? A BERT-base-geometry encoder (random weights) compiled at fp16, and with its linear
layers quantized to 8 bits (torchao's dynamic float8 and int8, per-row scales; or static scales calibrated on a few
batches, our own linear layers over torch._scaled_mm and torch._int_mm), timed side by side in one process on
token grids of the sizes the server batches, with the cosine of the mean-pooled embeddings against fp32.

    python -m benchmarks.quantized_probe --out DIR   (torchao on the path)

An instrument for our own question (not the product): which 8-bit method is worth serving.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def encoder(hidden=768, layers=12, heads=12, intermediate=3072, vocab=30522):
    import torch
    from torch import nn

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.up, self.down = nn.Linear(hidden, intermediate), nn.Linear(intermediate, hidden)
            self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)

        def forward(self, x, bias):
            b, t, _ = x.shape
            q, k, v = self.qkv(x).view(b, t, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
            att = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            x = self.norm1(x + self.out(att.transpose(1, 2).reshape(b, t, hidden)))
            return self.norm2(x + self.down(nn.functional.gelu(self.up(x))))

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, hidden)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            for p in self.parameters():
                if p.dim() > 1:
                    nn.init.normal_(p, std=0.02)

        def forward(self, ids, mask):
            x = self.embed(ids)
            bias = ((1 - mask[:, None, None, :].to(x.dtype)) * -1e4).to(x.dtype)
            for layer in self.layers:
                x = layer(x, bias)
            m = mask[..., None].to(x.dtype)
            pooled = (x * m).sum(1) / m.sum(1).clamp(min=1)
            return torch.nn.functional.normalize(pooled.float(), dim=-1)

    torch.manual_seed(0)
    return Encoder().eval()


def static_linear(linear, amax: float, method: str):
    """linear with 8-bit weights and one calibrated scale for its activations (no amax per request): the quantizing
    prologue is pointwise, so torch.compile fuses it into the kernel that made the activations."""
    import torch
    from torch import nn

    class Fp8(nn.Module):  # e4m3, per-tensor scales: cuBLASLt's fp8 GEMM with scale_a/scale_b
        def __init__(self):
            super().__init__()
            w = linear.weight.detach().float()
            w_scale = w.abs().max().clamp(min=1e-12) / 448.0
            self.register_buffer("w", (w / w_scale).to(torch.float8_e4m3fn))
            self.register_buffer("sa", torch.tensor(amax / 448.0, dtype=torch.float32, device=w.device))
            self.register_buffer("sb", w_scale.to(torch.float32))
            self.register_buffer("bias", linear.bias.detach().half())
            self.inv = 448.0 / amax

        def forward(self, x):
            flat = x.reshape(-1, x.shape[-1])
            q = (flat * self.inv).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
            y = torch._scaled_mm(
                q, self.w.t(), scale_a=self.sa, scale_b=self.sb, bias=self.bias, out_dtype=torch.float16
            )
            return y.reshape(*x.shape[:-1], y.shape[-1])

    class Int8(nn.Module):  # per-tensor activations, per-channel weights: torch._int_mm, dequantized after
        def __init__(self):
            super().__init__()
            w = linear.weight.detach().float()
            w_scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
            self.register_buffer("w", torch.round(w / w_scale[:, None]).to(torch.int8))
            self.register_buffer("scale", (w_scale * (amax / 127.0)).to(torch.float32))
            self.register_buffer("bias", linear.bias.detach().half())
            self.inv = 127.0 / amax

        def forward(self, x):
            flat = x.reshape(-1, x.shape[-1])
            q = torch.round(flat * self.inv).clamp(-127, 127).to(torch.int8)
            acc = torch._int_mm(q, self.w.t())
            y = (acc.float() * self.scale).half() + self.bias
            return y.reshape(*x.shape[:-1], y.shape[-1])

    return {"fp8s": Fp8, "int8s": Int8}[method]()


def calibrated(module, method: str, feeds, ffn_only: bool = False):
    """Every linear layer (or the feed-forward ones) replaced by its static 8-bit twin, scales from the amax of its
    inputs over feeds."""
    import torch
    from torch import nn

    amax: dict[str, float] = {}
    hooks: list = []
    for name, sub in module.named_modules():
        if isinstance(sub, nn.Linear):

            def seen(_mod, args, _out, name=name):
                amax[name] = max(amax.get(name, 0.0), args[0].detach().abs().max().item())

            hooks.append(sub.register_forward_hook(seen))
    with torch.inference_mode():
        for ids, mask in feeds:
            module(ids, mask)
    for hook in hooks:
        hook.remove()
    for name, sub in list(module.named_modules()):
        for child, layer in list(sub.named_children()):
            full = f"{name}.{child}" if name else child
            if isinstance(layer, nn.Linear) and (not ffn_only or child in ("up", "down")):
                setattr(sub, child, static_linear(layer, amax[full], method))
    return module


def quantized(module, method: str):
    import torchao
    from torchao.quantization import (
        Float8DynamicActivationFloat8WeightConfig,
        Int8DynamicActivationInt8WeightConfig,
        PerRow,
        quantize_,
    )

    config = {
        "fp8": lambda: Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()),
        "int8": lambda: Int8DynamicActivationInt8WeightConfig(),
    }[method]()
    quantize_(module, config)
    return module, torchao.__version__


def timed(fn, ids, mask, repeats=30):
    import torch

    graph = torch.cuda.CUDAGraph()
    for _ in range(3):
        fn(ids, mask)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out = fn(ids, mask)
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats, out


def main(argv=None) -> int:
    import copy

    import torch

    parser = argparse.ArgumentParser(prog="quantized-probe")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--grids", default="32x32 64x32 256x32 32x128 128x128")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--methods", default="fp8 int8", help="fp8, int8 (torchao, dynamic); fp8s, int8s, fp8s-ffn (static)"
    )
    parser.add_argument("--modes", default="default", help="torch.compile modes, e.g. 'default max-autotune'")
    parser.add_argument("--autotune-grids", default="", help="grids the non-default modes are timed on (all)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch._dynamo.config.recompile_limit = 64  # one code object, a compile per variant and grid
    device = torch.device("cuda")
    base = encoder().to(device)
    grids = [tuple(int(v) for v in g.split("x")) for g in args.grids.split()]
    gen = torch.Generator(device="cpu").manual_seed(1)
    feeds = {g: (torch.randint(1000, 30000, g, generator=gen).to(device), torch.ones(g, dtype=torch.int64).to(device))
             for g in grids}  # fmt: skip
    with torch.inference_mode():
        reference = {g: base(*feeds[g]) for g in grids}
    calib = [(torch.randint(1000, 30000, (64, 32), generator=gen).to(device),
              torch.ones((64, 32), dtype=torch.int64).to(device)) for _ in range(4)]  # fmt: skip
    modules, info = {"fp16": copy.deepcopy(base).half()}, {}
    for method in args.methods.split():
        try:  # torchao's per-row float8 takes bfloat16 weights
            start = copy.deepcopy(base).to(torch.bfloat16 if method == "fp8" else torch.float16)
            if method in ("fp8s", "int8s", "fp8s-ffn"):
                modules[method] = calibrated(start, method.split("-")[0], calib, ffn_only=method.endswith("-ffn"))
            else:
                modules[method], info["torchao"] = quantized(start, method)
        except Exception as err:  # noqa: BLE001 - the probe reports what failed
            info[method] = f"{type(err).__name__}: {err}"[:400]
    autotune_grids = {tuple(int(v) for v in g.split("x")) for g in args.autotune_grids.split()} or set(grids)
    variants, on_grids = {}, {}
    for mode in args.modes.split():
        for name, module in modules.items():
            key = name if mode == "default" else f"{name}@{mode}"
            variants[key] = torch.compile(module, mode=None if mode == "default" else mode, dynamic=False)
            on_grids[key] = grids if mode == "default" else [g for g in grids if g in autotune_grids]
    results = []
    for rnd in range(args.rounds):
        for name, fn in variants.items():
            for g in on_grids[name]:
                with torch.inference_mode():
                    try:
                        seconds, out = timed(fn, *feeds[g])
                    except Exception as err:  # noqa: BLE001
                        info[f"{name} {g}"] = f"{type(err).__name__}: {err}"[:400]
                        continue
                cos = torch.nn.functional.cosine_similarity(out.float(), reference[g], dim=-1)
                row = {"round": rnd, "variant": name, "grid": f"{g[0]}x{g[1]}", "ms": seconds * 1e3}
                row.update(sentences_per_s=g[0] / seconds, cos_mean=cos.mean().item(), cos_min=cos.min().item())
                results.append(row)
                print(json.dumps(row), flush=True)
    info["gpu"] = torch.cuda.get_device_name()
    info["torch"] = torch.__version__
    (args.out / "quantized_probe.json").write_text(json.dumps({"info": info, "results": results}, indent=1))
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
