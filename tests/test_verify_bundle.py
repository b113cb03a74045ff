"""gpuenv verify as the one file the hosts get (gpuenv.verify.bundle): what goes in, that it needs
nothing but the standard library (torch aside) and Python 3.8, that it is the same bytes for the
same sources, and that it runs as the gpu_verify role runs it."""

from __future__ import annotations

import ast
import hashlib
import io
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gpuenv.verify import bundle

# Imported by verify but not shipped: torch is the environment's, nvidia-ml-py optional.
HOST_PACKAGES = {"torch", "pynvml"}
# What Python 3.8 cannot subscript at runtime (X[...] outside an annotation fails there).
GENERICS = {"list", "dict", "tuple", "set", "frozenset", "type", "Callable", "Iterable", "Mapping", "Sequence"}


def _sources() -> dict[str, Path]:
    return bundle.modules()


def test_the_zipapp_holds_verify_and_the_parsers_it_imports_and_nothing_else() -> None:
    shipped = set(_sources())
    package = {f"gpuenv.verify.{p.stem}" for p in Path(bundle.__file__).parent.glob("*.py")} - {
        "gpuenv.verify.__init__",
        "gpuenv.verify.__main__",  # the zipapp has its own __main__
        "gpuenv.verify.bundle",  # the controller's
    }
    assert (
        package
        | {
            "gpuenv",
            "gpuenv.verify",
            "gpuenv.module_utils",
            "gpuenv.module_utils.gpuenv_hostparse",
            "gpuenv.module_utils.gpuenv_cudnn_version",
            "gpuenv.archcompat",
            "gpuenv.drift",  # --drift
        }
        == shipped
    )
    with zipfile.ZipFile(io.BytesIO(bundle.archive())) as zf:
        names = zf.namelist()
    assert names[0] == "__main__.py"
    assert sorted(names[1:]) == sorted(p.relative_to(bundle.ROOT).as_posix() for p in _sources().values())


def _runtime_subscripts(tree: ast.Module) -> list[str]:
    """Subscripts of GENERICS that run: outside annotations and `if TYPE_CHECKING:` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            skip |= {id(n) for n in ast.walk(node)}
        annotations = []
        if isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            annotations += [a.annotation for a in every if a is not None and a.annotation is not None]
            annotations += [node.returns] if node.returns is not None else []
        for annotation in annotations:
            skip |= {id(n) for n in ast.walk(annotation)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and id(node) not in skip:
            name = node.value.id if isinstance(node.value, ast.Name) else getattr(node.value, "attr", "")
            if name in GENERICS:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("module", sorted(bundle.modules()))
def test_each_shipped_module_is_python_3_8_and_standard_library_only(module: str) -> None:
    source = _sources()[module]
    tree = ast.parse(source.read_text(), str(source), feature_version=(3, 8))
    assert _runtime_subscripts(tree) == [], f"{source}: Python 3.8 cannot run these"
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    foreign = {
        name
        for name in imported
        if name.split(".")[0] not in sys.stdlib_module_names | HOST_PACKAGES and not name.startswith("gpuenv")
    }
    assert foreign == set(), f"{source} imports what hosts do not have"
    assert {n for n in imported if n.startswith("gpuenv")} <= set(_sources())  # and shipped with it


def test_the_same_sources_give_the_same_file(tmp_path: Path) -> None:
    path, sha256 = bundle.build(tmp_path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha256
    assert path.name == f"gpuenv_verify-{sha256[:16]}.pyz"
    written = path.stat().st_mtime_ns
    assert bundle.build(tmp_path) == (path, sha256)
    assert path.stat().st_mtime_ns == written  # found, not written again
    assert bundle.archive() == path.read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_the_role_builds_it_with_the_command_it_runs(tmp_path: Path, repo: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "gpuenv.verify.bundle", str(tmp_path / "out")],
        cwd=tmp_path,
        env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    said = json.loads(run.stdout)
    assert hashlib.sha256(Path(said["path"]).read_bytes()).hexdigest() == said["sha256"]


def _run_without_site_packages(python: str, pyz: Path, tmp_path: Path) -> dict[str, object]:
    """The zipapp as gpuenv-verify runs it, by a Python that sees no site-packages (-I -S): no
    torch, no yaml, nothing of the controller's. It must still write every report, exit 2."""
    out = {name: tmp_path / name for name in ("v.json", "v.xml", "v.prom")}
    stack = tmp_path / "stack.json"
    stack.write_text('{"torch": "2.5.1", "cuda": "12.4.1"}')
    argv = [python, "-I", "-S", str(pyz), "--stack", str(stack), "--no-distributed", "--run", "r1"]
    argv += ["--json", str(out["v.json"]), "--junit", str(out["v.xml"]), "--prom", str(out["v.prom"])]
    run = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "error: ModuleNotFoundError: No module named 'torch'" in run.stdout
    assert out["v.xml"].read_text().startswith("<testsuite")
    assert 'gpuenv_verify_exit_code{host="' in out["v.prom"].read_text()
    report: dict[str, object] = json.loads(out["v.json"].read_text())
    return report


def test_the_zipapp_runs_with_the_standard_library_alone(tmp_path: Path) -> None:
    pyz, _ = bundle.build(tmp_path / "build")
    report = _run_without_site_packages(sys.executable, pyz, tmp_path)
    assert (report["exit_code"], report["run"]) == (2, "r1")
    assert [c["id"] for c in report["checks"]] == ["verify.run"]  # type: ignore[attr-defined]
    help_text = subprocess.run(
        [sys.executable, "-I", "-S", str(pyz), "--help"], capture_output=True, text=True, check=True
    )
    assert "--cpu-selftest" in help_text.stdout


def test_the_zipapp_runs_on_python_3_8(tmp_path: Path) -> None:
    """The oldest Python an environment may have (torch 1.12's era); where one is on PATH."""
    python = shutil.which("python3.8")
    if python is None or subprocess.run([python, "-c", "pass"], capture_output=True, check=False).returncode:
        pytest.skip("no python3.8 on PATH that runs (a pyenv shim without it?): its syntax is checked above only")
    pyz, _ = bundle.build(tmp_path / "build")
    assert _run_without_site_packages(python, pyz, tmp_path)["exit_code"] == 2
