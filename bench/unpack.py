#!/usr/bin/env python3
"""The cuDNN tarball's unpack (plugins/module_utils/gpuenv_cudnn_files.py, which gpuenv_cuda_tree
runs on the host) with the code of an earlier commit and with this tree's, alternating, on one real
tarball, on this machine:

    bench/unpack.py --rev REV --archive /var/cache/gpuenv/redist/cudnn/cudnn-linux-x86_64-9.1.0.70_cuda12-archive.tar.xz

Each run unpacks into a new temporary directory (its sha256 check included, as on a host) and
prints its wall time; the figures go into docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
MODULE = "plugins/module_utils/gpuenv_cudnn_files.py"


def _load(name: str, path: Path) -> ModuleType:
    # What the file imports as ansible.module_utils.gpuenv_* is the package's own module of that name.
    for shared in sorted((ROOT / "gpuenv/module_utils").glob("gpuenv_*.py")):
        module = importlib.import_module(f"gpuenv.module_utils.{shared.stem}")
        sys.modules.setdefault(f"ansible.module_utils.{shared.stem}", module)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"unpack: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/unpack.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", required=True, help="the commit to compare with (its gpuenv_cudnn_files.py)")
    parser.add_argument("--archive", type=Path, required=True, help="a cuDNN tarball (.tar.xz)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    found = re.search(r"-(\d+\.\d+\.\d+\.\d+)_cuda", args.archive.name)
    if not found:
        raise SystemExit(f"unpack: {args.archive.name} is not named as NVIDIA names cuDNN's tarballs")
    version = found.group(1)
    work = Path(tempfile.mkdtemp(prefix="gpuenv-bench-unpack.", dir="/var/tmp"))  # disk, not a tmpfs
    try:
        old = work / "before.py"
        old.write_text(
            subprocess.run(  # noqa: S603
                ["git", "show", f"{args.rev}:{MODULE}"],  # noqa: S607
                cwd=ROOT, capture_output=True, text=True, check=True,
            ).stdout
        )  # fmt: skip
        codes = {args.rev: _load("before", old), "this tree": _load("after", ROOT / MODULE)}
        sha = codes["this tree"].sha256_of(str(args.archive))
        times: dict[str, list[float]] = {name: [] for name in codes}
        for i in range(args.runs):
            for name, code in codes.items():
                dest = work / f"{i}-{len(times[name])}-{name.replace(' ', '-')}"
                start = time.perf_counter()
                code.unpack(str(args.archive), sha, version, str(dest))
                times[name].append(time.perf_counter() - start)
                shutil.rmtree(dest)
                print(f"{name}: {times[name][-1]:.1f} s", flush=True)
        for name, values in times.items():
            print(f"{name}: median {statistics.median(values):.1f} s of {len(values)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
