"""The C HTTP request checks (tpserve/server/triton/front/http_checks.c) as the tests call them: the sanitized fuzzer's
`serve` mode, one verdict per request over a pipe (tests/native/fuzz_checks.c says the format)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Verdict:
    status: int  # 0: passes
    reading: str  # of an inference request that passes: "name:DATATYPE:[dims]:source;..."
    why: str

    def view(self) -> list[str]:
        """The reading as the differential test compares it: name:DATATYPE:[dims] per input, sorted."""
        return sorted(":".join(part.split(":")[:3]) for part in self.reading.split(";") if part)


class CChecks:
    """A running fuzz_checks serving verdicts under the rules of rules_json (request_checks.checks_json)."""

    def __init__(self, folder: Path, rules_json: str):
        from tests.native.test_native_fuzz import build_fuzzer

        binary = build_fuzzer(folder / "fuzz_checks", "checks")
        rules = folder / "rules.json"
        rules.write_text(rules_json, encoding="utf-8")
        self.process = subprocess.Popen(
            [str(binary), "serve", str(rules)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def verdict(self, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> Verdict:
        from benchmarks.checks_cost import check_record

        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(check_record(method, path, body, headers))
        self.process.stdin.flush()
        line = self.process.stdout.readline().decode("utf-8", "replace").rstrip("\n")
        if not line:
            raise AssertionError(f"the checks stopped answering (rc {self.process.poll()})")
        status, reading, why = line.split("\t", 2)
        return Verdict(int(status), reading, why)

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        rc = self.process.wait(timeout=30)
        assert rc == 0, f"the checks ended with {rc} (a sanitizer finding?)"
