"""gpuenv verify: prove on a host that the declared stack is the one that loads and runs.

Needs nothing beyond the standard library and torch (nvidia-ml-py is used when present), so that a
host runs it with its environment's own Python, as the one file the gpu_verify role installs:

    /opt/gpuenv/envs/default/bin/python gpuenv_verify.pyz --stack /etc/gpuenv/stack.json

`gpuenv verify` on the controller is the same code. --stack takes the host's record of its stack
(/etc/gpuenv/stack.json: {"declared": ..., "resolved": ...}, role stack_record) or a resolved stack
alone (gpu_stack_resolved: torch, torch_cuda, torch_cudnn, torch_min_driver, cuda, cudnn), which the
controller worked out from the compatibility data, so verify carries no data of its own.

--drift adds what differs on the host from that stack (gpuenv.drift: the records, the links, the
environment against its lock, NVIDIA's held packages, the daemons), as `drift.*` checks in the same
report; playbooks/drift.yml runs it with the inventory's stack on stdin.

Exit 0: every check passed (warnings allowed); 1: a check failed; 2: verify could not run.
Every check has a stable id, a status (pass, fail, warn, skip), what it observed, what it expected,
and a fix hint when it fails. No check passes without having observed what it claims.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import stat
import sys
from typing import Any

from gpuenv.verify import deadline, outputs, plan
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
        "--drift",
        action="store_true",
        help="also report what differs on this host from the stack: its records, links, environment, "
        "held packages and daemons (drift.* checks)",
    )
    parser.add_argument(
        "--drift-places",
        metavar="JSON",
        help="with --drift: gpuenv_converged's comparison of the places site.yml writes with the stamp of "
        "the last complete run (playbooks/drift.yml passes it)",
    )
    parser.add_argument(
        "--run", help="an id of the run this report belongs to (gpuenv report --run marks others stale)"
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=deadline.RUN_DEADLINE,
        metavar="SECONDS",
        help=f"stop with a failing report (exit 2) when the whole run takes longer (default {deadline.RUN_DEADLINE:g})",
    )
    parser.add_argument(
        "--check-deadline",
        type=float,
        default=deadline.CHECK_DEADLINE,
        metavar="SECONDS",
        help="stop with a failing report (exit 2) when the torch import or one check takes longer "
        f"(default {deadline.CHECK_DEADLINE:g})",
    )
    parser.add_argument(
        "--python-missing",
        metavar="PATH",
        help=argparse.SUPPRESS,  # gpuenv-verify: the environment's Python PATH is gone; report that
    )
    return parser


# The most a stack file holds: the resolved stack is well under a kilobyte.
MAX_STACK_BYTES = 1 << 20


def _usage_problem(args: argparse.Namespace) -> str | None:
    for option, value in (("--deadline", args.deadline), ("--check-deadline", args.check_deadline)):
        if not math.isfinite(value) or value <= 0:
            return f"{option} {value:g}: give a number of seconds above 0"
    for option, path in (("--json", args.json_out), ("--junit", args.junit), ("--prom", args.prom)):
        if path and path != "-" and (problem := outputs.path_problem(option, path)):
            return problem
    if args.drift_places is not None:
        if not args.drift:
            return "--drift-places goes with --drift"
        try:
            places = json.loads(args.drift_places)
        except ValueError as exc:
            return f"--drift-places: not JSON ({exc})"
        if not isinstance(places, dict):
            return "--drift-places: give the gpuenv_converged module's result, a JSON object"
    return None


def read_stack(source: str) -> dict[str, Any]:
    """The stack to check against, from a regular file or stdin ("-"), at most MAX_STACK_BYTES:
    ValueError (or OSError) says why it cannot be one. A FIFO would block the run, /dev/zero fill
    the memory, a deeply nested document exhaust the parser's recursion."""
    if source == "-":
        data = sys.stdin.buffer.read(MAX_STACK_BYTES + 1)
    else:
        fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, and is refused below
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError(f"{source} is not a regular file")
            data = f.read(MAX_STACK_BYTES + 1)
    if len(data) > MAX_STACK_BYTES:
        raise ValueError(f"more than {MAX_STACK_BYTES} bytes; a stack file is under a kilobyte")
    try:
        loaded = json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply to be a stack") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"a JSON {type(loaded).__name__}, not an object")
    # The host's record holds the declared stack beside the resolved one; verify checks the resolved.
    resolved = loaded.get("resolved")
    if "declared" in loaded and not isinstance(resolved, dict):
        raise ValueError("a stack record without its resolved stack: run playbooks/site.yml to write it again")
    return resolved if isinstance(resolved, dict) else loaded


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    problem = _usage_problem(args)
    if problem:
        print(f"gpuenv verify: {problem}", file=sys.stderr)
        return 2
    host = os.uname().nodename
    expect: dict[str, Any] = {}
    checks: list[Check] = []
    if args.stack:
        try:
            expect = read_stack(args.stack)
        except (OSError, ValueError) as exc:
            checks = could_not_run(
                f"cannot read the stack to check against, {args.stack}",
                str(exc),
                "run playbooks/site.yml (stack_record writes /etc/gpuenv/stack.json), or pass --stack FILE",
            )
    if not checks and args.python_missing:
        checks = could_not_run(
            f"the environment's Python {args.python_missing} does not exist",
            f"{args.python_missing}: no such file (the environment was removed or never built)",
            "rebuild the environment: ansible-playbook playbooks/site.yml --limit <host> (stage pytorch_env)",
        )

    def finish(found: list[Check]) -> int:
        report = to_report(found, host, stack=stack_id(expect), run=args.run)
        # With --json -, the report is the standard output and the lines for people go to stderr.
        outputs.print_lines(report, found, sys.stderr if args.json_out == "-" else sys.stdout)
        try:
            outputs.write(report, found, host, args.json_out, args.junit, args.prom)
        except outputs.OutputError as exc:
            print(f"gpuenv verify: {exc}", file=sys.stderr)
            return 2
        return int(report["exit_code"])

    if not checks:
        watchdog = deadline.Watchdog(total=args.deadline, per_check=args.check_deadline)
        watchdog.watch(finish)
        checks = _checks_or_why(expect, args, watchdog)
        watchdog.stop()
    if args.drift and expect:
        from gpuenv import drift  # noqa: PLC0415 - only with --drift

        places = json.loads(args.drift_places) if args.drift_places else None
        checks = checks + drift.host_checks(expect, places)
    return finish(checks)


def _checks_or_why(expect: dict[str, Any], args: argparse.Namespace, watchdog: deadline.Watchdog) -> list[Check]:
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - only here: --help needs no torch
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a torch that raises SystemExit on import must not end verify without a report
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
        return plan.run_checks(ctx, distributed=not args.no_distributed, watchdog=watchdog)
    except Exception as exc:  # verify itself broke: say so in the report instead of leaving none
        return could_not_run(
            f"gpuenv verify itself failed ({type(exc).__name__})",
            f"{type(exc).__name__}: {exc}",
            "this is a gpuenv bug: keep this report and the output above when reporting it",
        )
