"""The user's own data (--input-data, INPUT_DATA=), read one way by every tool that sends it.

A file holds rows: an .npz one array per input with the rows on its first axis (where the model batches), a
folder one row per image, perf_analyzer's JSON one row per entry. A request of batch b carries b consecutive
rows, cycling through the file, as perf_analyzer itself forms its batches; where the model does not batch, each
row is a whole request (an .npz is then one request). Before anything is measured the rows are held to the
model as the server declares it (datatype, dims, and the value ranges and axis lengths of our configs'
input_checks), and a row that does not fit is named with why.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tpserve.common.errors import ClientError


def given_rows(path: Path, plan, batch: int = 1) -> list[dict]:
    """The file's rows (each a dict input -> array, with a batch axis of 1 where the model batches), checked
    against the model for requests of `batch` rows.

    Raises:
        ClientError: the file cannot be read, or its data does not fit the model (what, which row, how to fix).
    """
    from tpserve.clients.inputs import data_inputs

    path = Path(path)
    if path.suffix == ".json":
        rows = _json_rows(path, plan)
    else:
        arrays = data_inputs(path, plan)
        count = {len(a) for a in arrays.values()} if plan.batching else {1}
        if len(count) != 1:
            sizes = {n: len(a) for n, a in arrays.items()}
            raise ClientError(f"{path}: its arrays hold different numbers of rows {sizes}; give every input the same")
        total = count.pop()
        rows = [{n: a[i : i + 1] for n, a in arrays.items()} for i in range(total)] if plan.batching else [arrays]
    check_rows(rows, plan, str(path), batch)
    return rows


def request_of(rows: list[dict], index: int, batch: int, batching: bool = True) -> dict:
    """The index-th request: `batch` consecutive rows from index * batch, cycling; where the model does not
    batch, the index-th row (each a whole request)."""
    if not batching:
        return rows[index % len(rows)]
    picked = [rows[(index * batch + k) % len(rows)] for k in range(batch)]
    return {n: np.concatenate([r[n] for r in picked]) for n in picked[0]}


def check_rows(rows: list[dict], plan, source: str, batch: int = 1) -> None:
    """Raises ClientError where the rows cannot make valid requests of `batch` rows for the model."""
    from tpserve.clients.inputs import numpy_dtype

    if not rows:
        raise ClientError(f"{source} holds no rows for {plan.name}")
    if plan.batching and batch > plan.max_batch_size:
        raise ClientError(f"batch {batch} is over {plan.name}'s max_batch_size {plan.max_batch_size}")
    checks = plan.checks
    for index, row in enumerate(rows):
        for tensor in (t for t in plan.inputs if t.name in row):
            array = row[tensor.name]
            dims = array.shape[1:] if plan.batching else array.shape
            if tensor.datatype != "BYTES" and array.dtype != numpy_dtype(tensor.datatype):
                raise ClientError(
                    f"{source}: input {tensor.name} is {array.dtype}; {plan.name} takes {tensor.datatype} "
                    f"(save it as {numpy_dtype(tensor.datatype)})"
                )
            if len(dims) != len(tensor.dims) or any(d not in (-1, g) for d, g in zip(tensor.dims, dims)):
                raise ClientError(
                    f"{source}: row {index}: input {tensor.name} has shape {list(dims)}; {plan.name} takes "
                    f"{list(tensor.dims)} per row (-1: any length)"
                )
        why = checks.why_not(row, plan.batching) if checks is not None else None
        if why:
            raise ClientError(f"{source}: row {index}: {why}; fix the data or leave it out to have it made")
    if plan.batching and batch > 1 and len({tuple((n, a.shape) for n, a in r.items()) for r in rows}) > 1:
        raise ClientError(
            f"{source}: its rows have different shapes, and a request of {batch} rows needs one shape: pad them "
            "to one length, or measure batch 1"
        )


def _json_rows(path: Path, plan) -> list[dict]:
    """perf_analyzer's JSON: one row per entry of "data" (a flat list; one stream)."""
    import json

    from tpserve.clients.inputs import from_perf_entry

    try:
        entries = json.loads(path.read_text())["data"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ClientError(f'could not read {path} as perf_analyzer input data ({{"data": [...]}}): {err}') from err
    if entries and isinstance(entries[0], list):
        entries = entries[0]  # several streams: the first, as perf_analyzer's first stream
    required = [t.name for t in plan.inputs if not t.optional]
    rows = []
    for index, entry in enumerate(entries):
        row = from_perf_entry(entry, plan)
        missing = [n for n in required if n not in row]
        if missing:
            raise ClientError(f"{path}: entry {index} has no data for inputs {missing} of {plan.name}")
        rows.append(row)
    return rows
