"""What the gpu_services role sets up beside the stack, decided from the preflight's resolved stack.

Pure functions, called by the role through plugins/filter/gpuenv_services.py and tested in
tests/test_services.py: which services a host gets (off / on / auto), which package of
which repository carries each at which version, whether a daemon can start now, and Docker's
daemon.json with the NVIDIA runtime merged into what the host has.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from gpuenv.compat import CompatData, load
from gpuenv.module_utils import gpuenv_hostparse as hostparse

MODES = ("off", "on", "auto")
# What `nvidia-ctk runtime configure --runtime=docker` writes into daemon.json.
DOCKER_RUNTIME = {"args": [], "path": "nvidia-container-runtime"}


def _plan(wanted: bool, why: str) -> dict[str, Any]:
    return {"wanted": wanted, "why": why}


def _mode(name: str, mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"{name} must be one of {', '.join(MODES)}, not {mode!r}")


def mode_of(value: Any) -> str:
    """A switch as the inventory gave it: YAML reads an unquoted on / off (and yes / no) as a
    boolean, which means on / off here."""
    if value is True:
        return "on"
    if value is False:
        return "off"
    return str(value)


# --- persistence daemon -----------------------------------------------------------------------------
def datacenter_labels(gpus: Sequence[Mapping[str, Any]], data: CompatData | None = None) -> list[str]:
    """The GPUs of a resolved stack (gpu_stack_resolved.gpus: label, cc) that are data-centre GPUs:
    a model of compat.yaml's services.datacenter_gpus, or a compute capability all of whose models
    are (a declared "9.0" is an H100, H200 or GH200). A label may hold several identical GPUs'
    names ("A100, NVIDIA A100-SXM4-80GB")."""
    data = data or load()
    listed = set(data.raw["services"]["datacenter_gpus"]["models"])
    found = []
    for gpu in gpus:
        for label in str(gpu.get("label") or "").split(", "):
            if re.fullmatch(r"[0-9]{1,3}\.[0-9]{1,3}", label):
                models = [m for m in data.gpu_models if m.cc == label]
                hit = bool(models) and all(m.name in listed for m in models)
            else:
                model = data.gpu_by_name(label)
                hit = model is not None and model.name in listed
            if hit and label not in found:
                found.append(label)
    return found


def plan_persistenced(mode: str, gpus: Sequence[Mapping[str, Any]], data: CompatData | None = None) -> dict[str, Any]:
    _mode("gpu_services_persistenced", mode)
    if mode != "auto":
        return _plan(mode == "on", f"gpu_services_persistenced is {mode}")
    found = datacenter_labels(gpus, data)
    if found:
        return _plan(True, f"auto: data-centre GPU {', '.join(found)}")
    if gpus:
        labels = ", ".join(str(g.get("label")) for g in gpus)
        return _plan(False, f"auto: no data-centre GPU ({labels}); set gpu_services_persistenced: on to run it anyway")
    return _plan(False, "auto: the stack names no GPU and the preflight detected none")


# --- Fabric Manager ---------------------------------------------------------------------------------
def nvswitch_summary(switches: Sequence[Mapping[str, Any]]) -> str:
    """ "6 NVSwitches (10de:1af1, gen 2)" for messages."""
    ids = sorted(
        {f"10de:{s.get('device')}" + (f", gen {s['generation']}" if s.get("generation") else "") for s in switches}
    )
    noun = "NVSwitch" if len(switches) == 1 else "NVSwitches"
    return f"{len(switches)} {noun} ({'; '.join(ids)})"


def plan_fabricmanager(mode: str, switches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    _mode("gpu_services_fabricmanager", mode)
    if mode != "auto":
        return _plan(mode == "on", f"gpu_services_fabricmanager is {mode}")
    if switches:
        return _plan(True, f"auto: {nvswitch_summary(switches)} on the PCI bus")
    return _plan(
        False,
        "auto: no NVSwitch on the PCI bus (lspci); HGX B200/B300 NVSwitches are not PCI devices on the host: "
        "set gpu_services_fabricmanager: on there",
    )


# --- container toolkit ------------------------------------------------------------------------------
def plan_container_toolkit(
    mode: str, found: Sequence[str], declared: Sequence[str], *, docker_install: bool
) -> dict[str, Any]:
    """found: the runtimes whose programs the host has (dockerd, podman); declared:
    gpu_services_container_runtimes, which replaces what was found when given."""
    _mode("gpu_services_container_toolkit", mode)
    runtimes = list(dict.fromkeys(declared)) if declared else list(dict.fromkeys(found))
    if docker_install and "docker" not in runtimes:
        runtimes.append("docker")
    where = (
        f"the runtimes {', '.join(runtimes)}"
        + (" (gpu_services_container_runtimes)" if declared else " (found on the host)")
        if runtimes
        else "no container runtime"
    )
    if mode != "auto":
        plan = _plan(mode == "on", f"gpu_services_container_toolkit is {mode}; {where}")
    elif runtimes:
        plan = _plan(True, f"auto: {where}")
    else:
        plan = _plan(
            False,
            "auto: no container runtime on the host (dockerd, podman); name them in "
            "gpu_services_container_runtimes or set gpu_services_docker_install: true",
        )
    plan["runtimes"] = runtimes if plan["wanted"] else []
    return plan


def docker_daemon_config(current: str | None, *, default_runtime: bool, path: str) -> dict[str, Any]:
    """Docker's daemon.json with the NVIDIA runtime merged in, as `nvidia-ctk runtime configure
    --runtime=docker` writes it, every other key kept: {"ok": True, "config": {...}} or
    {"ok": False, "error": what is wrong and how to fix it} (the file is never overwritten then)."""
    text = (current or "").strip()
    try:
        config = json.loads(text) if text else {}
    except ValueError as exc:
        return {"ok": False, "error": f"{path} is not valid JSON ({exc}); fix or remove it, then run again"}
    if not isinstance(config, dict) or not isinstance(config.get("runtimes", {}), dict):
        return {
            "ok": False,
            "error": f'{path} must hold a JSON object whose "runtimes" is an object; fix it, then run again',
        }
    merged = dict(config)
    runtimes = dict(merged.get("runtimes", {}))
    kept = runtimes.get("nvidia")
    args = kept.get("args", []) if isinstance(kept, dict) else []
    runtimes["nvidia"] = {**DOCKER_RUNTIME, "args": args}
    merged["runtimes"] = runtimes
    if default_runtime:
        merged["default-runtime"] = "nvidia"
    return {"ok": True, "config": merged}


# --- packages, versions, daemons --------------------------------------------------------------------
def driver_in_use(target: Any, record: Any, pin: Any) -> dict[str, Any]:
    """The driver the services must match: the version the driver role chose in this run
    (nvidia_driver_target), else the one it recorded (ansible_local.nvidia_driver), else an exact
    pin of the stack; the branch from whichever is known, else from the pin."""
    target = target if isinstance(target, Mapping) else {}
    record = record if isinstance(record, Mapping) else {}
    pin = str(pin or "")
    if target.get("upstream"):
        version, package, origin = str(target["upstream"]), str(target.get("version") or ""), "the driver stage"
    elif record.get("version"):
        version, package, origin = (
            str(record["version"]),
            str(record.get("package_version") or ""),
            "the driver's record",
        )
    elif pin.count(".") >= 1:
        version, package, origin = pin, "", "the stack's exact pin"
    else:
        version, package, origin = "", "", ""
    branch = (version or pin).split(".")[0]
    return {"version": version or None, "package_version": package or None, "branch": branch, "from": origin}


def pick_package(madison: Mapping[str, Any], names: Sequence[str], version: str | None) -> dict[str, Any]:
    """The first of `names` that the repositories offer at `version` (its upstream part; None: the
    newest offered), from `apt-cache madison` text per name (gpuenv_apt_index): {"name", "version"
    (the package's full version), "available" (per name), "offered" (the same as one line, for
    refusals)}. name and version are None when none offers it."""
    available = {name: hostparse.parse_madison(str(madison.get(name) or "")) for name in names}
    offered = "; ".join(f"{name}: {', '.join(v) if v else 'none'}" for name, v in available.items())
    for name in names:
        versions = available[name]
        chosen = (versions[0] if versions else None) if version is None else hostparse.pick_version(versions, version)
        if chosen:
            return {"name": name, "version": chosen, "available": available, "offered": offered}
    return {"name": None, "version": None, "available": available, "offered": offered}


def can_start(proc_version: str | None, driver_version: str | None) -> dict[str, Any]:
    """Whether a daemon of the driver (persistence daemon, Fabric Manager) can start now, from
    /proc/driver/nvidia/version (None: absent): only with a module loaded, of the installed driver's
    version where that is known. Otherwise it starts at the next boot, and why."""
    loaded = hostparse.parse_proc_version(proc_version) if proc_version else None
    if loaded is None:
        return {
            "start": False,
            "why": "not started: no NVIDIA kernel module is loaded (no GPU, or a reboot pending); enabled, it "
            "starts at the next boot",
        }
    if driver_version and loaded["version"] != driver_version:
        return {
            "start": False,
            "why": f"not started: the loaded module is {loaded['version']} and the installed driver {driver_version}; "
            "enabled, it starts after the reboot",
        }
    return {"start": True, "why": f"started: driver {loaded['version']} is loaded"}
