"""ONNX Runtime's threads per CPU instance (triton_models/python_backend/cpu_threads.py): the cores shared among a
model's
instances, so two instances do not each take every core."""

import pytest

from tpserve.triton_models.python_backend.cpu_threads import intra_op_threads


def _config(*counts):
    return {"instance_group": [{"count": c, "kind": "KIND_CPU"} for c in counts]}


@pytest.mark.parametrize(
    "asked, config, cores, threads",
    [
        ("3", _config(2), 16, 3),  # a positive parameter is taken as it is
        ("0", _config(1), 16, 0),  # one instance: ONNX Runtime's own default
        ("0", {}, 16, 0),  # no instance group: Triton's one instance
        ("0", _config(2), 2, 1),
        ("0", _config(2), 16, 8),
        ("0", _config(1, 2), 16, 5),  # every group's instances share the cores
        ("0", _config(4), 2, 1),  # at least one thread each
        (0, _config(2), 7, 3),
    ],
)
def test_cores_are_shared_among_a_models_instances(asked, config, cores, threads):
    assert intra_op_threads(asked, config, cores) == threads


def test_without_a_core_count_it_reads_the_cores_this_process_may_use():
    assert intra_op_threads("0", _config(2)) >= 1
