"""What the benchmark phases (bench/phases.py) run and count: the sandbox, playbooks with the timing
callback, commands over SSH, the stack both sides install, and the bytes that left the machine."""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import threading
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
# How often a playbook's hosts' CPU is sampled when asked (the fleet phase's per-stage split).
SAMPLE_S = 2.0


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
    log_dir: Path,
    label: str,
    extra_vars: dict[str, str],
    limit: list[str] | None = None,
    *,
    book: Path = SITE,
    sample_hosts: list[str] | None = None,
) -> dict[str, Any]:
    """A playbook (site.yml) on the sandbox's hosts with the group's stack (bench_inventory) and
    the timing callback; returns its record with the wall time as measured from outside. With
    sample_hosts, each of those hosts' own CPU seconds every SAMPLE_S (record["cpu_samples"]: the
    seconds since the start, and each host's CPU since its boot), which stage_cpu_s splits by stage."""
    timing = log_dir / f"{label}.timing.json"
    argv = ["ansible-playbook", "-i", str(bench_inventory(log_dir)), str(book), "-e", json.dumps(extra_vars)]
    if limit:
        argv += ["--limit", ",".join(limit)]
    env = {**ansible_env(), "ANSIBLE_CALLBACKS_ENABLED": "gpuenv_timing", "GPUENV_TIMING_FILE": str(timing)}
    cpu_before, usage_before = machine_cpu_s(), resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    samples: list[tuple[float, dict[str, float]]] = []
    done = threading.Event()

    def sample() -> None:
        while sample_hosts:
            samples.append((time.perf_counter() - start, hosts_cpu_s(sample_hosts)))
            if done.wait(SAMPLE_S):
                samples.append((time.perf_counter() - start, hosts_cpu_s(sample_hosts)))
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
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
    done.set()
    sampler.join()
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
    if samples:
        record["cpu_samples"] = samples
    return record


def stage_cpu_s(record: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each sampled host's own CPU seconds in each stage: over the stage's plays (the timing record's
    windows, moved by Ansible's start-up, the outside wall less the callback's), from the samples
    nearest their edges. A stage that runs beside another (the driver's install in the background)
    shares the CPU of both in its window."""
    samples: list[tuple[float, dict[str, float]]] = record["cpu_samples"]
    shift = max(record["measured_wall_s"] - record["wall_s"], 0.0)

    def at(t: float) -> dict[str, float]:
        return min(samples, key=lambda s: abs(s[0] - t))[1]

    out: dict[str, dict[str, float]] = {}
    for play in record["plays"]:
        stage = play.get("stage")
        if stage is None:
            continue
        begin, end = at(play["start_s"] + shift), at(play["start_s"] + play["wall_s"] + shift)
        for host in end:
            per = out.setdefault(host, {})
            per[stage] = round(per.get(stage, 0.0) + end[host] - begin[host], 1)
    return out


def task_cpu_s(record: dict[str, Any], host: str, top: int = 12) -> list[tuple[str, float]]:
    """One sampled host's CPU seconds by task name (summed over the task's runs), the costliest
    first: each task's window (moved by Ansible's start-up, as stage_cpu_s does) read from the
    samples, interpolated between the two around each edge. Samples are SAMPLE_S apart, so a task
    shorter than that is an estimate, and work a host does in the background (an async job) counts
    in the windows of the tasks beside it; the sum over all tasks is the host's whole run."""
    samples: list[tuple[float, dict[str, float]]] = record["cpu_samples"]
    shift = max(record["measured_wall_s"] - record["wall_s"], 0.0)
    times = [t for t, _ in samples]

    def at(t: float) -> float:
        i = bisect.bisect_left(times, t)
        if i <= 0:
            return samples[0][1][host]
        if i >= len(samples):
            return samples[-1][1][host]
        (t0, c0), (t1, c1) = (samples[i - 1][0], samples[i - 1][1][host]), (samples[i][0], samples[i][1][host])
        return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1

    per: dict[str, float] = {}
    for task in record.get("tasks", []):
        start = task["start_s"] + shift
        per[task["name"]] = per.get(task["name"], 0.0) + at(start + task.get("wall_s", 0.0)) - at(start)
    ranked = sorted(per.items(), key=lambda item: -item[1])[:top]
    return [(name, round(cpu, 1)) for name, cpu in ranked]


def machine_cpu_s() -> float:
    """CPU seconds this machine has spent busy (all cores, /proc/stat), for the split above."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(f) for f in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle and iowait
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks[:8]) - idle) / hz


def hosts_cpu_s(names: list[str]) -> dict[str, float]:
    """CPU seconds each sandbox host has spent since it booted: every live process under its
    systemd-nspawn, with what the processes each reaped (/proc/PID/stat's utime, stime, cutime and
    cstime). A finished process counts once, in the live parent that reaped it (the host's systemd
    reaps the orphans, Ansible's async jobs among them); a host that rebooted starts again from 0."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command, which may hold spaces
            pid = int(stat.parent.name)
            parents[pid] = int(fields[1])
            ticks[pid] = sum(int(f) for f in fields[11:15])
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    hz = os.sysconf("SC_CLK_TCK")
    state = fleet.State.load()
    out = {}
    for name in names:
        nspawn = int((state.hosts[name].dir() / "nspawn.pid").read_text().strip())
        todo, total = list(children.get(nspawn, [])), 0
        while todo:
            pid = todo.pop()
            total += ticks.get(pid, 0)
            todo.extend(children.get(pid, []))
        out[name] = round(total / hz, 1)
    return out


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
