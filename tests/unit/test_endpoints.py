"""Endpoint's headers for a call: a copy, so that what one client writes into it reaches no other call."""

import pytest

from tpserve.clients.connection import endpoint, read_key_file
from tpserve.common.endpoints import Endpoint
from tpserve.common.errors import ClientError


def test_each_call_gets_its_own_copy_of_the_headers():
    ep = Endpoint("http", "127.0.0.1:1", headers={"x-traffic-replay": "1"})
    given = ep.request_headers()
    given["Inference-Header-Content-Length"] = 42  # what tritonclient.http writes into the dict it is given
    assert ep.headers == {"x-traffic-replay": "1"} and ep.request_headers() == {"x-traffic-replay": "1"}
    assert Endpoint("grpc", "127.0.0.1:1").request_headers() is None


def test_a_key_file_gives_the_restricted_header_for_each_protocol(tmp_path):
    plain, named = tmp_path / "key", tmp_path / "named"
    plain.write_text("s3cret\n")
    named.write_text("Stats-Key: s3cret\n")
    nowhere = tmp_path / "no-state"
    assert endpoint("http", "h:1", nowhere, key_file=plain).admin_headers == {"admin-key": "s3cret"}
    assert endpoint("grpc", "h:1", nowhere, key_file=plain).admin_headers == {
        "triton-grpc-protocol-admin-key": "s3cret"
    }
    assert endpoint("http", "h:1", nowhere, key_file=named).admin_headers == {"stats-key": "s3cret"}
    assert endpoint("grpc", "h:1", nowhere, key_file=named).admin_headers == {
        "triton-grpc-protocol-stats-key": "s3cret"
    }


def test_a_key_file_that_is_empty_or_several_lines_is_refused(tmp_path):
    for text in ("", "admin-key:  \n", "one\ntwo\n"):
        (tmp_path / "key").write_text(text)
        with pytest.raises(ClientError, match="expected one line"):
            read_key_file(tmp_path / "key", "http")


def test_free_ports_never_hand_out_a_port_already_promised():
    """A start gives tritonserver free internal ports beside the metrics and health ports it was given, which nothing
    holds yet: a free port equal to one of them made tritonserver refuse to start (issue 84)."""
    from tpserve.common.endpoints import free_ports

    promised = set(free_ports(64))  # the ports the OS would hand out next are among these, likely
    for _ in range(20):
        got = free_ports(3, avoid=promised)
        assert len(set(got)) == 3 and not set(got) & promised
