"""Every CUDA toolkit and every cuDNN copy on the host, and what the loader's cache makes of them.

Toolkits: the trees and links in /usr/local (cuda, cuda-X.Y), the nvcc a shell finds first and the
distribution's (Debian's nvidia-cuda-toolkit puts one in /usr/bin), and conda's cuda-* or
cudatoolkit packages in conda prefixes. cuDNN: in each toolkit tree, in the directories the loader's
cache lists, in each environment (the nvidia-cudnn-cu* wheel, conda's cudnn), and in every directory
on an LD_LIBRARY_PATH.
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from gpuenv.doctor.driver import Package
from gpuenv.doctor.envs import Env, conda_packages
from gpuenv.doctor.host import Host
from gpuenv.module_utils import gpuenv_hostparse as hostparse
from gpuenv.verify.cuda_tree import loader_problems

_SONAME = re.compile(r"^libcudnn[a-z_]*\.so\.([0-9]+)$")
_CONDA_CUDA = ("cuda-nvcc", "cudatoolkit", "cuda-cudart", "cuda-version")
_WRAPPER = re.compile(r"^#!.*\n(?:.*\n)*?\s*exec\s+(/\S+/nvcc)\b", re.M)


@dataclass
class Toolkit:
    path: str  # a tree, an nvcc, or a conda prefix
    version: str | None
    how: str  # what told the version
    kind: str  # tree, package (the distribution's), conda, path (an nvcc found on PATH)
    links: list[str] = field(default_factory=list)  # /usr/local/cuda and other links to it
    package: str | None = None
    on_path: bool = False  # the nvcc a shell finds first is this toolkit's
    local_cuda: bool = False  # /usr/local/cuda is (or leads to) this toolkit

    @property
    def series(self) -> str | None:
        """X.Y of its version: what a build compares with torch's CUDA."""
        return ".".join(self.version.split(".")[:2]) if self.version else None


@dataclass
class Cudnn:
    lib: str  # the directory that holds libcudnn*.so.N
    version: str | None
    kind: str  # tree, system, wheel, conda, library path
    sonames: list[str] = field(default_factory=list)
    owner: str | None = None  # its toolkit tree, environment or package
    configured: str | None = None  # the ld.so.conf file that names its directory
    configured_as: str | None = None  # the directory as that file writes it (a link, often: /usr/local/cuda/lib64)
    loader: list[str] = field(default_factory=list)  # what keeps the loader from it (configured directories)

    @property
    def major(self) -> str | None:
        majors = {m.group(1) for m in map(_SONAME.match, self.sonames) if m}
        return majors.pop() if len(majors) == 1 else self.version.split(".")[0] if self.version else None


def _tree_version(host: Host, tree: str) -> tuple[str | None, str]:
    try:
        info = json.loads(host.read(f"{tree}/version.json") or "null")
    except ValueError:
        info = None
    if isinstance(info, dict) and isinstance(info.get("cuda"), dict) and info["cuda"].get("version"):
        return str(info["cuda"]["version"]), f"{tree}/version.json"
    text = host.read(f"{tree}/version.txt") or ""
    match = re.search(r"CUDA Version ([0-9]+\.[0-9]+(?:\.[0-9]+)?)", text)
    if match:
        return match.group(1), f"{tree}/version.txt"
    for tool in ("nvcc", "ptxas"):
        if host.is_file(f"{tree}/bin/{tool}"):
            run = host.run([f"{tree}/bin/{tool}", "--version"], 30)
            found = hostparse.tool_version(run.stdout if run else "")
            if found:
                return found["version"], f"{tool} --version"
    for lib in ("lib64", "lib"):
        for name in host.glob(f"{tree}/{lib}", "libcudart.so.*.*.*"):
            return name.split("libcudart.so.", 1)[1], posixpath.basename(name)
    return None, "nothing in it names a version"


def toolkits(host: Host, packages: list[Package], envs: list[Env]) -> list[Toolkit]:
    found: dict[str, Toolkit] = {}
    links: dict[str, list[str]] = {}
    entries = [p for p in host.glob("/usr/local", "cuda*") if re.fullmatch(r"cuda(-[\w.]+)?", posixpath.basename(p))]
    # Trees first, then links: a link to a tree elsewhere (gpuenv's /opt/gpuenv/cuda/<tree>) names that tree.
    for path in sorted(entries, key=lambda p: host.readlink(p) is not None):
        real = host.real(path)
        if real is None or not host.is_dir(path):
            continue
        if host.readlink(path) is not None:
            links.setdefault(real, []).append(f"{path} -> {host.readlink(path)}")
        if real not in found:
            found[real] = Toolkit(real, *_tree_version(host, real), "tree")
    owner = {p.name: p for p in packages}
    # A tree without bin/nvcc (cudart and cuDNN only) has no real nvcc: keep it out of the lookup.
    trees = {real: t for t in found if (real := host.real(f"{t}/bin/nvcc"))}
    first = host.which("nvcc")
    for nvcc in dict.fromkeys(n for n in ("/usr/bin/nvcc", first) if n and host.is_file(n)):
        real = host.real(nvcc)
        if real in trees:
            found[trees[real]].on_path |= nvcc == first
            continue
        # A wrapper script (Debian's /usr/bin/nvcc, an admin's /usr/local/bin/nvcc) that runs a tree's nvcc.
        wrapped = _WRAPPER.search((host.read_bytes(nvcc) or b"")[:4096].decode(errors="replace"))
        target = host.real(wrapped.group(1)) if wrapped else None
        if wrapped and target in trees:
            tree = trees[target]
            links.setdefault(tree, []).append(f"{nvcc} runs {wrapped.group(1)}")
            found[tree].on_path |= nvcc == first
            continue
        run = host.run([nvcc, "--version"], 30)
        parsed = hostparse.tool_version(run.stdout if run else "")
        pkg = owner.get("nvidia-cuda-toolkit") if nvcc.startswith("/usr/bin/") else None
        found[nvcc] = Toolkit(
            nvcc, parsed["version"] if parsed else None, "nvcc --version", "package" if pkg else "path"
        )
        found[nvcc].on_path = nvcc == first
        if pkg:
            found[nvcc].package = f"{pkg.name} {pkg.version}"
    local = host.real("/usr/local/cuda")
    if local is not None and local in found:
        found[local].local_cuda = True
    for env in envs:
        conda = conda_packages(host, env.path, _CONDA_CUDA) if env.kind != "system" else {}
        name = next((n for n in _CONDA_CUDA if n in conda), None)
        if name:
            found[env.path] = Toolkit(env.path, conda[name], f"conda package {name}", "conda")
    for real, names in links.items():
        found[real].links = names + found[real].links
    return list(found.values())


def _cudnn_at(host: Host, lib: str, kind: str, owner: str | None) -> Cudnn | None:
    sonames = [posixpath.basename(p) for p in host.glob(lib, "libcudnn*.so.*") if _SONAME.match(posixpath.basename(p))]
    if not sonames:
        return None
    version = None
    for soname in (n for n in sonames if n.startswith("libcudnn.so.")):
        match = re.fullmatch(
            r"libcudnn\.so\.([0-9]+\.[0-9]+\.[0-9]+)", posixpath.basename(host.real(f"{lib}/{soname}") or "")
        )
        version = match.group(1) if match else None
    if version is None:
        version = hostparse.cudnn_header_version(host.read(f"{posixpath.dirname(lib)}/include/cudnn_version.h") or "")
    return Cudnn(lib, version, kind, sorted(sonames), owner)


def ld_so_conf(host: Host, path: str = "/etc/ld.so.conf", depth: int = 0) -> dict[str, tuple[str, str]]:
    """{directory's real path: (the file that names it, the directory as written there)} from ld.so.conf
    and its `include`s."""
    found: dict[str, tuple[str, str]] = {}
    for raw in (host.read(path) or "").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("include") and depth < 8:
            pattern = line.split(None, 1)[1] if " " in line else ""
            pattern = pattern if pattern.startswith("/") else posixpath.join(posixpath.dirname(path), pattern)
            directory, name = posixpath.split(pattern)
            for conf in host.listdir(directory):
                if fnmatch.fnmatchcase(conf, name):
                    found.update(
                        {k: v for k, v in ld_so_conf(host, f"{directory}/{conf}", depth + 1).items() if k not in found}
                    )
        else:
            for entry in re.split(r"[\s:,]+", line):
                real = host.real(entry) if entry.startswith("/") else None
                if real and real not in found:
                    found[real] = (path, entry)
    return found


def cudnn_copies(
    host: Host, trees: list[Toolkit], cache: dict[str, list[str]], envs: list[Env], lib_dirs: list[str]
) -> list[Cudnn]:
    """Every cuDNN copy, once each (by the real directory), with what the loader makes of it."""
    found: dict[str, Cudnn] = {}

    def add(lib: str, kind: str, owner: str | None) -> None:
        real = host.real(lib)
        if real is not None and real not in found:
            copy = _cudnn_at(host, real, kind, owner)
            if copy is not None:
                found[real] = copy

    for tree in (t for t in trees if t.kind == "tree"):
        for lib in ("lib64", "lib"):
            add(f"{tree.path}/{lib}", "tree", tree.path)
    for soname, paths in sorted(cache.items()):
        if _SONAME.match(soname):
            for path in paths:
                add(posixpath.dirname(path), "system", None)
    for env in envs:
        if env.cudnn_lib:
            add(env.cudnn_lib, "conda" if env.cudnn_from and "conda" in env.cudnn_from else "wheel", env.path)
    for lib in lib_dirs:
        add(lib, "library path", None)
    configured = ld_so_conf(host)
    for real, copy in found.items():
        copy.configured, copy.configured_as = configured.get(real, (None, None))
        if copy.kind == "tree" and copy.configured:
            copy.loader = loader_problems(copy.sonames, PurePosixPath(copy.lib), cache, host.real)
    return list(found.values())
