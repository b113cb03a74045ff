"""How `gpuenv suggest` reads: a stack file for people, JSON for programs.

The text is YAML whose only data is the stack: everything else is a comment, so `gpuenv suggest ... >
group_vars/gpu_hosts.yml` is a ready stack file and check-spec reads it as it is. One stack per GPU
group prints one YAML document per group, `---` between them: one group_vars file each.
"""

from __future__ import annotations

import json
from typing import Any

from gpuenv.compat import CompatData

# The gpu_stack keys in the order docs/stack-file.md gives them.
_ORDER = ("gpu", "os", "driver", "cuda", "cudnn", "python", "torch", "torch_variant")


def _scalar(value: Any) -> str:
    """JSON's quoting is valid YAML and keeps "3.10" and "580" strings (check-spec refuses numbers)."""
    return json.dumps(value)


def stack_yaml(document: dict[str, Any]) -> list[str]:
    stack = document["gpu_stack"]
    lines = ["gpu_stack:"] + [f"  {key}: {_scalar(stack[key])}" for key in _ORDER if key in stack]
    lines += [f"{key}: {_scalar(value)}" for key, value in document.items() if key != "gpu_stack"]
    return lines


def stack_flow(document: dict[str, Any]) -> str:
    """The stack on one line, to copy from a comment."""
    stack = document["gpu_stack"]
    inner = ", ".join(f"{key}: {_scalar(stack[key])}" for key in _ORDER if key in stack)
    extra = "".join(f"  {key}: {_scalar(value)}" for key, value in document.items() if key != "gpu_stack")
    return f"gpu_stack: {{{inner}}}{extra}"


def _gpus(gpus: list[dict[str, Any]]) -> str:
    out = []
    for g in gpus:
        where = f"; {', '.join(g['hosts'])}" if g.get("hosts") else ""
        out.append(f"{g['label']} ({g['cc']}, {g['generation'] or 'unknown generation'}{where})")
    return ", ".join(out)


def _cite(rule: str | None, sources: list[str]) -> str:
    parts = [p for p in (rule, ", ".join(sources)) if p]
    return f" [{'; '.join(parts)}]" if parts else ""


def _stack_block(entry: dict[str, Any], used: set[str]) -> list[str]:
    lines = stack_yaml(entry["document"])
    lines.append("# What bound each choice [rule; sources]:")
    for b in entry["bounds"]:
        used.update(b["sources"])
        lines.append(f"#   {b['choice']} {b['value']}: {b['reason']}{_cite(b['rule'], b['sources'])}")
    if entry["warnings"]:
        lines.append("# Warnings (check-spec prints them too; the stack is accepted):")
        for w in entry["warnings"]:
            used.update(w["sources"])
            lines.append(f"#   [{w['rule']}] {w['message']}")
            lines.append(f"#     fix: {w['fix']}")
    return lines


def text(result: dict[str, Any], data: CompatData) -> str:
    used: set[str] = set()
    verdict = result["verdict"]
    head = ["# gpuenv suggest", f"#   GPUs: {_gpus(result['gpus'])}"]
    if result["constraints"]:
        head.append(f"#   constraints: {' '.join(result['constraints'].values())}")
    head += [f"#   note: {n}" for n in result["notes"]]
    lines = list(head)
    if verdict == "found":
        lines.append("# The newest stack that passes every rule for all of them; gpuenv check-spec accepts this file.")
        lines += _stack_block(result["stacks"][0], used)
    elif verdict == "per-group":
        lines += [
            "# No single stack passes every rule for all of them; one stack per GPU group instead. Save each",
            "# YAML document below as that group's group_vars file (one inventory group per GPU group).",
            "# Why no single stack:",
        ]
        lines += _problems(result["problems"], used)
        for i, entry in enumerate(result["stacks"]):
            lines += [*(["---"] if i else []), f"# --- GPU group {entry['group']}: {_gpus(entry['gpus'])}"]
            lines += _stack_block(entry, used)
    else:
        lines.append("# No stack passes every rule for all of them under these constraints (exit 1). Why:")
        lines += _problems(result["problems"], used)
        for entry in result["stacks"]:  # the groups that do have one
            lines += [f"# GPU group {entry['group']} alone would have: {entry['summary']}"]
    if result["alternatives"]:
        lines.append("#")
        lines.append("# Alternatives:")
        for n, alt in enumerate(result["alternatives"], 1):
            used.update(alt.get("sources", []))
            lines.append(f"#   {n}. {alt['title']}{_cite(None, alt.get('sources', []))}")
            for entry in alt["stacks"]:
                names = ", ".join(g["label"] for g in entry["gpus"])
                label = f"{entry['group']} ({names}): " if entry["group"] else ""
                lines.append(f"#      {label}{entry['trade']}")
                lines.append(f"#        {stack_flow(entry['document'])}")
                for w in entry["warnings"]:
                    lines.append(f"#        warning [{w['rule']}] {w['message']}")
    if used:
        lines.append("#")
        lines.append("# Sources (gpuenv/data/compat.yaml):")
        for key in sorted(used):
            source = data.sources.get(key)
            lines.append(f"#   {key}: {source.url or source.title}" if source else f"#   {key}")
    lines.append(f"# {result['checks']} stacks checked in {result['seconds']:.3f} s; exit {result['exit_code']}")
    return "\n".join(lines) + "\n"


def _problems(problems: list[dict[str, Any]], used: set[str]) -> list[str]:
    out = []
    for p in problems:
        used.update(p["sources"])
        group = f"{p['group']}: " if p.get("group") else ""
        out.append(f"#   {group}{p['reason']}{_cite(p['rule'], p['sources'])}")
    return out


def as_json(result: dict[str, Any], data: CompatData) -> str:
    """The result with each source key spelled out once, as check-spec's JSON gives them."""
    keys: set[str] = set()

    def collect(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("sources"), list):
                keys.update(str(k) for k in value["sources"])
            for item in value.values():
                collect(item)
        elif isinstance(value, list):
            for item in value:
                collect(item)

    collect(result)
    sources = {
        k: {"title": data.sources[k].title, "url": data.sources[k].url} for k in sorted(keys) if k in data.sources
    }
    return json.dumps({**result, "sources": sources}, indent=2)


def invalid(problems: list[str], as_json_output: bool) -> str:
    if as_json_output:
        return json.dumps({"verdict": "invalid", "exit_code": 2, "problems": problems}, indent=2)
    return "\n".join(f"gpuenv suggest: {p}" for p in problems)
