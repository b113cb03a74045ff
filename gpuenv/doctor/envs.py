"""The Python environments, and the library paths they run with.

Environments are looked for where people keep them: gpuenv's (/opt/gpuenv/envs), conda's and mamba's
(the usual install roots, the envs_dirs of ~/.condarc and /etc/conda/.condarc, conda's own list in
~/.conda/environments.txt), venvs under each home down to a bounded depth, the active one
(VIRTUAL_ENV, CONDA_PREFIX), and the system Python's site directories. What torch an environment
holds is read from its files (torch/version.py, the cuDNN wheel's dist-info, conda-meta), so doctor
knows it even where torch no longer imports.

LD_LIBRARY_PATH is read where it is set: this shell's environment, /etc/environment, the profile
scripts, the shell start-up files in each home, and each environment's activation scripts.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpuenv.doctor.host import Host
from gpuenv.module_utils import gpuenv_hostparse as hostparse

GPUENV_ENVS = "/opt/gpuenv/envs"
_CONDA_ROOTS_HOME = ("miniconda3", "anaconda3", "miniforge3", "mambaforge", "micromamba", ".local/share/mamba")
_CONDA_ROOTS = ("/opt/conda", "/opt/miniconda3", "/opt/anaconda3", "/opt/miniforge3", "/opt/mambaforge")
_CONDARC_HOME = (".condarc", ".config/conda/.condarc", ".config/conda/condarc")
_CONDARC = ("/etc/conda/.condarc", "/etc/conda/condarc", "/opt/conda/.condarc")
# Directories a venv search never enters: caches, VCS data, conda's package cache, installed packages.
_SKIP = {".cache", ".git", "node_modules", "__pycache__", "site-packages", "pkgs", ".npm", ".cargo", ".rustup"}
_MAX_DIRS = 20000  # per home: a bound on the venv search in a home with a huge tree
SESSION_SHELL = "LD_LIBRARY_PATH of this shell"
_SESSION_FILES = ("/etc/environment", "/etc/profile", "/etc/bash.bashrc")
_HOME_FILES = (".profile", ".bash_profile", ".bashrc", ".zshenv", ".zshrc")


@dataclass
class LibPath:
    """Where LD_LIBRARY_PATH gets directories: a file (or this shell), and for whom."""

    source: str
    dirs: list[str]
    env: str | None = None  # the environment whose activation sets it; None: every session


@dataclass
class Env:
    path: str
    kind: str  # gpuenv, conda, venv, system
    found_by: list[str] = field(default_factory=list)
    python: str = ""
    python_version: str | None = None
    site: str | None = None  # the site-packages directory that holds torch
    torch: str | None = None
    torch_cuda: str | None = None
    cudnn: str | None = None  # torch's own cuDNN: the wheel's or the conda package's version
    cudnn_lib: str | None = None
    cudnn_from: str | None = None
    active: bool = False
    lib_paths: list[LibPath] = field(default_factory=list)
    verify: dict[str, Any] | None = None  # gpuenv verify's report, run with this environment's Python
    verify_as: str = ""  # who verify ran as, or why it did not run (gpuenv.doctor.trust)


def conda_packages(host: Host, prefix: str, names: tuple[str, ...]) -> dict[str, str]:
    """{name: version} of the named conda packages installed in a prefix (its conda-meta records)."""
    found = {}
    for name in names:
        for record in host.glob(f"{prefix}/conda-meta", f"{name}-*.json"):
            try:
                meta = json.loads(host.read(record) or "{}")
            except ValueError:
                continue
            if isinstance(meta, dict) and meta.get("name") == name:
                found[name] = str(meta.get("version"))
    return found


def _site_with_torch(host: Host, prefix: str) -> str | None:
    for lib in ("lib", "lib64"):
        for site in host.glob(f"{prefix}/{lib}", "python3*"):
            for name in ("site-packages", "dist-packages"):
                if host.is_file(f"{site}/{name}/torch/version.py"):
                    return f"{site}/{name}"
    return None


def describe(host: Host, env: Env) -> Env:
    """Fill in an environment's Python, torch and torch's cuDNN from its files."""
    prefix = env.path
    env.site = env.site or _site_with_torch(host, prefix)
    if not env.python:
        env.python = next((f"{prefix}/bin/{n}" for n in ("python", "python3") if host.exists(f"{prefix}/bin/{n}")), "")
    if env.site:
        match = re.search(r"python(3\.[0-9]+)", env.site)
        env.python_version = match.group(1) if match else None
        torch = hostparse.torch_version_file(host.read(f"{env.site}/torch/version.py") or "")
        env.torch, env.torch_cuda = torch.get("version"), torch.get("cuda")
        wheels = host.glob(env.site, "nvidia_cudnn_cu*-*.dist-info")
        if wheels:
            stem = posixpath.basename(wheels[-1])[: -len(".dist-info")]
            env.cudnn, env.cudnn_lib = stem.split("-", 1)[1], f"{env.site}/nvidia/cudnn/lib"
            env.cudnn_from = f"wheel {stem.split('-', 1)[0].replace('_', '-')}"
    conda = conda_packages(host, prefix, ("cudnn",)) if host.is_dir(f"{prefix}/conda-meta") else {}
    if not env.cudnn and conda:
        env.cudnn, env.cudnn_lib, env.cudnn_from = conda["cudnn"], f"{prefix}/lib", "conda package cudnn"
    scripts = [f"{prefix}/bin/activate", *host.glob(f"{prefix}/etc/conda/activate.d", "*.sh")]
    for script in scripts:
        dirs = hostparse.ld_library_path(host.read(script) or "", host.environ.get("HOME", ""))
        if dirs:
            env.lib_paths.append(LibPath(script, dirs, prefix))
    return env


def _add(found: dict[str, Env], host: Host, path: str, kind: str, how: str) -> None:
    real = host.real(path)
    if real is None:
        return
    env = found.get(real)
    if env is None:
        found[real] = env = Env(path=path.rstrip("/") or "/", kind=kind)
    if how not in env.found_by:
        env.found_by.append(how)


def _conda_dirs(host: Host, homes: list[str]) -> list[tuple[str, str]]:
    """(directory of environments, how it was found): the usual roots' envs/ and every envs_dirs."""
    roots = [f"{h}/{r}" for h in homes for r in _CONDA_ROOTS_HOME] + list(_CONDA_ROOTS)
    dirs = [(f"{r}/envs", f"conda root {r}") for r in roots] + [(f"{h}/.conda/envs", "~/.conda/envs") for h in homes]
    for rc, home in [(f"{h}/{n}", h) for h in homes for n in _CONDARC_HOME] + [(n, "") for n in _CONDARC]:
        try:
            config = yaml.safe_load(host.read(rc) or "") or {}
        except yaml.YAMLError:
            continue
        listed = config.get("envs_dirs") if isinstance(config, dict) else None
        for entry in listed if isinstance(listed, list) else []:
            text = str(entry).replace("$HOME", home).replace("${HOME}", home)
            dirs.append((f"{home}{text[1:]}" if text.startswith("~") else text, f"envs_dirs of {rc}"))
    return dirs


def _venvs(host: Host, home: str, depth: int, found: dict[str, Env]) -> bool:
    """Every venv (a directory with pyvenv.cfg) and conda prefix under a home, down to `depth`
    levels; False when the search stopped at its bound."""
    todo, seen = [(home, 0)], 0
    while todo:
        directory, level = todo.pop()
        seen += 1
        if seen > _MAX_DIRS:
            return False
        names = host.listdir(directory)
        if "pyvenv.cfg" in names:
            _add(found, host, directory, "venv", f"a venv under {home}")
            continue
        if "conda-meta" in names and directory != home:
            _add(found, host, directory, "conda", f"a conda prefix under {home}")
            names = ["envs"] if "envs" in names else []  # its own files are no environments
        if level < depth:
            for name in names:
                path = f"{directory}/{name}"
                if name not in _SKIP and host.readlink(path) is None and host.is_dir(path):
                    todo.append((path, level + 1))
    return True


def find(host: Host, homes: list[str], depth: int, extra: list[str]) -> tuple[list[Env], list[str]]:
    """Every environment found (with torch or not), described; and notes on where the search stopped."""
    found: dict[str, Env] = {}
    notes = []
    for name in host.listdir(GPUENV_ENVS):
        if not name.startswith("."):
            _add(found, host, f"{GPUENV_ENVS}/{name}", "gpuenv", GPUENV_ENVS)
    roots = [f"{h}/{r}" for h in homes for r in _CONDA_ROOTS_HOME] + list(_CONDA_ROOTS)
    for root in roots:
        if host.is_dir(f"{root}/conda-meta"):
            _add(found, host, root, "conda", f"conda root {root}")
    for directory, how in _conda_dirs(host, homes):
        for entry in host.listdir(directory):
            if host.is_dir(f"{directory}/{entry}/conda-meta"):
                _add(found, host, f"{directory}/{entry}", "conda", how)
    for home in homes:
        for line in (host.read(f"{home}/.conda/environments.txt") or "").splitlines():
            if line.strip().startswith("/") and host.is_dir(f"{line.strip()}/conda-meta"):
                _add(found, host, line.strip(), "conda", f"{home}/.conda/environments.txt")
        if not _venvs(host, home, depth, found):
            notes.append(f"the search for venvs under {home} stopped after {_MAX_DIRS} directories")
    for variable in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        if host.environ.get(variable):
            prefix = host.environ[variable]
            _add(found, host, prefix, "conda" if host.is_dir(f"{prefix}/conda-meta") else "venv", variable)
            real = host.real(prefix)
            if real in found:  # a variable left over from a deleted environment names nothing
                found[real].active = True
    for prefix in extra:
        if not host.is_dir(prefix):
            notes.append(f"--env {prefix}: no such directory")
            continue
        _add(found, host, prefix, "conda" if host.is_dir(f"{prefix}/conda-meta") else "venv", "--env")
    envs = [describe(host, e) for e in found.values()]
    return envs + _system(host, homes), notes


def _system(host: Host, homes: list[str]) -> list[Env]:
    """torch installed for the system's Python (by the OS's packages, pip as root, or pip --user)."""
    sites = [("/usr/lib/python3/dist-packages", "/usr/bin/python3")]
    for lib, name in [("/usr/local/lib", "dist-packages")] + [(f"{h}/.local/lib", "site-packages") for h in homes]:
        sites += [(f"{p}/{name}", "/usr/bin/" + posixpath.basename(p)) for p in host.glob(lib, "python3*")]
    envs = []
    for site, python in sites:
        if host.is_file(f"{site}/torch/version.py") and host.exists(python):
            env = Env(path=site, kind="system", found_by=["the system Python"], python=python, site=site)
            envs.append(describe(host, env))
    return envs


# --- LD_LIBRARY_PATH -----------------------------------------------------------------------------
def session_paths(host: Host, homes: list[str]) -> list[LibPath]:
    """What every session's LD_LIBRARY_PATH gets, from where."""
    found = []
    shell = [d.rstrip("/") for d in host.environ.get("LD_LIBRARY_PATH", "").split(":") if d.startswith("/")]
    if shell:
        found.append(LibPath(SESSION_SHELL, shell))
    files = [(f, host.environ.get("HOME", "")) for f in (*_SESSION_FILES, *host.glob("/etc/profile.d", "*.sh"))]
    files += [(f"{h}/{n}", h) for h in homes for n in _HOME_FILES]
    for path, home in files:
        dirs = hostparse.ld_library_path(host.read(path) or "", home)
        if dirs:
            found.append(LibPath(path, dirs))
    return found
