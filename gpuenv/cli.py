"""The `gpuenv` command."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from gpuenv import __version__, fleetfacts, fleetreport, verify
from gpuenv.checkspec import check_file
from gpuenv.compat import load
from gpuenv.doctor import EXIT_ERROR
from gpuenv.doctor import report as doctor_report
from gpuenv.doctor.driver import Gpu
from gpuenv.doctor.host import DoctorError, Host, root_runner, system_runner
from gpuenv.doctor.run import Options, examine
from gpuenv.report import format_text
from gpuenv.rules import check
from gpuenv.stack import parse_stack
from gpuenv.suggest import EXIT_INVALID, Request, suggest
from gpuenv.suggest.inputs import InputError, parse_constraints, parse_gpus
from gpuenv.suggest.output import as_json, invalid, text


def _check_spec(args: argparse.Namespace) -> int:
    result = check_file(Path(args.file), args.gpu)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_text(result, verbose_sources=not args.brief))
    return int(result["exit_code"])


def _profiles(args: argparse.Namespace) -> int:
    data = load()
    rows: list[dict[str, Any]] = []
    for name, profile in sorted(data.profiles.items()):
        report = check(parse_stack({"profile": name}, data), data)
        rows.append(
            {"name": name, "description": profile.description, "stack": report.resolved, "gpus": list(profile.gpus)}
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        s = row["stack"]
        print(f"{row['name']}: {row['description']}")
        print(
            f"    driver {s['driver']}, CUDA {s['cuda']}, cuDNN {s['cudnn']}, Python {s['python']}, "
            f"torch {s['torch']}+{s['torch_variant']}; checked for compute capability {', '.join(row['gpus'])}"
        )
    return 0


def _report(args: argparse.Namespace) -> int:
    try:
        since = fleetreport.parse_since(args.since) if args.since else None
        run = None if args.all_runs else (args.run or fleetreport.last_run(Path(args.dir)))
        hosts = fleetreport.load(Path(args.dir), since, run)
    except fleetreport.ReportError as exc:
        print(f"gpuenv report: {exc}", file=sys.stderr)
        return 2
    text = fleetreport.markdown(hosts)
    print(text, end="")
    if args.md:
        Path(args.md).write_text(text)
    if args.html:
        Path(args.html).write_text(fleetreport.html_page(hosts))
    return 0


def _suggest(args: argparse.Namespace) -> int:
    data = load()
    gpus, problems = parse_gpus(args.gpu or [], data)
    notes: list[str] = []
    os_name: str | None = args.os
    keep: tuple[str, str, list[str]] | None = None  # a driver the hosts could keep, for that alternative
    if args.inventory:
        try:
            fleet = fleetfacts.read(Path(args.inventory), Path(args.facts), data)
        except fleetfacts.InventoryError as exc:
            problems.append(str(exc))
        else:
            known = {g.label for g in gpus}
            gpus += [g for g in fleet.gpus if g.label not in known]
            notes += fleet.notes
            if os_name is None and fleet.os:
                os_name = fleet.os
                notes.append(f"--os {fleet.os}: what every recorded host runs")
            if fleet.driver_branch:
                keep = (fleet.driver_branch, "what the fleet's hosts run now (their nvidia_driver facts)", [])
    if not gpus and not problems:
        problems.append(
            "no GPU given: name them with --gpu MODEL_OR_CC (repeatable), or read a fleet's with --inventory"
        )
    try:
        constraints = parse_constraints(
            data,
            os=os_name,
            driver=args.driver,
            max_driver_branch=args.max_driver_branch,
            torch=args.torch,
            python=args.python,
            cuda=args.cuda,
            backend=args.backend,
            system_cudnn=not args.no_system_cudnn,
            toolkit=not args.no_toolkit,
        )
    except InputError as exc:
        problems += exc.problems
    if problems:
        print(invalid(problems, args.json), file=sys.stdout if args.json else sys.stderr)
        return EXIT_INVALID
    if keep is None and constraints.os and data.os[constraints.os].get("driver_branch"):
        entry = data.os[constraints.os]
        keep = (str(entry["driver_branch"]), f"{constraints.os}'s own packages", [str(entry["source"])])
    result = suggest(data, Request(gpus, constraints, keep, notes))
    print(as_json(result, data) if args.json else text(result, data), end="" if not args.json else "\n")
    return int(result["exit_code"])


def _doctor(args: argparse.Namespace) -> int:
    data = load()
    given, problems = parse_gpus(args.gpu or [], data)
    if args.depth < 0:
        problems.append(f"--depth {args.depth}: give how many directory levels below each home to search, 0 or more")
    if not math.isfinite(args.verify_timeout) or args.verify_timeout <= 0:
        problems.append(f"--verify-timeout {args.verify_timeout:g}: give the seconds verify may take per environment")
    if problems:
        print("\n".join(f"gpuenv doctor: {p}" for p in problems), file=sys.stderr)
        return EXIT_ERROR
    root = Path(args.root)
    elsewhere = root.resolve() != Path("/")
    # Under another root, nvidia-smi, modinfo, lspci, nvcc and the environments' Pythons would run on
    # this machine and describe it: only files, the loader's cache and the package databases are read.
    notes = [f"--root {root}: files, loader cache and package databases read; no command of the tree run, verify "
             "neither (they would describe this machine)"] if elsewhere else []  # fmt: skip
    options = Options(
        gpus=[Gpu(g.label, g.cc, "--gpu") for g in given],
        homes=args.home or [],
        envs=args.env or [],
        depth=args.depth,
        verify=not (args.no_verify or elsewhere),
        verify_timeout=args.verify_timeout,
        notes=notes,
    )
    try:
        host = Host(root=root, runner=root_runner(root) if elsewhere else system_runner)
        found = examine(host, data, options)
    except DoctorError as exc:
        print(f"gpuenv doctor: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(doctor_report.as_json(found, data) if args.json else doctor_report.text(found, data), end="")
    return found.exit_code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuenv", description="Declarative provisioning of deep-learning GPU hosts.")
    parser.add_argument("--version", action="version", version=f"gpuenv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    spec = sub.add_parser(
        "check-spec",
        help="check a stack file for compatibility",
        description="Check a stack file (a group_vars file with gpu_stack) against gpuenv's compatibility data. "
        "Exit 0: compatible (warnings may be printed); 1: incompatible; 2: the file cannot be read or "
        "does not match the schema.",
    )
    spec.add_argument("file", help="the stack file, e.g. inventory/example/group_vars/gpu_hosts.yml")
    spec.add_argument("--json", action="store_true", help="print a machine-readable result")
    spec.add_argument(
        "--gpu",
        action="append",
        metavar="MODEL_OR_CC",
        help="check against this GPU instead of the file's gpu key (repeatable)",
    )
    spec.add_argument("--brief", action="store_true", help="leave out the source of each finding")
    spec.set_defaults(func=_check_spec)

    sug = sub.add_parser(
        "suggest",
        help="the newest stack that passes every rule for some GPUs, and its alternatives",
        description="Print the newest stack that passes every check-spec rule for all the GPUs under the "
        "constraints, as a ready stack file (check-spec accepts it), with what bound each choice and the "
        "alternatives that trade one thing for another. Exit 0: a stack (or one per GPU group) was found; 1: no "
        "stack satisfies the constraints (the reasons are printed per bound); 2: bad input.",
    )
    sug.add_argument(
        "--gpu",
        action="append",
        metavar="MODEL_OR_CC",
        help='a GPU model ("RTX 3060") or compute capability (repeatable)',
    )
    sug.add_argument("--inventory", metavar="DIR", help="suggest for the GPUs recorded on this inventory's gpu_hosts")
    sug.add_argument(
        "--facts",
        metavar="DIR",
        default="reports/facts",
        help="the hosts' saved local facts for --inventory (ansible -m setup --tree DIR; default reports/facts)",
    )
    sug.add_argument("--os", help="the hosts' OS (debian12, debian13, ubuntu2204, ubuntu2404, rhel9)")
    drivers = sug.add_mutually_exclusive_group()
    drivers.add_argument("--driver", help="keep this driver: a branch (535) or version (535.247.01)")
    drivers.add_argument("--max-driver-branch", metavar="BRANCH", help="the newest driver branch allowed (535)")
    sug.add_argument("--torch", metavar="SPEC", help="torch bounds: ==2.5.1, >=2.3, <2.6, or several: '>=2.3,<2.6'")
    sug.add_argument("--python", help="the Python version (3.11)")
    sug.add_argument("--cuda", help="the CUDA toolkit (12.4 for its newest update, or 12.4.1)")
    sug.add_argument("--backend", choices=["venv", "conda"], default="venv", help="the environment's backend")
    sug.add_argument("--no-system-cudnn", action="store_true", help="no cuDNN in the CUDA tree (torch brings its own)")
    sug.add_argument(
        "--no-toolkit",
        action="store_true",
        help="no system CUDA toolkit (cuda: none): the driver and torch's wheels, for hosts where nobody builds "
        "CUDA extensions",
    )
    sug.add_argument("--json", action="store_true", help="print a machine-readable result")
    sug.set_defaults(func=_suggest)

    doc = sub.add_parser(
        "doctor",
        help="explain this host's driver, CUDA, cuDNN and torch environments, and what would replace them",
        description="Take stock of this host without changing it (the driver, every CUDA toolkit and cuDNN copy, "
        "every Python environment with torch), run gpuenv verify's checks in each environment, and explain the "
        "classic failures with where, why and the fix; end with the gpuenv stack that would replace it. Exit 0: "
        "nothing wrong; 1: findings; 2: doctor could not run.",
    )
    doc.add_argument(
        "--gpu",
        action="append",
        metavar="MODEL_OR_CC",
        help="a GPU the host has besides those nvidia-smi or lspci name (repeatable): for the kernel-image checks "
        "and the suggestion where the driver cannot list them",
    )
    doc.add_argument(
        "--root",
        default="/",
        metavar="DIR",
        help="read the host whose files are under DIR (a mounted disk, a container's root) instead of this one; "
        "only its files, its loader cache and its package databases are read then (default /)",
    )
    doc.add_argument("--home", action="append", metavar="DIR", help="also look for environments under DIR (repeatable)")
    doc.add_argument("--env", action="append", metavar="PREFIX", help="also examine this environment (repeatable)")
    doc.add_argument(
        "--depth", type=int, default=4, help="how many levels below each home to look for venvs (default 4)"
    )
    doc.add_argument("--no-verify", action="store_true", help="do not run gpuenv verify in the environments")
    doc.add_argument(
        "--verify-timeout",
        type=float,
        default=180,
        metavar="SECONDS",
        help="stop verify in an environment after this long (default 180)",
    )
    doc.add_argument("--json", action="store_true", help="print a machine-readable result")
    doc.set_defaults(func=_doctor)

    profiles = sub.add_parser("profiles", help="list the named, pre-checked stack profiles")
    profiles.add_argument("--json", action="store_true", help="print a machine-readable list")
    profiles.set_defaults(func=_profiles)

    report = sub.add_parser(
        "report",
        help="the fleet report from the verify results in a directory",
        description="Read every gpuenv verify JSON file in DIR (the gpu_verify role fetches them into reports/) and "
        "print a Markdown table: a row per host, a column per check group, the versions found against the "
        "declared ones, and the failures with their fix hints. Exit 2 when DIR holds no readable report.",
    )
    report.add_argument("dir", help="directory with one verify JSON per host, e.g. reports/")
    report.add_argument("--md", help="also write the Markdown here")
    report.add_argument("--html", help="write the self-contained HTML page here")
    report.add_argument(
        "--since",
        help="the run's start (ISO 8601, e.g. 2026-12-01T22:48:00+00:00): a report made before it is marked STALE",
    )
    report.add_argument(
        "--run",
        help="the playbooks' run id: a report of another run is marked STALE (default: the last run that wrote "
        f"reports into DIR, from DIR/{fleetreport.LAST_RUN})",
    )
    report.add_argument(
        "--all-runs", action="store_true", help="count every report in DIR as current, whichever run left it"
    )
    report.set_defaults(func=_report)

    # Listed for --help; main() hands `verify ...` to gpuenv.verify's own parser.
    sub.add_parser(
        "verify",
        help="prove on this host that the declared stack loads and runs (gpuenv verify --help)",
        add_help=False,
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] == ["verify"]:
        # verify has its own parser: the same file runs on hosts with nothing but torch installed.
        return verify.main(args_list[1:])
    args = build_parser().parse_args(args_list)
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `gpuenv profiles | head` is fine
        return 0


if __name__ == "__main__":
    sys.exit(main())
