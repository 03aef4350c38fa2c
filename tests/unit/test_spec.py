import dataclasses

import pytest

from tpserve.builders.spec import zoo
from tpserve.builders.spec.model_spec import ModelSpec, TensorSpec
from tpserve.common.errors import SpecError


@pytest.mark.parametrize("name", zoo.available())
def test_zoo_specs_are_valid_and_round_trip(name):
    spec = zoo.get_spec(name)
    again = ModelSpec.from_dict(spec.to_dict())
    assert again == spec
    assert again.fingerprint() == spec.fingerprint()


def test_fingerprint_changes_with_any_field():
    spec = zoo.get_spec("digits_cnn")
    changed = dataclasses.replace(spec, max_batch_size=spec.max_batch_size * 2, validation_batch_sizes=(1,))
    assert changed.fingerprint() != spec.fingerprint()


def test_unknown_zoo_model_names_the_available_ones():
    with pytest.raises(SpecError, match="not in the zoo; available: digits_cnn"):
        zoo.get_spec("resnet9000")


def test_resnet_labels_are_the_imagenet_classes():
    spec = zoo.get_spec("resnet50")
    assert len(spec.labels) == 1000 and spec.labels[0] == "tench"


def test_unknown_weights_name_is_refused_before_any_download():
    spec = zoo.get_spec("resnet18", weights="IMAGENET2")
    with pytest.raises(SpecError, match="weights 'IMAGENET2' unknown"):
        zoo.build_module(spec)


def test_image_format_needs_three_dims():
    with pytest.raises(SpecError, match="needs 3 per-sample dims"):
        TensorSpec("x", "FP32", (8, 8), image_format="NCHW")


def test_dynamic_axes_are_allowed():
    assert TensorSpec("ids", "INT64", (-1,)).dims == (-1,)


def test_the_build_log_names_where_the_weights_come_from():
    import dataclasses

    from tpserve.builders.build import weights_source
    from tpserve.builders.spec import zoo

    resnet = zoo.get_spec("resnet18")
    assert weights_source(resnet) == "random"
    assert weights_source(zoo.get_spec("digits_cnn")).startswith("trained here")
    user = dataclasses.replace(resnet, builder="user_factory", builder_args={"factory": "m:f", "checkpoint": "w.pt"})
    assert weights_source(user) == "checkpoint w.pt"
