"""A server held in the foreground (tpserve/server/foreground.py): the state folder's logs reach stdout once each,
line by line with their names, from the start again after a rotation; the supervisors' pids come from their
records."""

import json
import os

from tpserve.server import foreground


def test_logs_are_copied_once_whole_lines_only_and_again_from_the_start_after_a_rotation(tmp_path, capsys):
    (tmp_path / "replica-0").mkdir()
    log = tmp_path / "replica-0" / "supervisor.log"
    log.write_text("started\nhalf a li")
    logs = foreground._Logs(tmp_path)
    logs.copy_new()
    assert capsys.readouterr().out == "replica-0/supervisor.log: started\n"
    with open(log, "a") as handle:
        handle.write("ne\n")
    logs.copy_new()
    logs.copy_new()
    assert capsys.readouterr().out == "replica-0/supervisor.log: half a line\n"
    log.write_text("new\n")  # rotated: shorter than what was read
    logs.copy_new()
    assert capsys.readouterr().out == "replica-0/supervisor.log: new\n"


def test_the_supervisors_pids_come_from_their_records_and_a_broken_one_is_skipped(tmp_path):
    (tmp_path / "replica-0").mkdir()
    (tmp_path / "replica-1").mkdir()
    (tmp_path / "replica-0" / "supervisor.json").write_text(json.dumps({"pid": os.getpid(), "ready": True}))
    (tmp_path / "replica-1" / "supervisor.json").write_text("{")
    assert foreground.supervisor_pids(tmp_path) == [os.getpid()]
