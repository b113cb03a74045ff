"""Wall time of `gpuenv check-spec` as a user runs it: a new process each time, so Python start-up,
imports and loading the compatibility data all count.

    .venv/bin/python bench/check_spec_latency.py [--runs 30]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STACKS = {
    "compatible": REPO / "inventory/example/group_vars/gpu_hosts.yml",
    "incompatible": REPO / "docs/examples/rtx5090-on-torch-2.5.yml",
}


def measure(runs: int) -> dict[str, dict[str, float]]:
    """Per stack: runs, min, median and max wall time in milliseconds."""
    gpuenv = REPO / ".venv/bin/gpuenv"
    if not gpuenv.exists():
        gpuenv = Path(sys.executable).parent / "gpuenv"
    results = {}
    for label, path in STACKS.items():
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run([str(gpuenv), "check-spec", str(path)], capture_output=True, check=False)  # noqa: S603 - our own CLI
            times.append((time.perf_counter() - start) * 1000)
        results[label] = {
            "runs": runs,
            "min_ms": round(min(times), 1),
            "median_ms": round(statistics.median(times), 1),
            "max_ms": round(max(times), 1),
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    print("| stack | runs | min (ms) | median (ms) | max (ms) |\n|---|---|---|---|---|")
    for label, r in measure(args.runs).items():
        print(f"| {label} | {r['runs']} | {r['min_ms']:.0f} | {r['median_ms']:.0f} | {r['max_ms']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
