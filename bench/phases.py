"""The benchmark's phases (bench/harness.py runs them in order): upstream bytes of cold fleets, fresh
hosts beside the floor script, the no-op re-run, verify, onboarding, and the fan-out."""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import check_spec_latency
from runner import (
    FLOOR,
    FLOOR_STAGES,
    ROOT,
    SAMPLE_S,
    BenchError,
    ansible_env,
    changed,
    floor_env,
    forwarded_bytes,
    host_ip,
    mirror_served_bytes,
    playbook,
    sandbox,
    say,
    ssh,
    stage_cpu_s,
    task_cpu_s,
    work_dir,
)

from gpuenv.stages import STAGES, stage_times
from testbed.sandbox import cache, fleet


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
    def playbook(
        self, label: str, limit: list[str] | None = None, sample_hosts: list[str] | None = None, **extra: str
    ) -> dict[str, Any]:
        # Each run starts with empty caches of built driver modules, environments and unpacked cuDNNs unless it names
        # its own (the fleet phase): a fresh host beside the floor builds as a fleet's first host does,
        # never restoring what an earlier pair left in the machine's caches.
        with (
            tempfile.TemporaryDirectory(prefix="dkms-", dir=work_dir()) as modules,
            tempfile.TemporaryDirectory(prefix="envs-", dir=work_dir()) as envs,
            tempfile.TemporaryDirectory(prefix="cudnn-", dir=work_dir()) as cudnns,
        ):
            extra.setdefault("nvidia_driver_build_cache_dir", modules)
            extra.setdefault("pytorch_env_build_cache_dir", envs)
            extra.setdefault("cudnn_build_cache_dir", cudnns)
            return playbook(self.log_dir, label, {**self.extra_vars, **extra}, limit, sample_hosts=sample_hosts)

    def fresh_fleet(
        self, count: int, *, downloads: Path | None = None, snapshot: Path | None = None, kernel: bool = False
    ) -> None:
        env = ansible_env()
        if downloads is not None:
            env["GPUENV_SANDBOX_DOWNLOADS"] = str(downloads)
        log = self.log_dir / "sandbox.log"
        sandbox("down", env=env, log=log)  # which also drops the mirror's log, counted per phase
        args = ["up", str(count), "--os", "debian12"]
        if snapshot:
            args += ["--snapshot", str(snapshot)]
        elif kernel or self.settings["driver_mode"] == "full":
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
            merge_downloads(downloads, fleet.downloads_dir())
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
        # The same host once more with every stage run (the stamp ignored, roles/converged): what a
        # no-op cost before the stamp, and what one costs after any change on the host.
        full = self.playbook("noop-every-stage", limit=["sb1"], converged_skip="false")
        say(f"no-op with every stage run: {full['measured_wall_s']:.1f} s, changed {changed(full)}")
        return {
            "every_stage": {
                "wall_s": full["measured_wall_s"],
                "changed": changed(full),
                "tasks": len(full["tasks"]),
                "controller_cpu_s": full["controller_cpu_s"],
                "hosts_cpu_s": full["hosts_cpu_s"],
            },
            "runs": walls,
            "controller_cpu_s": records[-1]["controller_cpu_s"],
            "hosts_cpu_s": records[-1]["hosts_cpu_s"],
            "median_s": round(statistics.median(walls), 1),
            "changed": [changed(r) for r in records],
            "changed_tasks": sorted({t for r in records for h in r["hosts"].values() for t in h["changed_tasks"]}),
            "tasks": len(records[-1]["tasks"]),
            "stages": stage_times(records[-1]),
            "slowest_tasks": [{"name": t["name"], "wall_s": t["wall_s"]} for t in slowest],
            # Records written before the timing callback measured CPU have no cpu_s.
            "cpu_tasks": [
                {"name": t["name"], "cpu_s": t["cpu_s"]}
                for t in sorted(records[-1]["tasks"], key=lambda t: -t.get("cpu_s", 0.0))[:8]
                if "cpu_s" in t
            ],
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
                side: {stage: round(statistics.median(p[side]["stages"][stage] for p in runs), 1) for stage in STAGES}
                for side in ("gpuenv", "floor")
            },
        }

    def floor(self, name: str, label: str, *, overlap: bool = False) -> dict[str, Any]:
        """bench/floor.sh on a fresh host; overlap: the driver's install in the background while the
        other stages run (FLOOR_OVERLAP=1, bench/overlap.py)."""
        ip = host_ip(name)
        subprocess.run(  # noqa: S603
            ["scp", "-q", *fleet.ssh_options(), str(FLOOR), f"root@{ip}:/root/floor.sh"],  # noqa: S607
            check=True,
        )
        env = floor_env(self.plan, self.settings["driver_mode"]) | ({"FLOOR_OVERLAP": "1"} if overlap else {})
        out, wall = ssh(ip, "bash /root/floor.sh", env=env)
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

    # --- 8. one build for the fleet ---
    def fleet(self, sizes: list[int]) -> dict[str, Any]:
        """N fresh identical hosts provisioned at once in full mode (the driver's DKMS build), each
        size with an empty cache of built modules: the first host builds, the others wait for its
        module and install it. Each host's own CPU seconds are counted (bench/runner.py hosts_cpu_s),
        since on this machine's few cores the wall time is the sum of all hosts' work."""
        results: dict[str, Any] = {"sizes": {}}
        for n in sizes:
            sandbox("down", log=self.log_dir / "sandbox.log")  # the last size's hosts hold disk the next needs
            free = shutil.disk_usage(work_dir()).free / 1e9
            need = fleet_disk_gb(n)
            if free < need:
                results["sizes"][str(n)] = {"skipped": f"needs about {need:.0f} GB of disk, {free:.0f} GB free"}
                say(f"fleet: {n} hosts skipped, {results['sizes'][str(n)]['skipped']}")
                continue
            say(f"fleet: {n} fresh identical host(s) at once, full mode, an empty cache of built modules")
            self.fresh_fleet(n, kernel=True)
            names = [f"sb{i}" for i in range(1, n + 1)]
            cache_dir = Path(tempfile.mkdtemp(prefix=f"dkms-{n}-", dir=work_dir()))
            env_cache_dir = Path(tempfile.mkdtemp(prefix=f"envs-{n}-", dir=work_dir()))
            cudnn_cache_dir = Path(tempfile.mkdtemp(prefix=f"cudnn-{n}-", dir=work_dir()))
            try:
                record = self.playbook(
                    f"fleet-{n}",
                    sample_hosts=names,
                    nvidia_driver_mode="full",
                    nvidia_driver_build_cache_dir=str(cache_dir),
                    pytorch_env_build_cache_dir=str(env_cache_dir),
                    cudnn_build_cache_dir=str(cudnn_cache_dir),
                )
                before, after = record["cpu_samples"][0][1], record["cpu_samples"][-1][1]
                built_by = sorted({json.loads(p.read_text())["built_by"] for p in cache_dir.glob("*.json")})
                env_records = [json.loads(p.read_text()) for p in env_cache_dir.glob("*.json")]
                env_built_by = sorted({r["built_by"] for r in env_records})
                env_entry_gb = round(sum(r["size"] for r in env_records) / 1e9, 2)
                cudnn_records = [json.loads(p.read_text()) for p in cudnn_cache_dir.glob("*.json")]
                cudnn_built_by = sorted({r["built_by"] for r in cudnn_records})
                cudnn_entry_gb = round(sum(r["size"] for r in cudnn_records) / 1e9, 2)
            finally:
                for made in (cache_dir, env_cache_dir, cudnn_cache_dir):
                    shutil.rmtree(made, ignore_errors=True)
            cpu = {h: round(after[h] - before[h], 1) for h in names}
            first = built_by[0] if built_by else names[0]
            further = {h: c for h, c in cpu.items() if h != first}
            results["sizes"][str(n)] = {
                "wall_s": record["measured_wall_s"],
                "changed": changed(record),
                "controller_cpu_s": record["controller_cpu_s"],
                "hosts_cpu_s": cpu,
                "built_by": built_by,
                # The environment's builder and the size of what it handed the others.
                "env_built_by": env_built_by,
                "env_entry_gb": env_entry_gb,
                # cuDNN's unpacker, and the size of its unpacked copy's tar.
                "cudnn_built_by": cudnn_built_by,
                "cudnn_entry_gb": cudnn_entry_gb,
                "first_host": first,
                "first_host_cpu_s": cpu[first],
                "further_max_ratio": round(max(further.values()) / cpu[first], 3) if further and cpu[first] else None,
                "stages": stage_times(record),
                # Each host's CPU by stage: what a further host still pays where the first builds
                # (its CUDA trees, cuDNN and environment), the measure of what sharing those would save.
                "stage_cpu_s": stage_cpu_s(record),
                # And the first further host's costliest tasks: where its remaining seconds are.
                "further_host_tasks": task_cpu_s(record, min(further)) if further else [],
                "sample_s": SAMPLE_S,
            }
            say(
                f"fleet: {n} host(s) in {record['measured_wall_s']:.0f} s; CPU {first} (built) {cpu[first]:.0f} s, "
                + ", ".join(f"{h} {c:.0f} s" for h, c in further.items())
            )
        sandbox("down", log=self.log_dir / "sandbox.log")
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
        if "fleet" in phases:
            with self.phase("fleet"):
                self.results["fleet"] = self.fleet(s["fleet_sizes"])
        sandbox("down", log=self.log_dir / "sandbox.log")
        if "checkspec" in phases:
            with self.phase("checkspec"):
                self.results["checkspec"] = check_spec_latency.measure(s["checkspec_runs"])


# A full-mode sandbox host's own layer, with the kernel's headers and DKMS's tree beside it (4 hosts
# held 28 GB, 2026-12-07); the fleet phase skips a size that does not fit, saying so.
FLEET_HOST_GB = 7.0
# The environment's tar in the controller's cache, and each further host's copy of it beside the
# environment it unpacks (the copies land at once).
FLEET_ENV_COPY_GB = 2.5


def fleet_disk_gb(hosts: int) -> float:
    return FLEET_HOST_GB * hosts + FLEET_ENV_COPY_GB * hosts + 2


def merge_downloads(src: Path, dest: Path) -> None:
    """What a cold run fetched warms the machine's own cache for the runs after it."""
    for path in src.rglob("*"):
        # Not its log, and not a file a failed run left half-fetched.
        if path.is_file() and path.name != "upstream.jsonl" and path.suffix != ".part":
            target = dest / path.relative_to(src)
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                path.replace(target)
    cache.clear(src)
