"""gpuenv's provisioning benchmarks on the sandbox fleet (run through bench/run).

    bench/run              the full run: 3 pairs, every figure; writes docs/benchmarks.md's
                           generated section, docs/benchmarks/results.json and the charts
    bench/run --quick      one pair and fewer repeats; prints every figure, writes under
                           $GPUENV_BENCH_DIR/quick (docs/ untouched)
    bench/run --dry-run    no hosts: checks the plan, the floor script, the stack, the report and
                           the charts (from sample figures); ./scripts/test runs this

What is measured (issue 8), each against the sandbox stack (inventory/sandbox) with the driver in
full mode (its DKMS build), on hosts whose root has Debian's kernel package as a workstation has:
  bytes     upstream bytes of a cold fleet of 1 and of 4 hosts (each with an empty download cache)
  pairs     fresh host to verified stack: site.yml beside bench/floor.sh on an identical fresh host,
            warm caches, alternating which goes first; the ratio is of the medians
  noop      site.yml again on the provisioned host: wall time and changed tasks
  verify    gpuenv-verify alone on that host (no GPU)
  fanout    site.yml (no-op, verify included) on 1, 2, 4, 8 hosts started from its snapshot
  checkspec gpuenv check-spec as a user runs it
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import charts  # noqa: E402 - bench/ is not a package
import check_spec_latency  # noqa: E402

from gpuenv import envplan  # noqa: E402
from gpuenv.checkspec import check_file  # noqa: E402
from gpuenv.sandbox import cache, fleet  # noqa: E402
from gpuenv.stages import STAGES, stage_times  # noqa: E402

STACK_FILE = ROOT / "inventory/sandbox/group_vars/gpu_hosts.yml"
INVENTORY = ROOT / "inventory/sandbox"
SITE = ROOT / "playbooks/site.yml"
FLOOR = ROOT / "bench/floor.sh"
DOCS = ROOT / "docs/benchmarks.md"
DOCS_DIR = ROOT / "docs/benchmarks"
BEGIN = "<!-- bench/run: begin (generated; edit bench/harness.py, not this section) -->"
END = "<!-- bench/run: end -->"
# The stages the charts show beside the floor's: site.yml's plays as gpuenv.stages groups them.
FLOOR_STAGES = {"driver": ("driver",), "cuda": ("cuda", "cudnn"), "env": ("env",), "verify": ("verify",)}
# No site.yml here takes half an hour; one that does hangs, and the run says so rather than wait.
PLAYBOOK_TIMEOUT_S = 1800
PHASES = ("bytes", "pairs", "noop", "verify", "onboard", "fanout", "checkspec")
TARGETS = {
    "ratio": 1.25,
    "noop_s": 20.0,
    "fanout_factor": 2.0,
    "verify_s": 5.0,
    "checkspec_s": 1.0,
    "bytes_factor": 1.1,
}


# A provisioned sandbox host's own layer (torch's environment, two CUDA trees, the driver) is about
# 7.5 GB; the cold phase's empty download cache fills to 3.3 GB; the fan-out's snapshot is one more
# host. A disk that fills mid-run fails pip with ENOSPC a quarter of an hour in, so it is checked first.
HOST_GB = 8.0
EXTRA_GB = 4.0


class BenchError(Exception):
    """The benchmark cannot go on; the message says why and what to do."""


def disk_needed_gb(settings: dict[str, Any]) -> float:
    """The most the run holds on disk at once: its largest fresh fleet, and the snapshot beside it."""
    fresh = max(settings["bytes_sizes"]) if "bytes" in settings["phases"] else 2  # a pair is 2 hosts
    return HOST_GB * (fresh + 1) + EXTRA_GB


def check_disk(settings: dict[str, Any]) -> None:
    need = disk_needed_gb(settings)
    for where in {fleet.sandbox_dir(), work_dir()}:
        probe = where
        while not probe.exists():
            probe = probe.parent
        free = shutil.disk_usage(probe).free / 1e9
        if free < need:
            raise BenchError(
                f"{where} has {free:.0f} GB free and this run needs about {need:.0f} GB (hosts of about"
                f" {HOST_GB:.0f} GB each); nothing was started. Free space there (old pytest roots in"
                " /tmp/pytest-of-root, old logs and snapshots in the bench directory), point GPUENV_BENCH_DIR"
                " elsewhere, or run fewer phases (--only)"
            )


def work_dir() -> Path:
    # Disk-backed and outside the repo: logs, snapshots (GBs) and cold-cache directories.
    return Path(os.environ.get("GPUENV_BENCH_DIR", "/var/tmp/gpuenv-bench"))  # noqa: S108


def say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


# --- the stack both sides install ----------------------------------------------------------------
def stack_plan() -> dict[str, Any]:
    """The sandbox stack, resolved by check-spec, and the environment's pinned requirements as the
    pytorch_env role computes them: the floor installs exactly these."""
    result = check_file(STACK_FILE)
    if result["verdict"] == "invalid" or result["exit_code"] == 1:
        raise BenchError(f"{STACK_FILE} does not check: run gpuenv check-spec {STACK_FILE}")
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
        raise BenchError("the floor installs torch from PyPI; the sandbox stack must use PyPI's default build")
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


# --- running things --------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    venv_bin = str(ROOT / ".venv/bin")
    return {
        **os.environ,
        "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
    }


def sandbox(*args: str, env: dict[str, str] | None = None, log: Path | None = None) -> str:
    argv = [str(ROOT / "scripts/sandbox"), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env or _env(), check=False)  # noqa: S603
    if log:
        with log.open("a") as f:
            f.write(f"$ {shlex.join(argv)}\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        raise BenchError(f"scripts/sandbox {' '.join(args)} failed: {proc.stderr.strip()[-1500:]}")
    return proc.stdout


def playbook(
    log_dir: Path, label: str, extra_vars: dict[str, str], limit: list[str] | None = None, *, book: Path = SITE
) -> dict[str, Any]:
    """A playbook (site.yml) on the sandbox inventory with the timing callback; returns its record
    with the wall time as measured from outside."""
    timing = log_dir / f"{label}.timing.json"
    argv = ["ansible-playbook", "-i", str(INVENTORY), str(book), "-e", json.dumps(extra_vars)]
    if limit:
        argv += ["--limit", ",".join(limit)]
    env = {**_env(), "ANSIBLE_CALLBACKS_ENABLED": "gpuenv_timing", "GPUENV_TIMING_FILE": str(timing)}
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


# --- what left the machine -------------------------------------------------------------------------
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


# --- the phases ------------------------------------------------------------------------------------
class Bench:
    """One run: its settings, its logs, and the results as the phases fill them in."""

    def __init__(self, settings: dict[str, Any], plan: dict[str, Any], log_dir: Path) -> None:
        self.settings = settings
        self.plan = plan
        self.log_dir = log_dir
        self.extra_vars = {"nvidia_driver_mode": settings["driver_mode"]}
        self.results: dict[str, Any] = {}
        self.snapshot: Path | None = None  # the fan-out's, once taken
        self.provisioned = False  # noop, verify, onboard and the snapshot have had their host

    # --- helpers ---
    def playbook(self, label: str, limit: list[str] | None = None) -> dict[str, Any]:
        return playbook(self.log_dir, label, self.extra_vars, limit)

    def fresh_fleet(self, count: int, *, downloads: Path | None = None, snapshot: Path | None = None) -> None:
        env = _env()
        if downloads is not None:
            env["GPUENV_SANDBOX_DOWNLOADS"] = str(downloads)
        log = self.log_dir / "sandbox.log"
        sandbox("down", env=env, log=log)  # which also drops the mirror's log, counted per phase
        args = ["up", str(count), "--os", "debian12"]
        if snapshot:
            args += ["--snapshot", str(snapshot)]
        elif self.settings["driver_mode"] == "full":
            args.append("--kernel")  # full mode builds the module for the host's installed kernel
        sandbox(*args, env=env, log=log)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        walls = self.results.setdefault("phase_wall_s", {})
        walls[name] = round(walls.get(name, 0.0) + time.perf_counter() - start, 1)

    # --- 5. upstream bytes ---
    def cold_run(self, hosts: int) -> dict[str, Any]:
        """Provision `hosts` fresh hosts together from an empty download cache; what left the
        machine is counted. The hosts stay up."""
        downloads = Path(tempfile.mkdtemp(prefix=f"downloads-{hosts}-", dir=work_dir()))
        say(f"bytes: {hosts} fresh host(s) together, empty download cache")
        try:
            self.fresh_fleet(hosts, downloads=downloads)
            before = forwarded_bytes()
            record = self.playbook(f"cold-{hosts}")
            stats = cache.stats(fleet.cache_url())
            direct = forwarded_bytes() - before
        finally:
            # What this cold run fetched (a failed one's finished files too) goes to the machine's
            # own cache, and its GBs do not stay behind.
            fleet.stop_cache()
            _merge_downloads(downloads, fleet.downloads_dir())
        ips = {h.ip: name for name, h in fleet.State.load().hosts.items()}
        figures = {
            "hosts": hosts,
            # What each host alone would have cost upstream with an empty cache: the files it
            # asked for, once each, and every passed-through request (a cross-check of the
            # 1-host run, and the 1-host figure of a quick run, which does not make that run).
            "alone_bytes": {ips.get(ip, ip): c["alone_bytes"] for ip, c in stats["clients"].items() if ip in ips},
            "upstream_bytes": stats["upstream_bytes"] + direct,
            "through_cache_bytes": stats["upstream_bytes"],
            "direct_bytes": direct,
            "served_to_hosts_bytes": stats["served_bytes"],
            "mirror_served_bytes": mirror_served_bytes(),
            "wall_s": record["measured_wall_s"],
            "stages": stage_times(record),
        }
        say(f"bytes: {hosts} host(s): {figures['upstream_bytes'] / 1e9:.2f} GB from upstream")
        fleet.serve_cache()  # the hosts stay up for what follows, served from the machine's cache
        return figures

    # --- 2, 4 and the fan-out's snapshot: on a host site.yml has just provisioned ---
    def provisioned_host(self) -> None:
        if self.provisioned:
            return
        self.provisioned = True
        s = self.settings
        if "noop" in s["phases"]:
            with self.phase("noop"):
                self.results["noop"] = self.noop(s["noop_runs"])
        if "verify" in s["phases"]:
            with self.phase("verify"):
                self.results["verify"] = self.verify(s["verify_runs"])
        if "onboard" in s["phases"]:
            with self.phase("onboard"):
                self.results["onboard"] = self.onboard()
        if "fanout" in s["phases"]:
            with self.phase("snapshot"):
                self.snapshot = work_dir() / "snapshot"
                say("snapshot of the provisioned host, for the fan-out")
                sandbox("snapshot", "sb1", str(self.snapshot), log=self.log_dir / "sandbox.log")

    def noop(self, runs: int) -> dict[str, Any]:
        records = [self.playbook(f"noop-{i + 1}", limit=["sb1"]) for i in range(runs)]
        walls = [r["measured_wall_s"] for r in records]
        slowest = sorted(records[-1]["tasks"], key=lambda t: -t["wall_s"])[:8]
        say(f"no-op: {', '.join(f'{w:.1f} s' for w in walls)}, changed {[changed(r) for r in records]}")
        return {
            "runs": walls,
            "controller_cpu_s": records[-1]["controller_cpu_s"],
            "hosts_cpu_s": records[-1]["hosts_cpu_s"],
            "median_s": round(statistics.median(walls), 1),
            "changed": [changed(r) for r in records],
            "changed_tasks": sorted({t for r in records for h in r["hosts"].values() for t in h["changed_tasks"]}),
            "tasks": len(records[-1]["tasks"]),
            "stages": stage_times(records[-1]),
            "slowest_tasks": [{"name": t["name"], "wall_s": t["wall_s"]} for t in slowest],
        }

    def onboard(self) -> dict[str, Any]:
        """playbooks/onboard.yml for a new member on the provisioned host, ending with verify as them."""
        vars_ = {**self.extra_vars, "onboard_user_name": "newcomer", "onboard_user_reports_dir": str(self.log_dir)}
        record = playbook(self.log_dir, "onboard", vars_, ["sb1"], book=ROOT / "playbooks/onboard.yml")
        report = json.loads((self.log_dir / "sb1-newcomer.json").read_text())
        say(f"onboard: {record['measured_wall_s']:.1f} s, verify as the new member exit {report['exit_code']}")
        return {"wall_s": record["measured_wall_s"], "changed": changed(record), "verify_exit": report["exit_code"]}

    def verify(self, runs: int) -> dict[str, Any]:
        ip = host_ip("sb1")
        walls = []
        for _ in range(runs):
            _, wall = ssh(ip, "gpuenv-verify --json /tmp/bench-verify.json >/dev/null")
            walls.append(round(wall, 2))
        report = json.loads(ssh(ip, "cat /tmp/bench-verify.json")[0])
        say(f"verify: {', '.join(f'{w:.2f} s' for w in walls)}")
        return {
            "runs": walls,
            "median_s": round(statistics.median(walls), 2),
            "counts": report.get("counts"),
            "slowest_checks": sorted(
                ({"id": c["id"], "seconds": c.get("seconds")} for c in report["checks"] if c.get("seconds")),
                key=lambda c: -float(c["seconds"] or 0),
            )[:4],
        }

    # --- 1. fresh host to verified, beside the floor ---
    def pairs(self, count: int) -> dict[str, Any]:
        runs = []
        for i in range(count):
            say(f"pair {i + 1}/{count}: two fresh hosts, warm caches")
            self.fresh_fleet(2)
            order = ["gpuenv", "floor"] if i % 2 == 0 else ["floor", "gpuenv"]
            pair: dict[str, Any] = {"order": order}
            for side in order:
                if side == "gpuenv":
                    record = self.playbook(f"pair{i + 1}-gpuenv", limit=["sb1"])
                    pair["gpuenv"] = {
                        "wall_s": record["measured_wall_s"],
                        "stages": stage_times(record),
                        "changed": changed(record),
                    }
                else:
                    pair["floor"] = self.floor("sb2", f"pair{i + 1}-floor")
                say(f"pair {i + 1}: {side} took {pair[side]['wall_s']:.0f} s")
            pair["ratio"] = round(pair["gpuenv"]["wall_s"] / pair["floor"]["wall_s"], 3)
            runs.append(pair)
            self.provisioned_host()  # when no cold run came first: pair 1's gpuenv host
        g = statistics.median(p["gpuenv"]["wall_s"] for p in runs)
        f = statistics.median(p["floor"]["wall_s"] for p in runs)
        return {
            "runs": runs,
            "gpuenv_median_s": round(g, 1),
            "floor_median_s": round(f, 1),
            "ratio_of_medians": round(g / f, 3),
            "median_of_ratios": round(statistics.median(p["ratio"] for p in runs), 3),
            "stages_median": {
                side: {
                    stage: round(statistics.median(p[side]["stages"][stage] for p in runs), 1) for stage, _ in STAGES
                }
                for side in ("gpuenv", "floor")
            },
        }

    def floor(self, name: str, label: str) -> dict[str, Any]:
        ip = host_ip(name)
        subprocess.run(  # noqa: S603
            ["scp", "-q", *fleet.ssh_options(), str(FLOOR), f"root@{ip}:/root/floor.sh"],  # noqa: S607
            check=True,
        )
        out, wall = ssh(ip, "bash /root/floor.sh", env=floor_env(self.plan, self.settings["driver_mode"]))
        (self.log_dir / f"{label}.log").write_text(out)
        stages: dict[str, float] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "floor-stage":
                stages[parts[1]] = float(parts[2])
        merged = {stage: round(sum(stages.get(s, 0.0) for s in parts), 1) for stage, parts in FLOOR_STAGES.items()}
        return {"wall_s": round(wall, 2), "stages": {"preflight": 0.0, **merged}}

    # --- 3. fan-out ---
    def fanout(self, sizes: list[int]) -> dict[str, Any]:
        if self.snapshot is None or not self.snapshot.is_dir():
            raise BenchError("the fan-out starts its hosts from a provisioned host's snapshot, and there is none")
        biggest = max(sizes)
        say(f"fan-out: {biggest} hosts from the snapshot")
        self.fresh_fleet(biggest, snapshot=self.snapshot)
        names = [f"sb{i}" for i in range(1, biggest + 1)]
        # No settling run first: a host started from the snapshot has its own name and identity
        # and nothing else to change, and if it had, the changed counts below would say so.
        results: dict[str, Any] = {"sizes": {}}
        for n in sizes:
            noop = self.results.get("noop")
            if n == 1 and self.settings["fanout_one_from_noop"] and noop:
                # quick: one host's no-op was just measured on the origin of these hosts
                results["sizes"]["1"] = {
                    "wall_s": noop["median_s"],
                    "changed": max(noop["changed"]),
                    "controller_cpu_s": noop["controller_cpu_s"],
                    "hosts_cpu_s": noop["hosts_cpu_s"],
                    "from_noop": True,
                }
                continue
            record = self.playbook(f"fanout-{n}", limit=names[:n])
            results["sizes"][str(n)] = {
                "wall_s": record["measured_wall_s"],
                "changed": changed(record),
                "controller_cpu_s": record["controller_cpu_s"],
                "hosts_cpu_s": record["hosts_cpu_s"],
            }
            say(f"fan-out: {n} host(s) no-op in {record['measured_wall_s']:.1f} s, {changed(record)} changed")
        sandbox("down", log=self.log_dir / "sandbox.log")
        shutil.rmtree(self.snapshot, ignore_errors=True)
        return results

    # --- the order ---
    def run_all(self) -> None:
        s = self.settings
        phases = s["phases"]
        if "bytes" in phases:
            one: dict[str, Any] | None = None
            if s["bytes_one_run"]:
                with self.phase("bytes"):
                    one = self.cold_run(1)
                self.provisioned_host()  # the cold host is a freshly provisioned one like any other
            with self.phase("bytes"):
                many = self.cold_run(max(s["bytes_sizes"]))
            if one is None:
                one = {"hosts": 1, "derived": True, "upstream_bytes": many["alone_bytes"]["sb1"]}
            self.results["bytes"] = {"1": one, str(many["hosts"]): many}
            self.provisioned_host()  # quick: sb1 of the cold fleet
        if "pairs" in phases or ({"noop", "verify", "onboard", "fanout"} & set(phases) and not self.provisioned):
            with self.phase("pairs"):
                pairs = self.pairs(s["pairs"])
            if "pairs" in phases:
                self.results["pairs"] = pairs
        if "fanout" in phases:
            with self.phase("fanout"):
                self.results["fanout"] = self.fanout(s["fanout_sizes"])
        sandbox("down", log=self.log_dir / "sandbox.log")
        if "checkspec" in phases:
            with self.phase("checkspec"):
                self.results["checkspec"] = check_spec_latency.measure(s["checkspec_runs"])


def _merge_downloads(src: Path, dest: Path) -> None:
    """What a cold run fetched warms the machine's own cache for the runs after it."""
    for path in src.rglob("*"):
        # Not its log, and not a file a failed run left half-fetched.
        if path.is_file() and path.name != "upstream.jsonl" and path.suffix != ".part":
            target = dest / path.relative_to(src)
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                path.replace(target)
    cache.clear(src)


# --- the machine ------------------------------------------------------------------------------------
def _git(*args: str) -> str:
    return subprocess.run(  # noqa: S603
        ["git", "-C", str(ROOT), *args],  # noqa: S607
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def machine() -> dict[str, Any]:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kb = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
    os_name = platform.platform()
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"')
    commit, dirty = _git("rev-parse", "--short", "HEAD"), _git("status", "--porcelain", "--untracked-files=no")
    if commit and dirty:
        commit += " with uncommitted changes"
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "os": os_name,
        "kernel": platform.release(),
        "gpu": "none",
        "commit": commit or "unknown",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


# --- the whole run -----------------------------------------------------------------------------------
def plan_for(quick: bool) -> dict[str, Any]:
    """The full run measures the stack as a workstation gets it (driver in full mode, its DKMS
    build); the quick run installs the driver's user space only, as the sandbox demo does, which
    leaves out the module build (about 3.5 of a fresh host's 6 minutes here) on every host."""
    return {
        "mode": "quick" if quick else "full",
        "driver_mode": "userspace" if quick else "full",
        "pairs": 1 if quick else 3,
        "bytes_sizes": [1, 4],
        # quick: the 1-host figure is sb1's own share of the 4-host run (what it alone fetched)
        "bytes_one_run": not quick,
        "noop_runs": 1 if quick else 3,
        "verify_runs": 3 if quick else 5,
        "fanout_sizes": [1, 2, 4, 8],
        # quick: the 1-host fan-out figure is the no-op run's (same state, one run less)
        "fanout_one_from_noop": quick,
        "checkspec_runs": 10 if quick else 30,
        "phases": list(PHASES),
    }


def run(settings: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise BenchError("the benchmarks boot sandbox hosts, which needs root: run bench/run as root")
    work_dir().mkdir(parents=True, exist_ok=True)
    check_disk(settings)
    log_dir = work_dir() / "logs" / dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    log_dir.mkdir(parents=True, exist_ok=True)
    say(f"logs in {log_dir}")
    plan = stack_plan()
    say("the local NVIDIA mirror (built once, then verified)")
    sandbox("mirror", "build", log=log_dir / "sandbox.log")
    bench = Bench(settings, plan, log_dir)
    bench.results.update(
        {
            "machine": machine(),
            "plan": settings,
            "stack": {k: plan["stack"][k] for k in ("driver", "cuda", "cudnn", "python", "torch", "torch_variant")},
            "requirements": plan["requirements"],
            "log_dir": str(log_dir),
        }
    )
    start = time.perf_counter()
    try:
        bench.run_all()
    finally:
        with contextlib.suppress(BenchError):
            sandbox("down", log=log_dir / "sandbox.log")
        # A failed fan-out's 7.5 GB.
        shutil.rmtree(work_dir() / "snapshot", ignore_errors=True)
    bench.results["total_wall_s"] = round(time.perf_counter() - start, 1)
    write_outputs(bench.results, out_dir)
    return bench.results


def write_outputs(results: dict[str, Any], out_dir: Path) -> None:
    import report  # noqa: PLC0415 - bench/report.py, only needed here

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    pngs = charts.render_all(results, out_dir)
    section = report.markdown(results, {name: p.name for name, p in pngs.items()}, TARGETS)
    print(report.table(results, TARGETS))
    if out_dir == DOCS_DIR:
        replace_section(DOCS, section, image_prefix="benchmarks/")
    else:
        (out_dir / "benchmarks.md").write_text(section + "\n")
        say(f"results in {out_dir} (docs/ untouched: only the full run writes there)")


def replace_section(doc: Path, section: str, image_prefix: str) -> None:
    section = re.sub(r"\]\((?!http)([^)]+\.png)\)", rf"]({image_prefix}\1)", section)
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    block = f"{BEGIN}\n{section.rstrip()}\n{END}"
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
    else:
        # First generation: after the page's opening paragraph.
        head, sep, rest = text.partition("\n## ")
        text = f"{head.rstrip()}\n\n{block}\n\n{sep.strip()} {rest}" if sep else f"{text.rstrip()}\n\n{block}\n"
    doc.write_text(text)


def dry_run() -> int:
    """Everything but the hosts: the stack resolves, the floor script parses, and the report and
    charts render from sample figures, so that the harness cannot rot between full runs."""
    import report  # noqa: PLC0415

    plan = stack_plan()
    print(f"stack: {json.dumps({k: plan['stack'][k] for k in ('driver', 'cuda', 'cudnn', 'python', 'torch')})}")
    print(f"environment both sides install: {' '.join(plan['requirements'])}")
    for mode in ("full", "userspace"):
        env = floor_env(plan, mode)
        print(f"floor env ({mode}): " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()))
    syntax = subprocess.run(["bash", "-n", str(FLOOR)], capture_output=True, text=True, check=False)  # noqa: S603, S607
    if syntax.returncode != 0:
        raise BenchError(f"bench/floor.sh does not parse: {syntax.stderr}")
    for quick in (True, False):
        print(f"{'quick' if quick else 'full'} plan: {json.dumps(plan_for(quick))}")
        print(f"  disk it needs free: about {disk_needed_gb(plan_for(quick)):.0f} GB")
    sample = json.loads((ROOT / "bench/sample-results.json").read_text())
    out = Path(tempfile.mkdtemp(prefix="gpuenv-bench-dry-"))
    try:
        pngs = charts.render_all(sample, out)
        for name, path in pngs.items():
            data = path.read_bytes()
            if data[:8] != b"\x89PNG\r\n\x1a\n" or len(data) < 5000:
                raise BenchError(f"chart {name} did not render ({path}, {len(data)} bytes)")
            print(f"chart {name}: {len(data)} bytes")
        md = report.markdown(sample, {n: p.name for n, p in pngs.items()}, TARGETS)
        wanted = ("ratio", "changed", "fan-out", "upstream", "check-spec", "verify")
        missing = [word for word in wanted if word not in md]
        if missing:
            raise BenchError(f"the report lacks {', '.join(missing)}")
        print("the report from sample figures (bench/sample-results.json: a quick run's results), not a measurement:")
        print(report.table(sample, TARGETS))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print("bench: dry run ok (no host was booted)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one pair and fewer repeats (under 15 minutes here)")
    parser.add_argument("--dry-run", action="store_true", help="check the harness without booting any host")
    parser.add_argument(
        "--only", help=f"comma-separated phases to run (of {','.join(PHASES)}); noop, verify and fanout need pairs"
    )
    parser.add_argument("--out", type=Path, help="where results go (default: docs/ for the full run)")
    args = parser.parse_args(argv)
    try:
        if args.dry_run:
            return dry_run()
        bench = plan_for(args.quick)
        if args.only:
            unknown = set(args.only.split(",")) - set(PHASES)
            if unknown:
                raise BenchError(f"unknown phase(s) {', '.join(sorted(unknown))}; phases: {', '.join(PHASES)}")
            bench["phases"] = [p for p in PHASES if p in args.only.split(",")]
        out = args.out or (work_dir() / "quick" if args.quick else DOCS_DIR)
        run(bench, out)
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
