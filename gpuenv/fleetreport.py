"""`gpuenv report DIR`: the fleet at a glance, from the `gpuenv verify --json` files the gpu_verify
role fetched (one per host). A row per host, a column per check group (its worst status), the
versions found against the declared ones with drift marked, and every failure with its fix hint.
Markdown for terminals and pull requests; one self-contained HTML page for people."""

from __future__ import annotations

import datetime
import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuenv.verify import plan

# The columns, in the order verify declares its checks (gpuenv.verify.plan), then drift's; a
# prefix no declared check has (a newer verify on a host, the stand-ins' verify.run) gets a column
# of its own after these (_groups).
GROUPS = [*dict.fromkeys(spec.id.split(".")[0] for spec in plan.CHECKS), "drift"]
_GROUP_LABEL = {
    "driver": "driver",
    "torch": "torch",
    "gpu": "GPU",
    "cudnn": "cuDNN",
    "cuda_tree": "CUDA tree",
    "host": "OS",
    "dist": "distributed",
    "drift": "drift",
}
_RANK = {"fail": 3, "warn": 2, "pass": 1, "skip": 0}
_MARK = {"fail": "FAIL", "warn": "warn", "pass": "ok", "skip": "skip", "": "-"}
_COLOUR = {"fail": "#f8d7da", "warn": "#fff3cd", "pass": "#d1e7dd", "skip": "#e9ecef", "": "#ffffff"}
# The versions a row shows: (label, check id, key in observed/expected or None for the value itself).
_VERSIONS = [
    ("driver version", "driver.userspace", None),
    ("torch version", "torch.build", "torch"),
    ("torch's CUDA", "torch.build", "cuda"),
    ("environment", "torch.build", "env"),
    ("companions", "torch.companions", "packages"),
    ("torch's cuDNN", "cudnn.version", None),
    ("toolkit", "cuda_tree.toolkit", None),
    ("system cuDNN", "cuda_tree.cudnn", None),
]


class ReportError(ValueError):
    """No readable verify reports; the message says where gpuenv looked."""


@dataclass
class Host:
    name: str
    exit_code: int
    checks: dict[str, dict[str, Any]]
    generated: str = ""
    stale: bool = False
    problem: str = ""  # why the host's report could not be read as one: the host counts as failed

    def mark(self) -> str:
        """What the host column says beside the name."""
        if self.problem:
            return f"FAILED (its report cannot be read: {self.problem})"
        if self.stale:
            return f"STALE (report from {self.generated or 'an older gpuenv'}, not from this run)"
        return {0: "", 1: "FAILED", 2: "FAILED (verify could not check)"}.get(self.exit_code, "FAILED")

    def group_status(self, group: str) -> str:
        statuses = [c["status"] for cid, c in self.checks.items() if cid.split(".")[0] == group]
        return max(statuses, key=lambda s: _RANK[s]) if statuses else ""

    def version(self, check_id: str, key: str | None) -> tuple[str, str, bool]:
        """(found, declared, drift) for one version column."""
        check = self.checks.get(check_id)
        if not check or check["status"] == "skip":  # a skip observed nothing but its reason
            return "", "", False
        found, declared = check.get("observed"), check.get("expected")
        if key is not None:
            found = found.get(key) if isinstance(found, dict) else None
            declared = declared.get(key) if isinstance(declared, dict) else None
        found_s = "" if found is None else str(found)
        declared_s = "" if declared is None or declared == "unset" else str(declared)
        return found_s, declared_s, check["status"] == "fail" and bool(declared_s)

    def failures(self) -> list[dict[str, Any]]:
        if self.problem:
            hint = "run playbooks/site.yml (or verify.yml) against the host again to write a new one"
            return [
                {
                    "id": "report",
                    "status": "fail",
                    "summary": f"its report cannot be read: {self.problem}",
                    "hint": hint,
                }
            ]
        return [c for c in self.checks.values() if c["status"] in ("fail", "warn")]


def _when(text: str) -> datetime.datetime:
    moment = datetime.datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)  # noqa: UP017


def _before(generated: str, since: datetime.datetime) -> bool:
    """Whether a report's time is before since; a missing or unreadable time counts as before."""
    try:
        return not generated or _when(generated) < since
    except ValueError:
        return True


def parse_since(text: str) -> datetime.datetime:
    try:
        return _when(text)
    except ValueError:
        raise ReportError(f"--since {text[:60]!r} is not an ISO 8601 time such as 2026-12-01T22:48:00+00:00") from None


def _checks(data: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], str]:
    """A report's checks by id, and what makes the report unreadable ("" when nothing does): a host
    whose report is malformed shows as FAILED with the reason, never as passed or as a crash."""
    name = data.get("host")
    if not isinstance(name, str) or not name:
        return {}, "it names no host"
    code = data.get("exit_code")
    if isinstance(code, bool) or not isinstance(code, int) or code not in (0, 1, 2):
        return {}, f"exit_code {str(code)[:40]!r} is not 0, 1 or 2"
    raw = data.get("checks")
    if not isinstance(raw, list):
        return {}, "its checks are not a list"
    checks: dict[str, dict[str, Any]] = {}
    for entry in raw:
        cid = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(cid, str) or not cid:
            return {}, f"a check's id is {str(cid)[:40]!r}, not a name"
        if entry.get("status") not in _RANK:
            return {}, f"check {cid[:60]} has status {str(entry.get('status'))[:40]!r}, not pass, warn, fail or skip"
        checks[cid] = {**entry, "summary": str(entry.get("summary", "")), "hint": str(entry.get("hint") or "")}
    return checks, ""


# The last playbook run that wrote reports into a directory (playbooks/report-fleet.yml writes it):
# `gpuenv report DIR` run later, by hand or by scripts/demo, counts that run's hosts only, and a
# report another run left there (a benchmark's fan-out, a host since taken out of the inventory)
# is STALE, never passed. Not *.json: it is not a host's report.
LAST_RUN = ".last-run"


def last_run(directory: Path) -> str | None:
    """The id in DIR/.last-run, or None where there is none (reports from before runs had ids)."""
    try:
        data = json.loads((directory / LAST_RUN).read_text())
    except (OSError, ValueError):
        return None
    run = data.get("run") if isinstance(data, dict) else None
    return run if isinstance(run, str) and run else None


def load(directory: Path, since: datetime.datetime | None = None, run: str | None = None) -> list[Host]:
    """The reports in directory. A report made before since, or (with run, the playbooks' run id)
    belonging to another run, is stale: that host was not verified in this run."""
    files = sorted(directory.glob("*.json"))
    hosts = []
    for path in files:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ReportError(f"{path}: not a readable gpuenv verify report ({exc})") from exc
        if not isinstance(data, dict):
            raise ReportError(f"{path}: not a gpuenv verify report (a JSON {type(data).__name__}, not an object)")
        if data.get("schema_version") not in (1, 2):
            version = data.get("schema_version")
            shown = version if isinstance(version, int) else repr(str(version)[:40])
            raise ReportError(f"{path}: schema_version {shown}, this gpuenv reads 1 and 2")
        generated = str(data.get("generated") or "")
        checks, problem = _checks(data)
        name = data.get("host")
        hosts.append(
            Host(
                name if isinstance(name, str) and name else path.stem,
                data["exit_code"] if not problem else 2,
                checks,
                generated=generated,
                # Version 1 reports carry no time and no run: older than any run that asks.
                stale=(since is not None and _before(generated, since)) or (run is not None and data.get("run") != run),
                problem=problem,
            )
        )
    if not hosts:
        raise ReportError(f"no gpuenv verify reports (*.json) in {directory}; run playbooks/site.yml or verify.yml")
    return hosts


def _groups(hosts: list[Host]) -> list[str]:
    """The columns: the known groups in their order, the drift column only in a drift report
    (playbooks/drift.yml), then every other prefix a report's check ids use (a new check gets its
    column without an edit here)."""
    found = {cid.split(".")[0] for h in hosts for cid in h.checks}
    known = [g for g in GROUPS if g != "drift" or "drift" in found]
    return known + sorted(found - set(GROUPS))


def _column(group: str) -> str:
    return _GROUP_LABEL.get(group, group.replace("_", " "))


def markdown(hosts: list[Host]) -> str:
    groups = _groups(hosts)
    lines = ["| host | " + " | ".join(_column(g) for g in groups) + " | " + " | ".join(v[0] for v in _VERSIONS) + " |"]
    lines.append("|" + "---|" * (1 + len(groups) + len(_VERSIONS)))
    for h in hosts:
        cells = [h.name + (f" **{h.mark()}**" if h.mark() else "")]
        cells += [_MARK[h.group_status(g)] for g in groups]
        for _label, cid, key in _VERSIONS:
            found, declared, drift = h.version(cid, key)
            cells.append(f"**{found} (declared {declared})**" if drift else found or "-")
        lines.append("| " + " | ".join(cells) + " |")
    problems = [(h.name, c) for h in hosts for c in h.failures()]
    if problems:
        lines += ["", "Failures and warnings:", ""]
        for name, c in problems:
            lines.append(
                f"- {name} `{c['id']}` {c['status']}: {c['summary']}" + (f". Fix: {c['hint']}" if c["hint"] else "")
            )
    ok = sum(h.exit_code == 0 and not h.stale for h in hosts)
    lines += ["", f"{ok} of {len(hosts)} hosts passed every check (skips are checks that could not run here)."]
    return "\n".join(lines) + "\n"


def html_page(hosts: list[Host]) -> str:
    e = html.escape
    groups = _groups(hosts)
    head = "".join(f"<th>{e(_column(g))}</th>" for g in groups) + "".join(f"<th>{e(v[0])}</th>" for v in _VERSIONS)
    rows = []
    for h in hosts:
        mark = f" <span class=bad>{e(h.mark().lower())}</span>" if h.mark() else ""
        cells = [f'<th class="host">{e(h.name)}{mark}</th>']
        for g in groups:
            s = h.group_status(g)
            cells.append(f'<td style="background:{_COLOUR[s]}" title="{e(g)}: {e(s or "no check")}">{_MARK[s]}</td>')
        for _label, cid, key in _VERSIONS:
            found, declared, drift = h.version(cid, key)
            text = e(found or "-") + (f"<br><small>declared {e(declared)}</small>" if drift else "")
            cells.append(f'<td class="{"drift" if drift else ""}">{text}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    problems = [
        f"<li><b>{e(h.name)}</b> <code>{e(c['id'])}</code> {e(c['status'])}: {e(c['summary'])}"
        + (f"<br><i>Fix:</i> {e(c['hint'])}" if c["hint"] else "")
        + "</li>"
        for h in hosts
        for c in h.failures()
    ]
    ok = sum(h.exit_code == 0 and not h.stale for h in hosts)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gpuenv fleet report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #adb5bd; padding: 0.3em 0.6em; text-align: center; }}
th.host {{ text-align: left; }}
td.drift {{ background: #f8d7da; font-weight: bold; }}
.bad {{ color: #b02a37; font-size: 0.8em; }}
</style></head>
<body>
<h1>gpuenv fleet report</h1>
<p id="summary">{ok} of {len(hosts)} hosts passed every check. Colours: green pass, yellow warning, red failure,
grey skipped (could not run on that host, e.g. no GPU).</p>
<table id="fleet"><tr><th>host</th>{head}</tr>
{"".join(rows)}
</table>
<h2>Failures and warnings</h2>
<ul id="problems">{"".join(problems) or "<li>none</li>"}</ul>
</body></html>
"""
