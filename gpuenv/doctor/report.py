"""How a diagnosis reads: text for people (what the host has, then the findings with where, why, fix and
source, then the stack that would replace it), JSON for programs (the same, with every source key's
title and URL)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from gpuenv.compat import CompatData
from gpuenv.doctor.advice import Advice
from gpuenv.doctor.run import Diagnosis
from gpuenv.report import finding_dict
from gpuenv.suggest.output import stack_flow, stack_yaml
from gpuenv.verify.model import counts

SCHEMA = "gpuenv-doctor/1"


def _verify_line(report: dict[str, Any] | None) -> str:
    if report is None:
        return "verify not run"
    c = report.get("counts") or counts(report.get("checks", []))
    return f"verify exit {report.get('exit_code')} ({c.get('pass', 0)} pass, {c.get('fail', 0)} fail, " \
        f"{c.get('warn', 0)} warn, {c.get('skip', 0)} skip)"  # fmt: skip


def _inventory(d: Diagnosis) -> list[str]:
    drv = d.driver
    lines = ["Driver"]
    lines.append(
        f"  loaded module   {f'{drv.kernel} ({drv.flavor})' if drv.kernel else 'none (no /proc/driver/nvidia/version)'}"
    )
    installed = drv.installed
    lines.append(f"  user space      {f'{installed[0]} ({installed[1]})' if installed else 'none found'}")
    if drv.smi and not drv.smi_version:
        lines.append(f"  nvidia-smi      {drv.smi_error}")
    if drv.packages:
        lines.append(
            "  packages        "
            + ", ".join(
                f"{p.name} {p.version}"
                for p in drv.packages
                if p.name.startswith(("nvidia", "libnvidia", "libcuda", "cuda-drivers", "kmod", "akmod", "xorg"))
            )
        )
    lines.append(
        f"  Secure Boot     {drv.secure_boot}"
        + (f"; module {drv.module_file}, signer {drv.module_signer or 'none'}" if drv.module_file else "")
    )
    lines.append("GPUs")
    lines += [f"  {g.name} (compute capability {g.cc or 'unknown'}; {g.source})" for g in d.gpus] or ["  none found"]
    lines.append("CUDA toolkits")
    for t in d.toolkits:
        extra = "".join(f"; {link}" for link in t.links) + (f"; package {t.package}" if t.package else "")
        lines.append(f"  {t.path}  CUDA {t.version or 'of unknown version'} ({t.kind}, from {t.how}){extra}")
    lines += [] if d.toolkits else ["  none found"]
    lines.append("cuDNN copies")
    for c in d.cudnn:
        state = f"; named by {c.configured}" if c.configured else ""
        owner = f", of {c.owner}" if c.owner and c.kind == "tree" else ""
        lines.append(f"  {c.lib}  cuDNN {c.version or 'of unknown version'} ({c.kind}{owner}){state}")
    lines += [] if d.cudnn else ["  none found"]
    lines.append("Python environments with torch")
    for e in d.envs:
        cudnn = f", cuDNN {e.cudnn} from {e.cudnn_from}" if e.cudnn else ""
        cuda = f"CUDA {e.torch_cuda}" if e.torch_cuda else "CPU build"
        python = f"Python {e.python_version or '?'}"
        lines.append(f"  {e.path}  {e.kind}, {python}, torch {e.torch} ({cuda}{cudnn}); {_verify_line(e.verify)}")
        if e.verify_as:
            lines.append(f"    verify {e.verify_as}")
    lines += [] if d.envs else ["  none found"]
    if d.other_envs:
        more = " ..." if len(d.other_envs) > 5 else ""
        lines.append(f"  ({len(d.other_envs)} more without torch: {', '.join(d.other_envs[:5])}{more})")
    if d.library_paths:
        lines.append("LD_LIBRARY_PATH set by")
        lines += [f"  {lp.source}: {':'.join(lp.dirs)}" for lp in d.library_paths]
    return lines


def _advice(advice: Advice, clean: bool) -> list[str]:
    stacks = advice.stacks()
    if not stacks:
        return []
    result = advice.result or {}
    what = "The newest gpuenv stack for these GPUs" if clean else "The gpuenv stack that would replace this"
    lines = [f"{what} ({advice.command}; it says why each value):"]
    for entry in result.get("stacks", []):
        lines += [f"  {line}" for line in stack_yaml(entry["document"])]
    keep = advice.keeping_driver()
    if keep is not None and keep not in stacks:
        lines.append(f"  keeping driver {advice.driver_branch}: {stack_flow({'gpu_stack': keep})}")
    lines.append(
        "  Save it as a stack file and apply it with playbooks/site.yml (README: Use gpuenv on your own hosts)."
    )
    return lines


def text(d: Diagnosis, data: CompatData) -> str:
    who = "root" if d.uid == 0 else f"uid {d.uid}"
    lines = [f"gpuenv doctor: {d.os}{' (provisioned by gpuenv)' if d.provisioned else ''}, as {who}; read-only", ""]
    lines += _inventory(d)
    lines.append("")
    if d.findings:
        lines.append(f"Findings ({len(d.findings)})")
        for f in d.findings:
            lines.append(f"{f.severity.upper()} [{f.rule}] {f.message}")
            lines.append(f"  where: {', '.join(f.where)}")
            lines.append(f"  why: {f.why}")
            lines.append(f"  fix: {f.fix}")
            for key in f.sources:
                source = data.sources.get(key)
                lines.append(
                    f"  source: {source.title if source else key}"
                    + (f" <{source.url}>" if source and source.url else "")
                )
    else:
        lines.append("No findings: nothing here stands between torch and the GPU that doctor knows to look for.")
    lines += [f"note: {n}" for n in d.notes]
    advice = _advice(d.advice, not d.findings)
    lines += ["", *advice] if advice else []
    n = len(d.findings)
    lines += ["", f"verdict: {'clean' if not n else f'{n} finding' + 's' * (n != 1)}; exit {d.exit_code}"]
    return "\n".join(lines) + "\n"


def as_json(d: Diagnosis, data: CompatData) -> str:
    keys = sorted({k for f in d.findings for k in f.sources})
    out = {
        "schema": SCHEMA,
        "exit_code": d.exit_code,
        "verdict": "findings" if d.findings else "clean",
        "os": d.os,
        "os_key": d.os_key,
        "uid": d.uid,
        "provisioned": d.provisioned,
        "driver": {**asdict(d.driver), "effective": d.driver.effective, "installed": d.driver.installed},
        "gpus": [asdict(g) for g in d.gpus],
        "toolkits": [asdict(t) for t in d.toolkits],
        "cudnn": [asdict(c) for c in d.cudnn],
        "environments": [asdict(e) for e in d.envs],
        "environments_without_torch": d.other_envs,
        "library_paths": [asdict(lp) for lp in d.library_paths],
        "findings": [finding_dict(f) | {"where": f.where, "env": f.env} for f in d.findings],
        "notes": d.notes,
        "suggestion": {"command": d.advice.command, "driver_branch": d.advice.driver_branch, "result": d.advice.result},
        "sources": {k: {"title": data.sources[k].title, "url": data.sources[k].url} for k in keys if k in data.sources},
    }
    return json.dumps(out, indent=2, default=str)
