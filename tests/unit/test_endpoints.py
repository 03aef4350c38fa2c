"""Endpoint's headers for a call: a copy, so that what one client writes into it reaches no other call."""

from tpserve.common.endpoints import Endpoint


def test_each_call_gets_its_own_copy_of_the_headers():
    ep = Endpoint("http", "127.0.0.1:1", headers={"x-traffic-replay": "1"})
    given = ep.request_headers()
    given["Inference-Header-Content-Length"] = 42  # what tritonclient.http writes into the dict it is given
    assert ep.headers == {"x-traffic-replay": "1"} and ep.request_headers() == {"x-traffic-replay": "1"}
    assert Endpoint("grpc", "127.0.0.1:1").request_headers() is None
