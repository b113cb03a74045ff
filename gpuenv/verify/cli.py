"""gpuenv verify: prove on a host that the declared stack is the one that loads and runs.

Needs nothing beyond the standard library and torch (nvidia-ml-py is used when present), so that a
host runs it with its environment's own Python, as the one file the gpu_verify role installs:

    /opt/gpuenv/envs/default/bin/python gpuenv_verify.pyz --stack /etc/gpuenv/stack.json

`gpuenv verify` on the controller is the same code. --stack takes the resolved stack the preflight
published (gpu_stack_resolved: torch, torch_cuda, torch_cudnn, torch_min_driver, cuda, cudnn),
which the controller worked out from the compatibility data, so verify carries no data of its own.

Exit 0: every check passed (warnings allowed); 1: a check failed; 2: verify could not run.
Every check has a stable id, a status (pass, fail, warn, skip), what it observed, what it expected,
and a fix hint when it fails. No check passes without having observed what it claims.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from gpuenv.verify import outputs, plan
from gpuenv.verify.base import Context
from gpuenv.verify.model import Check, could_not_run, stack_id, to_report


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuenv verify", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--stack", help="expectations file (JSON) the controller wrote for this host (-: read from stdin)"
    )
    parser.add_argument(
        "--json", dest="json_out", help="write the JSON report here (-: to stdout, the lines to stderr)"
    )
    parser.add_argument("--junit", help="write JUnit XML here")
    parser.add_argument("--prom", help="write Prometheus text format here (node_exporter textfile collector)")
    parser.add_argument("--require-gpu", action="store_true", help="GPU checks fail instead of skipping")
    parser.add_argument("--no-distributed", action="store_true", help="skip the multi-process all-reduce")
    parser.add_argument(
        "--cpu-selftest",
        action="store_true",
        help="run the GPU compute checks' code on the CPU device instead of the checks (tests verify itself "
        "with this environment's torch; proves nothing about a GPU)",
    )
    parser.add_argument(
        "--run", help="an id of the run this report belongs to (gpuenv report --run marks others stale)"
    )
    parser.add_argument(
        "--python-missing",
        metavar="PATH",
        help=argparse.SUPPRESS,  # gpuenv-verify: the environment's Python PATH is gone; report that
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    host = os.uname().nodename
    expect: dict[str, Any] = {}
    checks: list[Check] = []
    if args.stack:
        try:
            expect = json.loads(sys.stdin.read() if args.stack == "-" else Path(args.stack).read_text())
        except (OSError, ValueError) as exc:
            checks = could_not_run(
                f"cannot read the stack to check against, {args.stack}",
                str(exc),
                "run playbooks/site.yml (gpu_verify writes /etc/gpuenv/stack.json), or pass --stack FILE",
            )
    if not checks and args.python_missing:
        checks = could_not_run(
            f"the environment's Python {args.python_missing} does not exist",
            f"{args.python_missing}: no such file (the environment was removed or never built)",
            "rebuild the environment: ansible-playbook playbooks/site.yml --limit <host> (stage pytorch_env)",
        )
    if not checks:
        checks = _checks_or_why(expect, args)
    report = to_report(checks, host, stack=stack_id(expect), run=args.run)
    # With --json -, the report is the standard output and the lines for people go to stderr.
    outputs.print_lines(report, checks, sys.stderr if args.json_out == "-" else sys.stdout)
    outputs.write(report, checks, host, args.json_out, args.junit, args.prom)
    return int(report["exit_code"])


def _checks_or_why(expect: dict[str, Any], args: argparse.Namespace) -> list[Check]:
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - only here: --help needs no torch
    except Exception as exc:
        return could_not_run(
            f"cannot import torch with {sys.executable}",
            f"{type(exc).__name__}: {exc}",
            "run verify with the environment's own Python (/opt/gpuenv/envs/<name>/bin/python); if it fails "
            "there too, rebuild the environment with playbooks/site.yml",
        )
    try:
        if args.cpu_selftest:
            return plan.cpu_selftest(torch)
        ctx = Context(expect=expect, require_gpu=args.require_gpu, torch=torch)
        return plan.run_checks(ctx, distributed=not args.no_distributed)
    except Exception as exc:  # verify itself broke: say so in the report instead of leaving none
        return could_not_run(
            f"gpuenv verify itself failed ({type(exc).__name__})",
            f"{type(exc).__name__}: {exc}",
            "this is a gpuenv bug: keep this report and the output above when reporting it",
        )
