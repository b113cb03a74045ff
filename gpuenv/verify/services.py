"""The services beside the stack (roles/gpu_services): persistence mode and the NVSwitch
fabric on every GPU where the role set them up, and an optional CUDA container. Each reads the
role's record; where the stack did not ask for a service, its check is skipped with that reason."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from gpuenv.verify.base import Checks, Context, Spec, run_tool
from gpuenv.verify.model import WARN, Check

CHECKS = Checks()
# What gpu_services set up on the host.
RECORD = Path("/etc/ansible/facts.d/gpu_services.fact")


def _record(name: str) -> dict[str, Any]:
    """gpu_services' record of one service ({} where the role has not run)."""
    try:
        record = json.loads(RECORD.read_text())
    except (OSError, ValueError):
        return {}
    entry = record.get(name) if isinstance(record, dict) else None
    return entry if isinstance(entry, dict) else {}


def _not_asked(me: Spec, entry: dict[str, Any]) -> Check:
    why = entry.get("why") or f"gpu_services has not set it up here (no {RECORD})"
    return me.skipped(f"the stack does not ask for it ({why})", why)


def _smi_rows(ctx: Context, me: Spec, fields: str) -> tuple[list[list[str]], Check | None]:
    """nvidia-smi --query-gpu=index,FIELDS as rows, or the check to report when there are none."""
    if not shutil.which("nvidia-smi"):
        return [], ctx.gpu_skip(me, "nvidia-smi is not installed")
    run = run_tool(["nvidia-smi", f"--query-gpu=index,{fields}", "--format=csv,noheader"], timeout=60)
    out = (run.stdout + run.stderr).strip()
    if "not a valid field" in out:
        return [], Check(me.id, WARN, f"{me.title}: this driver's nvidia-smi cannot report it", observed=out[:300])
    rows = [[c.strip() for c in line.split(",")] for line in run.stdout.splitlines() if line.strip()]
    if run.returncode != 0 or not rows:
        return [], ctx.gpu_skip(me, f"nvidia-smi lists no GPU (exit {run.returncode}: {out[:200]})")
    return rows, None


def _every_gpu(ctx: Context, me: Spec, record: str, *, fields: str, want: list[str], what: str, hint: str) -> Check:
    """A per-GPU state from nvidia-smi (`what`) that must be `want` on every GPU, where gpu_services
    set up the service `record`."""
    entry = _record(record)
    if not entry.get("wanted"):
        return _not_asked(me, entry)
    rows, why = _smi_rows(ctx, me, fields)
    if why:
        return why
    bad = [row[0] for row in rows if row[1 : 1 + len(want)] != want]
    if bad:
        return me.failed(
            f"{what} is not {', '.join(want)} on GPU {', '.join(bad)}",
            observed={row[0]: row[1:] for row in rows},
            expected=f"{', '.join(want)} on every GPU",
            hint=hint,
        )
    return me.passed(f"{', '.join(want)} on all {len(rows)} GPUs", len(rows))


@CHECKS.add("services.persistence_mode", "persistence mode on every GPU")
def persistence_mode(ctx: Context, me: Spec) -> Check:
    return _every_gpu(
        ctx,
        me,
        "persistenced",
        fields="persistence_mode",
        want=["Enabled"],
        what="persistence mode",
        hint="systemctl enable --now nvidia-persistenced; journalctl -u nvidia-persistenced says why it stopped",
    )


@CHECKS.add("services.fabric", "NVSwitch fabric set up by Fabric Manager")
def fabric(ctx: Context, me: Spec) -> Check:
    return _every_gpu(
        ctx,
        me,
        "fabricmanager",
        fields="fabric.state,fabric.status",
        want=["Completed", "Success"],
        what="the NVSwitch fabric",
        hint="CUDA does not initialise on such a GPU: systemctl status nvidia-fabricmanager and journalctl -u "
        "nvidia-fabricmanager; Fabric Manager must be exactly the driver's version (run playbooks/site.yml, stage "
        "gpu_services, after a driver change)",
    )


def _container_tool(entry: dict[str, Any]) -> tuple[str | None, str]:
    """The runtime command that answers here (docker first), or None and why none does."""
    runtimes = [r for r in ("docker", "podman") if r in (entry.get("runtimes") or []) and shutil.which(r)]
    if not runtimes:
        return None, "no docker or podman command here"
    info = run_tool([runtimes[0], "info"], timeout=60)
    if info.returncode != 0:
        reason = (info.stderr or info.stdout).strip().splitlines()[-1:] or [f"exit {info.returncode}"]
        return None, f"{runtimes[0]} does not answer ({reason[0][:200]})"
    return runtimes[0], ""


@CHECKS.add("services.container", "a CUDA container sees the GPUs")
def container(ctx: Context, me: Spec) -> Check:
    entry = _record("container_toolkit")
    if not entry.get("wanted"):
        return _not_asked(me, entry)
    image = entry.get("verify_image")
    tool, why = _container_tool(entry) if image else (None, "no image named (gpu_services_verify_container_image)")
    if tool is None:
        return me.skipped(why, why)
    if ctx.proc_driver is None:
        return ctx.gpu_skip(me, "no NVIDIA kernel module is loaded")
    gpus = ["--gpus", "all"] if tool == "docker" else ["--device", "nvidia.com/gpu=all"]
    run = run_tool([tool, "run", "--rm", *gpus, str(image), "nvidia-smi", "-L"], timeout=600)
    listed = [line for line in run.stdout.splitlines() if line.startswith("GPU ")]
    if run.returncode != 0 or not listed:
        return me.failed(
            f"{tool} run {image} nvidia-smi -L lists no GPU",
            observed=(run.stdout + run.stderr).strip()[-600:],
            expected="GPU 0: ...",
            hint="check the runtime's configuration (gpu_services: daemon.json's nvidia runtime, the CDI "
            "specification for Podman) and run nvidia-ctk cdi generate after a driver change",
        )
    return me.passed(f"{tool} run {image} sees {len(listed)} GPUs", listed)
