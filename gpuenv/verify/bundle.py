"""gpuenv verify as one file for the hosts: a zipapp of the verify package and the stdlib-only
modules it imports (gpuenv.module_utils.gpuenv_hostparse, gpuenv.archcompat, gpuenv.drift), which
any Python from 3.8 runs as `python gpuenv_verify.pyz ...` with nothing installed but torch. The
gpu_verify role builds it on the controller and copies it to each host, checking the copy's sha256:

    python -m gpuenv.verify.bundle DIR    # prints {"path": ..., "sha256": ...}

What goes in is found by following the imports of gpuenv.verify.cli, so that a module verify
starts to import is shipped with it. The bytes depend only on the sources (fixed times and modes,
stored uncompressed, since zlib's output varies by version): the same checkout builds the same
file, and the role's copy changes nothing on a host that has it.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import os
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENTRY = "gpuenv.verify.cli"
MAIN = "import sys\n\nfrom gpuenv.verify.cli import main\n\nsys.exit(main())\n"


def _source(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return base.with_suffix(".py") if base.with_suffix(".py").is_file() else None


def _imported(tree: ast.AST) -> list[str]:
    """The gpuenv modules a module's source names (`from gpuenv.x import y` may name module x.y)."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return [n for n in names if n.split(".")[0] == "gpuenv"]


def modules(root: Path = ROOT, entry: str = ENTRY) -> dict[str, Path]:
    """{module: source} of the entry module, everything of gpuenv's it imports, and their packages."""
    found: dict[str, Path] = {}
    todo = [entry]
    while todo:
        module = todo.pop()
        source = _source(root, module)
        if module in found or source is None:
            continue
        found[module] = source
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        todo += _imported(ast.parse(source.read_text(), str(source)))
    return dict(sorted(found.items()))


def _member(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_STORED
    return info


def archive(root: Path = ROOT) -> bytes:
    """The zipapp's bytes: __main__.py, then each module's source under its path."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(_member("__main__.py"), MAIN)
        for source in modules(root).values():
            zf.writestr(_member(source.relative_to(root).as_posix()), source.read_bytes())
    return buf.getvalue()


def build(dest: Path, root: Path = ROOT) -> tuple[Path, str]:
    """Write the zipapp into dest as gpuenv_verify-<sha256 prefix>.pyz, unless it is there already;
    its path and sha256. Written to a temporary name and renamed, so that a reader never sees half."""
    data = archive(root)
    sha256 = hashlib.sha256(data).hexdigest()
    path = dest / f"gpuenv_verify-{sha256[:16]}.pyz"
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == sha256:
        return path, sha256
    dest.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest, prefix=".gpuenv_verify-", suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)  # mkstemp makes it 0600; hosts' users read the copy
    os.replace(tmp, path)
    return path, sha256


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuenv.verify.bundle", description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="the directory to write gpuenv_verify-<sha256>.pyz into")
    args = parser.parse_args(argv)
    path, sha256 = build(args.dest)
    print(json.dumps({"path": str(path), "sha256": sha256}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
