#!/usr/bin/env python3
"""A torch-only upgrade: the same driver, toolkit and cuDNN, a new torch, on a host that
site.yml provisioned. gpuenv's playbooks/upgrade.yml beside the floor, a careful person's new venv
and `pip install` of the same requirements next to the old environment:

    bench/upgrade.py --torch 2.6.0 [--inventory inventory/sandbox] [--host sb1]

The floor runs twice, before gpuenv (the new wheels come from the index through the host's cold pip
cache) and after it (warm); gpuenv is judged against the second. The old environment must still be
there after the upgrade. The figures go into docs/benchmarks.md by hand.
Needs a provisioned sandbox host (./scripts/demo leaves one up); it changes that host's stack.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runner import ROOT, BenchError, stack_plan  # bench/ is not a package: its modules import each other by name

# TMPDIR: the sandbox host's /tmp is a 2.4 GB tmpfs, too small for pip's unpacked wheels (gpuenv
# builds in pytorch_env_tmpdir, on the environments' disk).
FLOOR_SCRIPT = """set -eu
export TMPDIR=/var/tmp
start=$(date +%s.%N)
dir=/opt/floor-upgrade/{name}
rm -rf "$dir"
python{python} -m venv "$dir"
"$dir/bin/pip" install -q --disable-pip-version-check --index-url {index} {requirements}
"$dir/bin/python" -c 'import torch; print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version())'
awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {{ printf "FLOOR_S=%.2f\\n", b - a }}'
"""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(cmd: list[str], log: Path) -> tuple[float, float, str]:
    """Wall and controller CPU seconds of one command, and its output (also written to LOG)."""
    cpu, start = _cpu(), time.monotonic()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=3600)  # noqa: S603
    wall = time.monotonic() - start
    log.write_text(out.stdout + out.stderr)
    if out.returncode != 0:
        raise BenchError(f"{' '.join(cmd[:3])} ... failed (exit {out.returncode}); its output: {log}")
    return wall, _cpu() - cpu, out.stdout


def _host_var(inventory: str, host: str, expr: str) -> str:
    out = subprocess.run(  # noqa: S603
        ["ansible", "-i", inventory, host, "-m", "ansible.builtin.debug", "-a", f"msg={{{{ {expr} }}}}"],  # noqa: S607
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    found = re.search(r"^\s*msg: (\S+)$", out.stdout, re.M)  # ansible.cfg's result_format is yaml
    if out.returncode != 0 or not found:
        raise BenchError(f"cannot read {expr} of {host} from {inventory}: {out.stdout[-500:]}{out.stderr[-500:]}")
    return found.group(1)


def _envs(inventory: str, host: str, log: Path) -> list[str]:
    cmd = ["ansible", "-i", inventory, host, "-m", "ansible.builtin.command", "-a", "ls -1 /opt/gpuenv/envs/.store"]
    return [line for line in _run(cmd, log)[2].splitlines()[1:] if line and not line.startswith(".")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/upgrade.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", required=True, help="the new torch release, e.g. 2.6.0")
    parser.add_argument("--inventory", default="inventory/sandbox")
    parser.add_argument("--host", default="sb1")
    args = parser.parse_args(argv)
    try:
        return _bench(args)
    except BenchError as exc:
        print(f"upgrade: error: {exc}", file=sys.stderr)
        return 1


def _bench(args: argparse.Namespace) -> int:
    logs = Path(tempfile.mkdtemp(prefix="gpuenv-bench-upgrade."))
    group_vars = yaml.safe_load((ROOT / args.inventory / "group_vars" / "gpu_hosts.yml").read_text())
    old = group_vars["gpu_stack"]
    new = {k: v for k, v in old.items() if k != "profile"} | {"torch": args.torch}
    stack_file = logs / "stack.yml"
    stack_file.write_text(yaml.safe_dump({"gpu_stack": new}))
    plan = stack_plan(stack_file)
    stack = plan["stack"]
    index = _host_var(args.inventory, args.host, "pytorch_env_pypi_url")
    print(f"a torch-only upgrade on {args.host}: {old['torch']} -> {stack['torch']} ({' '.join(plan['requirements'])})")
    before = _envs(args.inventory, args.host, logs / "envs-before.log")

    def floor(name: str) -> dict[str, float]:
        script = FLOOR_SCRIPT.format(
            name=name, python=stack["python"], index=index, requirements=" ".join(plan["requirements"])
        )
        cmd = ["ansible", "-i", args.inventory, args.host, "-m", "ansible.builtin.shell", "-a", script]
        wall, cpu, out = _run(cmd, logs / f"floor-{name}.log")
        found = re.search(r"FLOOR_S=([0-9.]+)", out)
        if not found:
            raise BenchError(f"the floor printed no time; its output: {logs / f'floor-{name}.log'}")
        row = {"host_s": float(found.group(1)), "wall_s": wall, "controller_cpu_s": cpu}
        print(f"floor ({name}): {row['host_s']:.1f} s on the host ({wall:.1f} s with the ssh round trip)")
        return row

    cold = floor("cold")
    cmd = ["ansible-playbook", "-i", args.inventory, "playbooks/upgrade.yml", "--limit", args.host]
    wall, cpu, out = _run([*cmd, "-e", json.dumps({"gpu_stack": new})], logs / "upgrade.log")
    recap = re.findall(rf"^{re.escape(args.host)} +: (.*)$", out, re.M)
    print(
        f"gpuenv upgrade.yml: {wall:.1f} s, controller CPU {cpu:.1f} s ({recap[-1].strip() if recap else 'no recap'})"
    )
    warm = floor("warm")
    after = _envs(args.inventory, args.host, logs / "envs-after.log")
    kept = set(before) <= set(after)
    print(f"environments before: {before}; after: {after}; the old ones kept: {kept}")
    summary: dict[str, Any] = {
        "torch": [old["torch"], stack["torch"]],
        "floor_cold": cold,
        "gpuenv": {"wall_s": wall, "controller_cpu_s": cpu},
        "floor_warm": warm,
        "ratio_to_warm_floor": wall / warm["host_s"],
        "old_environment_kept": kept,
        "logs": str(logs),
    }
    print(json.dumps(summary, indent=2))
    return 0 if kept else 1


if __name__ == "__main__":
    sys.exit(main())
