#!/usr/bin/env python3
"""What overlapping the stages could buy at best (the overlap lever), measured on the floor:
bench/floor.sh as it is (one stage after another) beside the same script with the driver's apt
install and DKMS build in the background while the CUDA, cuDNN and environment stages run
(FLOOR_OVERLAP=1), on two identical fresh sandbox hosts, alternating which goes first.

    bench/overlap.py [--quick] [--pairs N]

--quick: the driver's user space only (no DKMS build). Prints each pair and the medians; the
figures go into docs/benchmarks.md by hand. As root, with nothing else
on the sandbox (it boots instance 0's hosts, as bench/run does).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import plan_for  # bench/ is not a package: its modules import each other by name
from phases import Bench
from runner import BenchError, sandbox, say, stack_plan, work_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/overlap.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the driver's user space only (no DKMS build)")
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args(argv)
    log_dir = work_dir() / "logs" / ("overlap-" + dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S"))
    log_dir.mkdir(parents=True, exist_ok=True)
    bench = Bench(plan_for(args.quick), stack_plan(), log_dir)
    runs = []
    try:
        sandbox("mirror", "build", log=log_dir / "sandbox.log")
        for i in range(args.pairs):
            bench.fresh_fleet(2)
            order = [False, True] if i % 2 == 0 else [True, False]
            pair = {}
            for overlap in order:
                side = "overlapped" if overlap else "in sequence"
                pair[side] = bench.floor(
                    "sb2" if overlap else "sb1", f"pair{i + 1}-{side.replace(' ', '-')}", overlap=overlap
                )
                say(f"pair {i + 1}: the floor {side} took {pair[side]['wall_s']:.0f} s")
            runs.append(pair)
    except BenchError as exc:
        print(f"overlap: error: {exc}", file=sys.stderr)
        return 1
    finally:
        sandbox("down", log=log_dir / "sandbox.log")
    seq = statistics.median(p["in sequence"]["wall_s"] for p in runs)
    ovl = statistics.median(p["overlapped"]["wall_s"] for p in runs)
    summary = {
        "mode": "quick" if args.quick else "full",
        "runs": runs,
        "in_sequence_median_s": seq,
        "overlapped_median_s": ovl,
    }
    (log_dir / "overlap.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"floor in sequence {seq:.0f} s, overlapped {ovl:.0f} s (median of {len(runs)}): {ovl / seq:.2f} x; {log_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
