"""The `gpuenv` command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpuenv import __version__, fleetreport, verify
from gpuenv.checkspec import check_file
from gpuenv.compat import load
from gpuenv.report import format_text
from gpuenv.rules import check
from gpuenv.stack import parse_stack


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
        hosts = fleetreport.load(Path(args.dir), since, args.run)
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
    report.add_argument("--run", help="the playbooks' run id: a report of another run is marked STALE")
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
