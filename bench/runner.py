"""What the benchmark phases (bench/phases.py) run and count: the sandbox, playbooks with the timing
callback, commands over SSH, the stack both sides install, and the bytes that left the machine."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpuenv import envplan
from gpuenv.checkspec import check_file
from testbed.sandbox import fleet

ROOT = Path(__file__).resolve().parents[1]
STACK_FILE = ROOT / "inventory/sandbox/group_vars/gpu_hosts.yml"
INVENTORY = ROOT / "inventory/sandbox"
SITE = ROOT / "playbooks/site.yml"
FLOOR = ROOT / "bench/floor.sh"
# The stages the charts show beside the floor's: site.yml's plays as gpuenv.stages groups them.
FLOOR_STAGES = {"driver": ("driver",), "cuda": ("cuda", "cudnn"), "env": ("env",), "verify": ("verify",)}
# No site.yml here takes half an hour; one that does hangs, and the run says so rather than wait.
PLAYBOOK_TIMEOUT_S = 1800


class BenchError(Exception):
    """The benchmark cannot go on; the message says why and what to do."""


def work_dir() -> Path:
    # Disk-backed and outside the repo: logs, snapshots (GBs) and cold-cache directories.
    return Path(os.environ.get("GPUENV_BENCH_DIR", "/var/tmp/gpuenv-bench"))  # noqa: S108


def say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def stack_plan(stack_file: Path = STACK_FILE) -> dict[str, Any]:
    """A stack file's stack (the sandbox's by default), resolved by check-spec, and the environment's
    pinned requirements as the pytorch_env role computes them: the floor installs exactly these."""
    result = check_file(stack_file)
    if result["verdict"] == "invalid" or result["exit_code"] == 1:
        raise BenchError(f"{stack_file} does not check: run gpuenv check-spec {stack_file}")
    stack = result["stack"]
    plan = envplan.plan(
        torch=stack["torch"],
        variant=stack["torch_variant"],
        python=stack["python"],
        packages=stack["packages"],
        companions="auto",
        index_template="https://download.pytorch.org/whl/{variant}",
        pypi_url="",
        backend="venv-pip",
    )
    if not plan["from_pypi"]:
        raise BenchError(f"the floor installs torch from PyPI; the stack of {stack_file} must use PyPI's default build")
    return {"stack": stack, "requirements": plan["requirements"]}


def floor_env(plan: dict[str, Any], driver_mode: str) -> dict[str, str]:
    stack = plan["stack"]
    return {
        "FLOOR_MIRROR": f"http://{fleet.controller_ip()}:{fleet.MIRROR_PORT}",
        "FLOOR_CUDA": stack["cuda"],
        "FLOOR_CUDA_COMPONENTS": "cuda_cudart cuda_nvcc cuda_nvrtc",
        "FLOOR_CUDNN": stack["cudnn"],
        "FLOOR_PYTHON": stack["python"],
        "FLOOR_REQUIREMENTS": " ".join(plan["requirements"]),
        # The packages nvidia_driver installs from Debian: the module's only in full mode.
        "FLOOR_DRIVER_PACKAGES": ("nvidia-kernel-dkms " if driver_mode == "full" else "") + "nvidia-smi libcuda1",
        "FLOOR_KERNEL_HEADERS": "1" if driver_mode == "full" else "0",
    }


def ansible_env() -> dict[str, str]:
    venv_bin = str(ROOT / ".venv/bin")
    return {
        **os.environ,
        "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
    }


def sandbox(*args: str, env: dict[str, str] | None = None, log: Path | None = None) -> str:
    argv = [str(ROOT / "scripts/sandbox"), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env or ansible_env(), check=False)  # noqa: S603
    if log:
        with log.open("a") as f:
            f.write(f"$ {shlex.join(argv)}\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        raise BenchError(f"scripts/sandbox {' '.join(args)} failed: {proc.stderr.strip()[-1500:]}")
    return proc.stdout


def bench_inventory(log_dir: Path, source: Path = INVENTORY) -> Path:
    """The sandbox inventory without its host_vars: every host gets the group's stack, the one the
    floor installs and the figures name. (The demo gives sb2 a conda environment of its own; a
    fan-out host named sb2, started from sb1's snapshot, would build it, and its no-op would not be
    one.) The hosts file is linked, so that it follows each `scripts/sandbox up`."""
    inventory = log_dir / "inventory"
    inventory.mkdir(parents=True, exist_ok=True)
    for name in ("hosts.yml", "group_vars"):
        link = inventory / name
        if not link.is_symlink():
            link.symlink_to(source / name)
    return inventory


def playbook(
    log_dir: Path, label: str, extra_vars: dict[str, str], limit: list[str] | None = None, *, book: Path = SITE
) -> dict[str, Any]:
    """A playbook (site.yml) on the sandbox's hosts with the group's stack (bench_inventory) and
    the timing callback; returns its record with the wall time as measured from outside."""
    timing = log_dir / f"{label}.timing.json"
    argv = ["ansible-playbook", "-i", str(bench_inventory(log_dir)), str(book), "-e", json.dumps(extra_vars)]
    if limit:
        argv += ["--limit", ",".join(limit)]
    env = {**ansible_env(), "ANSIBLE_CALLBACKS_ENABLED": "gpuenv_timing", "GPUENV_TIMING_FILE": str(timing)}
    cpu_before, usage_before = machine_cpu_s(), resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with (log_dir / f"{label}.log").open("w") as out:
        try:
            proc = subprocess.run(  # noqa: S603
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, check=False, timeout=PLAYBOOK_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise BenchError(
                f"{book.name} ({label}) did not finish within {PLAYBOOK_TIMEOUT_S} s: a host hangs; its output so far "
                f"is in {log_dir / (label + '.log')}, and `scripts/sandbox status` shows the hosts"
            ) from None
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise BenchError(f"{book.name} ({label}) failed; its output is in {log_dir / (label + '.log')}")
    record: dict[str, Any] = json.loads(timing.read_text())
    record["measured_wall_s"] = round(wall, 2)
    # The sandbox hosts share this machine's cores with the controller: what Ansible itself cost
    # (ansible-playbook, its workers and its ssh clients, all reaped children of this process) is
    # told apart from everything else the machine did meanwhile, which is the hosts' work.
    controller = (usage.ru_utime - usage_before.ru_utime) + (usage.ru_stime - usage_before.ru_stime)
    record["controller_cpu_s"] = round(controller, 1)
    record["hosts_cpu_s"] = round(max(machine_cpu_s() - cpu_before - controller, 0.0), 1)
    return record


def machine_cpu_s() -> float:
    """CPU seconds this machine has spent busy (all cores, /proc/stat), for the split above."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(f) for f in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle and iowait
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks[:8]) - idle) / hz


def ssh(host_ip: str, command: str, *, env: dict[str, str] | None = None, timeout: int = 3600) -> tuple[str, float]:
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    argv = ["ssh", *fleet.ssh_options(), f"root@{host_ip}", f"{prefix} {command}".strip()]
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)  # noqa: S603
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise BenchError(f"{command} on {host_ip} exited {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}")
    return proc.stdout, wall


def host_ip(name: str) -> str:
    return fleet.State.load().hosts[name].ip


def changed(record: dict[str, Any]) -> int:
    return sum(h["changed"] for h in record["hosts"].values())


def forwarded_bytes() -> int:
    """Bytes the hosts received from outside through the controller's NAT, bypassing the cache
    (the sandbox's ESTABLISHED rule towards the bridge counts them)."""
    out = subprocess.run(
        ["iptables", "-t", "filter", "-L", "FORWARD", "-v", "-x", "-n"],  # noqa: S607
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    total = 0
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 6 and fields[0].isdigit() and fleet.BRIDGE in line and "RELATED,ESTABLISHED" in line:
            total += int(fields[1])
    return total


def mirror_served_bytes() -> int:
    """Bytes the local NVIDIA mirror served (its log names each file; the sizes come from disk)."""
    log = fleet.sandbox_dir() / "mirror.log"
    total = 0
    with contextlib.suppress(FileNotFoundError):
        for line in log.read_text(errors="replace").splitlines():
            m = re.search(r'"GET (\S+) HTTP/[\d.]+" 200', line)
            if m:
                path = fleet.mirror_root() / m.group(1).lstrip("/").split("?")[0]
                if path.is_file():
                    total += path.stat().st_size
    return total
