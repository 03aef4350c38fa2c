"""A failed request reaches Locust's failure table with its status and Triton's message, whichever client raised."""

from tritonclient.utils import InferenceServerException

from tpserve.loadtest.locust_suite.failures import RequestFailed


def test_a_grpc_error_made_with_keywords_keeps_its_status_and_message():
    error = InferenceServerException(msg="Request for unknown model: 'm' has no available versions", status="NOT_FOUND")
    assert repr(error) == "InferenceServerException()"  # what Locust grouped by before
    assert str(RequestFailed.of(error)) == "NOT_FOUND: Request for unknown model: 'm' has no available versions"


def test_any_other_error_keeps_its_type_and_text_on_one_bounded_line():
    failed = RequestFailed.of(ConnectionError("reset\n   by peer " + "x" * 500))
    assert str(failed).startswith("ConnectionError: reset by peer x") and len(str(failed)) == 300
