"""How a run's checks are written: one line each for people, the JSON report (gpuenv.verify.model),
JUnit XML for CI, and the Prometheus text format for node_exporter's textfile collector."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
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


class OutputError(Exception):
    """A report file cannot be written where asked: one line, exit 2."""


def path_problem(option: str, path: str) -> str | None:
    """Why a report cannot go to PATH, checked before any check runs. verify may run as root into
    a directory others can write: a link there would be followed, and a device (/dev/full) or a
    directory given as the path would end in a traceback."""
    target = Path(path)
    if target.is_symlink():
        return (
            f"{option} {path} is a symbolic link; give the path of a regular file (verify never writes through a link)"
        )
    if target.exists() and not target.is_file():
        return f"{option} {path} is not a regular file; give the path of a file to write"
    if not target.parent.is_dir():
        return f"{option} {path}: the directory {target.parent} does not exist; create it first"
    return None


def atomic_write(path: str, text: str) -> None:
    """TEXT into PATH through a new file in the same directory, renamed over it: a reader (the
    textfile collector, the fetch) never sees half a report, and a link planted at PATH after
    the check is replaced, not followed."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None


def write(  # noqa: PLR0917 - the report, its checks, and where each format goes
    report: dict[str, Any],
    checks: list[Check],
    host: str,
    json_out: str | None,
    junit: str | None,
    prom: str | None,
) -> None:
    """The files asked for; with json_out "-" the report is the standard output. OutputError
    says which could not be written."""
    if json_out == "-":
        print(json.dumps(report, indent=2, default=str))
    elif json_out:
        atomic_write(json_out, json.dumps(report, indent=2, default=str) + "\n")
    if junit:
        atomic_write(junit, to_junit(checks, host) + "\n")
    if prom:
        atomic_write(prom, to_prometheus(checks, host))
