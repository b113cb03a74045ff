"""How a check result reads: for people (text) and for programs (a JSON-able dict)."""

from __future__ import annotations

from typing import Any

from gpuenv.compat import CompatData
from gpuenv.rules import EXIT_INVALID, Finding, Report


def _sources(finding: Finding, data: CompatData) -> list[dict[str, Any]]:
    out = []
    for key in finding.sources:
        source = data.sources.get(key)
        out.append({"key": key, "title": source.title if source else key, "url": source.url if source else None})
    return out


def finding_dict(f: Finding, sources: list[Any] | None = None) -> dict[str, Any]:
    """A finding as JSON: its sources as given (their titles and URLs), else their keys."""
    return {
        "rule": f.rule,
        "severity": f.severity,
        "message": f.message,
        "why": f.why,
        "fix": f.fix,
        "sources": list(f.sources) if sources is None else sources,
    }


def to_dict(report: Report, data: CompatData, origin: str | None = None) -> dict[str, Any]:
    def finding(f: Finding) -> dict[str, Any]:
        return finding_dict(f, _sources(f, data))

    return {
        "file": origin,
        "verdict": report.verdict,
        "exit_code": report.exit_code,
        "ok": not report.errors,
        "stack": report.resolved,
        "errors": [finding(f) for f in report.errors],
        "warnings": [finding(f) for f in report.warnings],
    }


def invalid_dict(problems: list[str], origin: str | None = None) -> dict[str, Any]:
    return {
        "file": origin,
        "verdict": "invalid",
        "exit_code": EXIT_INVALID,
        "ok": False,
        "stack": None,
        "errors": [
            {"rule": "schema", "severity": "error", "message": p, "why": "", "fix": "", "sources": []} for p in problems
        ],
        "warnings": [],
    }


def describe_stack(resolved: dict[str, Any]) -> str:
    torch = resolved["torch"] + (f"+{resolved['torch_variant']}" if resolved.get("torch_variant") else "")
    parts = [
        f"driver {resolved['driver']}",
        "no CUDA toolkit" if resolved["cuda"] == "none" else f"CUDA {resolved['cuda']}",
        f"cuDNN {resolved['cudnn']}",
        f"Python {resolved['python']}",
        f"torch {torch}",
    ]
    if resolved.get("gpus"):
        parts.append(
            "GPU "
            + ", ".join(g["label"] if g["label"] == g["cc"] else f"{g['label']} ({g['cc']})" for g in resolved["gpus"])
        )
    if resolved.get("os"):
        parts.append(str(resolved["os"]))
    if resolved.get("profile"):
        parts.append(f"profile {resolved['profile']}")
    return ", ".join(parts)


def format_text(result: dict[str, Any], verbose_sources: bool = True) -> str:
    """The human report of a to_dict()/invalid_dict() result."""
    lines = []
    if result.get("file"):
        lines.append(f"stack file: {result['file']}")
    if result["verdict"] == "invalid":
        lines.append("the stack file cannot be checked:")
        lines.extend(f"  - {e['message']}" for e in result["errors"])
        lines.append("verdict: invalid (exit 2)")
        return "\n".join(lines)
    lines.append(f"stack: {describe_stack(result['stack'])}")
    for entry in result["errors"] + result["warnings"]:
        lines.append(f"{entry['severity'].upper()} [{entry['rule']}] {entry['message']}")
        lines.append(f"  why: {entry['why']}")
        lines.append(f"  fix: {entry['fix']}")
        if verbose_sources:
            for src in entry["sources"]:
                lines.append(f"  source: {src['title']}" + (f" <{src['url']}>" if src["url"] else ""))
    n_err, n_warn = len(result["errors"]), len(result["warnings"])
    lines.append(
        f"verdict: {result['verdict']} ({n_err} error{'s' * (n_err != 1)}, "
        f"{n_warn} warning{'s' * (n_warn != 1)}; exit {result['exit_code']})"
    )
    return "\n".join(lines)
