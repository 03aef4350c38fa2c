"""A server's record in its state folder: private, written whole, read back as written."""

import os
import stat

import pytest

from tpserve.common import endpoints
from tpserve.common.errors import ServerError


def _state(pid: int) -> endpoints.ServerState:
    return endpoints.ServerState(
        pid=pid,
        host="127.0.0.1",
        http_port=1,
        grpc_port=2,
        metrics_port=3,
        repo="/repo",
        log="/log",
        admin_key_file="/key",
    )


def test_the_record_is_private_and_replaced_whole(tmp_path):
    endpoints.write_state(tmp_path, _state(1))
    endpoints.write_state(tmp_path, _state(2))  # a restart rewrites it
    path = tmp_path / endpoints.STATE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert endpoints.read_state(tmp_path).pid == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [endpoints.STATE]  # no partial file left


def test_no_record_is_a_clear_error(tmp_path):
    with pytest.raises(ServerError, match="no server state"):
        endpoints.read_state(tmp_path)
