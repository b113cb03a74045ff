"""The report model: a check's result, a host's report, and the exit-code rule.

One model for everyone who reports on a host: gpuenv verify's checks, drift's `drift.*` checks
(gpuenv.drift), and the playbooks' stand-in reports for a host verify could not check
(plugins/filter/gpuenv_fleet.py). The JSON is gpuenv/data/verify.schema.json; the fleet report
(gpuenv.fleetreport) reads it. Standard library only: verify carries this file to the hosts.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

# 2: the report says when it was made (generated) and which stack it checked (stack_id), and a run
# that could not check (exit 2) still writes one, with a failing verify.run check.
SCHEMA_VERSION = 2
PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"
STATUSES = (PASS, FAIL, WARN, SKIP)
# The check of a run that could not check the host at all; its failure makes the exit code 2.
RUN_CHECK = "verify.run"


@dataclass
class Check:
    """One check's result: no check passes without having observed what it claims, and a failure
    carries the hint that says how to fix it."""

    id: str
    status: str
    summary: str
    observed: Any = None
    expected: Any = None
    hint: str | None = None
    seconds: float = 0.0

    @classmethod
    def judged(  # noqa: PLR0917 - the fields in the report's order
        cls, check_id: str, ok: bool, summary: str, observed: Any, expected: Any, hint: str
    ) -> Check:
        """Pass when ok; fail with the hint otherwise (a passing check carries no hint)."""
        return cls(check_id, PASS if ok else FAIL, summary, observed, expected, None if ok else hint)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def exit_code(checks: Iterable[Mapping[str, Any]]) -> int:
    """The exit code of a report's checks (as dicts): 0 every check passed (warnings and skips
    allowed), 1 a check failed, 2 verify could not check (its verify.run check failed)."""
    failed = {c.get("id") for c in checks if c.get("status") == FAIL}
    if RUN_CHECK in failed:
        return 2
    return 1 if failed else 0


def counts(checks: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    statuses = [c.get("status") for c in checks]
    return {s: statuses.count(s) for s in STATUSES}


def stack_id(expect: Mapping[str, Any]) -> str | None:
    """Which stack a report checked: a hash of the expectations it was given."""
    if not expect:
        return None
    return hashlib.sha256(json.dumps(expect, sort_keys=True, default=str).encode()).hexdigest()[:12]


def now() -> str:
    # timezone.utc, not datetime.UTC (3.11): hosts run verify with the environment's Python, 3.8 and up
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")  # noqa: UP017


def to_report(
    checks: list[Check], host: str, *, generated: str | None = None, stack: str | None = None, run: str | None = None
) -> dict[str, Any]:
    """The JSON report of one host's checks."""
    found = [c.as_dict() for c in checks]
    return {
        "schema_version": SCHEMA_VERSION,
        "host": host,
        "generated": generated or now(),
        "stack_id": stack,
        "run": run,
        "exit_code": exit_code(found),
        "counts": counts(found),
        "checks": found,
    }


def could_not_run(summary: str, error: str, hint: str) -> list[Check]:
    """The checks of a run that could not check the host: one failing verify.run check that
    carries the error, so that the host shows as failed, never as missing or as its old report."""
    return [Check(RUN_CHECK, FAIL, summary, observed=error[-2000:], expected="verify runs its checks", hint=hint)]


def failed_report(  # noqa: PLR0917 - the playbooks' filter passes these by position
    host: str, summary: str, error: str, hint: str, expect: Mapping[str, Any] | None = None, run: str | None = None
) -> dict[str, Any]:
    """The JSON report of a run that could not check (for the playbooks' stand-ins too)."""
    return to_report(could_not_run(summary, error, hint), host, stack=stack_id(expect or {}), run=run)


def from_command(  # noqa: PLR0917 - the playbooks' filter passes these by position
    result: Mapping[str, Any],
    host: str,
    summary: str,
    hint: str,
    expect: Mapping[str, Any] | None = None,
    run: str | None = None,
) -> dict[str, Any]:
    """The report a `gpuenv-verify --json -` command printed (an Ansible command result: rc,
    stdout, stderr, msg), or, when it printed none (the command is missing, Python broke), a
    failing report whose error is the command's exit status and its stderr."""
    stdout = str(result.get("stdout") or "")
    if result.get("rc") in (0, 1, 2) and stdout.lstrip().startswith("{"):
        try:
            printed = json.loads(stdout)
        except ValueError:
            printed = None
        if isinstance(printed, dict) and isinstance(printed.get("checks"), list):
            return printed
    said = result.get("stderr") or result.get("msg") or ""
    return failed_report(host, summary, f"rc {result.get('rc', 'none')}: {said}"[-1500:], hint, expect, run)
