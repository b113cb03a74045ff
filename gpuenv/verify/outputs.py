"""How a run's checks are written: one line each for people, the JSON report (gpuenv.verify.model),
JUnit XML for CI, and the Prometheus text format for node_exporter's textfile collector."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, TextIO

from gpuenv.verify.model import FAIL, RUN_CHECK, SKIP, STATUSES, WARN, Check, exit_code


def to_junit(checks: list[Check], host: str) -> str:
    suite = ET.Element(
        "testsuite",
        name=f"gpuenv verify {host}",
        tests=str(len(checks)),
        failures=str(sum(c.status == FAIL for c in checks)),
        skipped=str(sum(c.status == SKIP for c in checks)),
    )
    for c in checks:
        case = ET.SubElement(suite, "testcase", classname=f"gpuenv.{host}", name=c.id, time=f"{c.seconds:.3f}")
        if c.status == FAIL:
            ET.SubElement(case, "failure", message=c.summary).text = json.dumps(
                {"observed": c.observed, "expected": c.expected, "hint": c.hint}, default=str
            )
        elif c.status == SKIP:
            ET.SubElement(case, "skipped", message=c.summary)
        elif c.status == WARN:
            ET.SubElement(case, "system-out").text = f"warning: {c.summary}; {c.hint or ''}"
    return ET.tostring(suite, encoding="unicode")


def to_prometheus(checks: list[Check], host: str) -> str:
    """node_exporter textfile collector format: one gauge per check and status."""
    lines = [
        "# HELP gpuenv_verify_check 1 for the status each gpuenv verify check reported.",
        "# TYPE gpuenv_verify_check gauge",
    ]
    for c in checks:
        for status in STATUSES:
            lines.append(
                f'gpuenv_verify_check{{host="{host}",check="{c.id}",status="{status}"}} '
                f"{1 if c.status == status else 0}"
            )
    lines += [
        "# HELP gpuenv_verify_exit_code The exit code of the last gpuenv verify run.",
        "# TYPE gpuenv_verify_exit_code gauge",
        f'gpuenv_verify_exit_code{{host="{host}"}} {exit_code(c.as_dict() for c in checks)}',
    ]
    return "\n".join(lines) + "\n"


def print_lines(report: dict[str, Any], checks: list[Check], out: TextIO) -> None:
    """One line per check, with the fix under a failure (and the error of a run that could not check)."""
    for c in checks:
        line = f"{c.status.upper():5} {c.id:24} {c.summary}" + (f"\n      fix: {c.hint}" if c.status == FAIL else "")
        if c.id == RUN_CHECK and c.status == FAIL:
            line += f"\n      error: {c.observed}"
        print(line, file=out)
    print(f"{report['counts']}; exit {report['exit_code']}", file=out)


def write(  # noqa: PLR0917 - the report, its checks, and where each format goes
    report: dict[str, Any],
    checks: list[Check],
    host: str,
    json_out: str | None,
    junit: str | None,
    prom: str | None,
) -> None:
    """The files asked for; with json_out "-" the report is the standard output."""
    if json_out == "-":
        print(json.dumps(report, indent=2, default=str))
    elif json_out:
        Path(json_out).write_text(json.dumps(report, indent=2, default=str) + "\n")
    if junit:
        Path(junit).write_text(to_junit(checks, host) + "\n")
    if prom:
        Path(prom).write_text(to_prometheus(checks, host))
