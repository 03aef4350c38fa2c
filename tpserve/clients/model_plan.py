"""What to send to a model, read from the server: its metadata and config, not our manifest.

Any KServe-v2 server answers metadata (inputs: name, datatype, shape) and, on Triton, the config
(max_batch_size, optional inputs, decoupled transaction policy, sequence batching, platform). From
these a plan says, per input, the per-request shape (with a batch axis only where max_batch_size > 0)
and whether data can be made up: dynamic dims need a length (`--shape NAME:d1,d2`, perf_analyzer's
convention, or the manifest's spec where the model is ours); BYTES inputs need data (`--input-data`).
A model whose inputs cannot be made up raises NotMeasurable naming the input and the flag.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpserve.common.errors import ClientError


class NotMeasurable(ClientError):
    """A model the tools cannot make inputs for: the message names the input and the flag that fixes it."""


@dataclass(frozen=True)
class TensorPlan:
    name: str
    datatype: str
    dims: tuple[int, ...]  # per sample: without the batch axis where the model batches
    optional: bool = False


@dataclass(frozen=True, kw_only=True)
class ModelPlan:
    """A model as the server describes it."""

    name: str
    max_batch_size: int
    inputs: tuple[TensorPlan, ...]
    outputs: tuple[str, ...]
    platform: str = ""
    decoupled: bool = False
    sequence: bool = False
    checks_json: str = ""  # the config's input_checks parameter (our builders write it), "" where none

    @property
    def checks(self):
        """The model's declared value ranges and axis lengths (runtime/input_checks.InputChecks), None where its
        config does not carry them (a repository we did not make)."""
        from tpserve.triton_models.runtime.input_checks import InputChecks

        return InputChecks.from_json(self.checks_json)

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    @property
    def token_inputs(self) -> bool:
        """Every required input is integer token data of one sequence axis per sample (ids, masks): a text
        encoder's, whose requests a length distribution describes (loadtest/workloads/text.py)."""
        required = [t for t in self.inputs if not t.optional]
        return (
            self.batching
            and bool(required)
            and all(t.dims == (-1,) and t.datatype in ("INT64", "INT32") for t in required)
        )

    @property
    def text_input(self) -> bool:
        """One required input, TEXT (BYTES): our text pipelines'."""
        required = [t for t in self.inputs if not t.optional]
        return [(t.name, t.datatype) for t in required] == [("TEXT", "BYTES")]

    def require_protocol(self, protocol: str) -> None:
        """A decoupled model answers only over gRPC streaming.

        Raises:
            NotMeasurable: it is decoupled and the protocol is not gRPC.
        """
        if self.decoupled and protocol != "grpc":
            raise NotMeasurable(
                f"{self.name}: decoupled: its responses come only over gRPC streaming (--protocol grpc, PROTOCOL=grpc)"
            )

    def shape(self, tensor: TensorPlan, batch: int, shapes: dict | None = None, lengths=None) -> list[int]:
        """The request shape of one input: [batch] + dims where the model batches, else dims; dynamic
        dims from shapes[name] (all per-sample dims) or lengths(name, position).

        Raises:
            NotMeasurable: a dynamic dim has no length.
        """
        dims = list(tensor.dims)
        given = (shapes or {}).get(tensor.name) if -1 in dims else None  # fixed dims need no --shape
        if given is not None:
            if len(given) != len(dims) or any(d not in (-1, g) for d, g in zip(dims, given)):
                raise ClientError(f"--shape {tensor.name}:{','.join(map(str, given))} does not fit its dims {dims}")
            dims = list(given)
        elif -1 in dims:
            found = [d if d != -1 else (lengths(tensor.name, i) if lengths else None) for i, d in enumerate(dims)]
            if None in found:
                example = ",".join("8" if d is None else str(d) for d in found)
                raise NotMeasurable(
                    f"{self.name}: input '{tensor.name}' has dynamic dims {list(tensor.dims)}; "
                    f"give their lengths: --shape {tensor.name}:{example}"
                )
            dims = [int(d) for d in found if d is not None]
        return [batch, *dims] if self.batching else dims


def plan(client, model: str, headers: dict | None = None) -> ModelPlan:
    """The model's plan from the server (metadata + config; a server without config: metadata only).

    Raises:
        ClientError: the model is unknown or not ready (the server's reason).
    """
    from tpserve.clients.connection import as_dict, refused_as_client_error

    with refused_as_client_error(model):
        meta = as_dict(client.get_model_metadata(model, headers=headers or None))
    try:
        config = as_dict(client.get_model_config(model, headers=headers or None))
        config = config.get("config", config)
    except Exception:  # not Triton, or config not exposed: metadata is enough for shapes
        config = {}
    batching = int(config.get("max_batch_size", 0) or 0)
    optional = {i["name"] for i in config.get("input", []) if i.get("optional")}
    inputs = tuple(
        TensorPlan(
            i["name"], i["datatype"], tuple(int(d) for d in i["shape"][1 if batching else 0 :]), i["name"] in optional
        )
        for i in meta["inputs"]
    )
    return ModelPlan(
        name=model,
        max_batch_size=batching,
        inputs=inputs,
        outputs=tuple(o["name"] for o in meta["outputs"]),
        platform=config.get("platform") or config.get("backend", ""),
        decoupled=bool(config.get("model_transaction_policy", {}).get("decoupled")),
        sequence="sequence_batching" in config,
        checks_json=_parameter(config, "input_checks"),
    )


def _parameter(config: dict, key: str) -> str:
    """A config parameter's string value ("" where absent or not a string)."""
    value = (config.get("parameters") or {}).get(key) or {}
    return value.get("string_value", "") if isinstance(value, dict) else ""


def parse_shapes(items) -> dict[str, list[int]]:
    """--shape NAME:d1,d2 (repeatable, or space-separated) -> {name: [d1, d2]}."""
    found = {}
    for item in [p for entry in items for p in entry.split()]:
        name, _, dims = item.rpartition(":")
        try:
            found[name] = [int(d) for d in dims.split(",") if d]
        except ValueError:
            raise ClientError(f"--shape {item!r}: expected NAME:d1,d2 (whole numbers)") from None
        if not name or not found[name]:
            raise ClientError(f"--shape {item!r}: expected NAME:d1,d2")
    return found
