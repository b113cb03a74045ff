"""gpuenv's provisioning benchmarks on the sandbox fleet (run through bench/run).

    bench/run              the full run: 3 pairs, every figure; writes docs/benchmarks.md's
                           generated section, docs/benchmarks/results.json and the charts
    bench/run --quick      one pair and fewer repeats, the driver's user space only; writes its
                           own section of docs/benchmarks.md and docs/benchmarks/quick/
    bench/run --dry-run    no hosts: checks the plan, the floor script, the stack, the report and
                           the charts (from sample figures); ./scripts/test runs this
    bench/run --report-only docs/benchmarks/results.json
                           no hosts: the report and charts of an earlier run again, judged
                           against today's targets (its figures and commit unchanged)

What is measured, each against the sandbox stack (inventory/sandbox) with the driver in
full mode (its DKMS build), on hosts whose root has Debian's kernel package as a workstation has:
  bytes     upstream bytes of a cold fleet of 1 and of 4 hosts (each with an empty download cache)
  pairs     fresh host to verified stack: site.yml beside bench/floor.sh on an identical fresh host,
            warm caches, alternating which goes first; the ratio is of the medians
  noop      site.yml again on the provisioned host: wall time and changed tasks
  verify    gpuenv-verify alone on that host (no GPU)
  fanout    site.yml (no-op, verify included) on 1, 2, 4, 8 hosts started from its snapshot
  fleet     site.yml on 1, 4 and 8 fresh identical hosts at once (--quick: 1 and 4), full mode and
            an empty cache of built modules: the first host builds the driver's module, the others
            install it; each host's own CPU seconds, the controller's CPU and the wall time
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
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import charts  # bench/ is not a package: its modules import each other by name
from phases import Bench
from runner import FLOOR, ROOT, BenchError, floor_env, sandbox, say, stack_plan, work_dir

from testbed.sandbox import fleet

DOCS = ROOT / "docs/benchmarks.md"
DOCS_DIR = ROOT / "docs/benchmarks"
BEGIN = "<!-- bench/run: begin (generated; edit bench/harness.py, not this section) -->"
END = "<!-- bench/run: end -->"
# The quick run's own section and charts (docs/benchmarks/quick/), after the full run's.
QUICK_DIR = DOCS_DIR / "quick"
QUICK_BEGIN = "<!-- bench/run --quick: begin (generated; edit bench/harness.py, not this section) -->"
QUICK_END = "<!-- bench/run --quick: end -->"
PHASES = ("bytes", "pairs", "noop", "verify", "onboard", "fanout", "fleet", "checkspec")
# The targets ("Faster than by hand"): a fresh host in at most 0.8 x the floor's time, a no-op
# under 10 s, under 2 s of the controller's CPU per no-op host; the earlier ones that were met stay.
TARGETS = {
    "ratio": 0.8,
    "noop_s": 10.0,
    "controller_cpu_per_host_s": 2.0,
    "verify_s": 5.0,
    "checkspec_s": 1.0,
    "bytes_factor": 1.1,
    # One build for the fleet: each further identical fresh host's own CPU against the first's.
    "further_host_cpu_ratio": 0.25,
}
# A provisioned sandbox host's own layer (torch's environment, two CUDA trees, the driver) is about
# 7.5 GB; the cold phase's empty download cache fills to 3.3 GB; the fan-out's snapshot is one more
# host. A disk that fills mid-run fails pip with ENOSPC a quarter of an hour in, so it is checked first.
HOST_GB = 8.0
EXTRA_GB = 4.0


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
        # Fresh identical hosts at once, always in full mode (the DKMS build is what they share);
        # a size the disk cannot hold is skipped, saying so.
        "fleet_sizes": [1, 4] if quick else [1, 4, 8],
        "checkspec_runs": 10 if quick else 30,
        "phases": list(PHASES),
    }


def settings_for(quick: bool, only: str | None = None, pairs: int | None = None) -> dict[str, Any]:
    """The run's plan with the command line's choices: the phases --only names (in their order),
    and --pairs fresh-host pairs (one full-mode pair takes about 8 minutes here, three 25)."""
    bench = plan_for(quick)
    if only:
        unknown = set(only.split(",")) - set(PHASES)
        if unknown:
            raise BenchError(f"unknown phase(s) {', '.join(sorted(unknown))}; phases: {', '.join(PHASES)}")
        bench["phases"] = [p for p in PHASES if p in only.split(",")]
    if pairs is not None:
        if pairs < 1:
            raise BenchError(f"--pairs {pairs}: measure at least one pair (a fresh host each for gpuenv and the floor)")
        bench["pairs"] = pairs
    return bench


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
    elif out_dir == QUICK_DIR:
        replace_section(DOCS, section, image_prefix="benchmarks/quick/", markers=(QUICK_BEGIN, QUICK_END))
    else:
        (out_dir / "benchmarks.md").write_text(section + "\n")
        say(f"results in {out_dir} (docs/ untouched: --out named another directory)")


def replace_section(doc: Path, section: str, image_prefix: str, markers: tuple[str, str] = (BEGIN, END)) -> None:
    """Write a run's section between its markers; a section not there yet goes after the full run's
    (or, for the first, after the page's opening paragraph)."""
    begin, end = markers
    section = re.sub(r"\]\((?!http)([^)]+\.png)\)", rf"]({image_prefix}\1)", section)
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    block = f"{begin}\n{section.rstrip()}\n{end}"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    elif END in text:
        text = text[: text.index(END) + len(END)] + f"\n\n{block}" + text[text.index(END) + len(END) :]
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
        wanted = ("ratio", "changed", "fan-out", "upstream", "check-spec", "verify", "One build for the fleet")
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
    parser.add_argument(
        "--pairs", type=int, help="fresh-host pairs to measure (default: 3 for the full run, 1 for --quick)"
    )
    parser.add_argument("--out", type=Path, help="where results go (default: docs/ for the full run)")
    parser.add_argument(
        "--report-only",
        type=Path,
        metavar="RESULTS_JSON",
        help="measure nothing: write the report and charts of an earlier run's results.json again (after the "
        "targets or the report changed), into docs/ for a full run's, docs/benchmarks/quick/ for a quick run's",
    )
    args = parser.parse_args(argv)
    try:
        if args.dry_run:
            return dry_run()
        if args.report_only:
            results = json.loads(args.report_only.read_text())
            quick = results["plan"]["mode"] == "quick"
            write_outputs(results, args.out or (QUICK_DIR if quick else DOCS_DIR))
            return 0
        bench = settings_for(args.quick, args.only, args.pairs)
        out = args.out or (QUICK_DIR if args.quick else DOCS_DIR)
        run(bench, out)
    except BenchError as exc:
        print(f"bench: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
