"""What a run measures (clients/served.py): the models given, each one's spec read from the repository's
manifest where it is ours, and none for a server we did not make."""

import json

from tpserve.builders.spec import zoo
from tpserve.clients.served import Served, read_served
from tpserve.common.endpoints import Endpoint


def test_given_models_carry_their_specs_from_our_manifest_and_none_elsewhere(tmp_path):
    spec = zoo.get_spec("digits_cnn")
    manifest = {"format_version": 2, "models": {"digits_cnn": {"spec": spec.to_dict()}, "other": {}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    served = read_served(Endpoint("grpc", "127.0.0.1:1", repo=tmp_path), ("digits_cnn", "other", "unknown"))
    assert served.names == ("digits_cnn", "other", "unknown") and served.source == "given"
    assert served.spec("digits_cnn") == spec
    assert served.spec("other") is None and served.spec("unknown") is None and served.not_ready == {}
    foreign = read_served(Endpoint("grpc", "127.0.0.1:1"), ("digits_cnn",))  # a server we did not make
    assert foreign.spec("digits_cnn") is None
    assert Served(("x",)).spec("x") is None
