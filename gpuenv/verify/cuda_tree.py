"""The CUDA tree (/usr/local/cuda): the declared toolkit and system cuDNN, and that every library of
that cuDNN resolves through the loader's cache to the tree's own file."""

from __future__ import annotations

import os
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

from gpuenv.module_utils import gpuenv_hostparse as hostparse
from gpuenv.module_utils.gpuenv_cudnn_version import CudnnVersion
from gpuenv.verify.base import Checks, Context, Spec, run_tool
from gpuenv.verify.model import Check

CHECKS = Checks()

if TYPE_CHECKING:
    from collections.abc import Callable

_LOADER_HINT = (
    "run ldconfig: gpuenv writes /etc/ld.so.conf.d/gpuenv-cuda.conf, which gives the loader "
    "{lib}; if the loader still finds another copy, a file in /etc/ld.so.conf.d that comes first "
    "names another cuDNN: remove it or rerun the cudnn role"
)


def _real_file(path: str) -> str | None:
    return os.path.realpath(path) if os.path.exists(path) else None


def loader_problems(
    names: list[str], lib: PurePath, cache: dict[str, list[str]], real: Callable[[str], str | None] = _real_file
) -> list[str]:
    """What keeps the loader from finding each library of `names` (sonames) in `lib`, the directory
    that holds them: missing from lib, missing from the loader's cache (`ldconfig -p`, parsed), or
    the cache's first entry another file. `real` gives a path's real file, None when there is none
    (gpuenv doctor resolves inside the host tree it reads)."""
    problems = []
    for name in names:
        own = lib / name
        found = cache.get(name, [])
        own_file = real(str(own))
        if own_file is None:
            problems.append(f"{name}: not in {lib}")
        elif not found:
            problems.append(f"{name}: not in the loader's cache")
        elif real(found[0]) != own_file:
            problems.append(f"{name}: the loader finds {found[0]}, not {own}")
    return problems


@CHECKS.add("cuda_tree.toolkit", "CUDA toolkit")
def toolkit(ctx: Context, me: Spec) -> Check:
    want = ctx.expect.get("cuda")
    ptxas = ctx.cuda_home / "bin/ptxas"
    if want in (None, "none"):
        return me.skipped("the stack declares no CUDA toolkit (torch's wheels bring their own CUDA runtime)")
    if not ptxas.exists():
        return me.failed(
            f"no {ptxas}",
            expected=want,
            hint="run the cuda_toolkit role, or check that /usr/local/cuda points at a toolkit",
        )
    found = hostparse.tool_version(run_tool([str(ptxas), "--version"]).stdout)
    release = found["release"] if found else None
    want_xy = ".".join(str(want).split(".")[:2])
    return me.judged(
        release == want_xy,
        f"{ctx.cuda_home} is CUDA {release}",
        release,
        want_xy,
        "cuda_toolkit_default selects /usr/local/cuda",
    )


def _cudnn_header(ctx: Context, major: str) -> Path:
    """cudnn_version.h of the system cuDNN: NVIDIA's packages name theirs cudnn_version_vN.h."""
    place = ctx.cudnn_place
    if place.kind == "packages":
        return place.include / f"cudnn_version_v{major}.h"
    return place.include / "cudnn_version.h"


@CHECKS.add("cuda_tree.cudnn", "system cuDNN")
def cudnn(ctx: Context, me: Spec) -> Check:
    want = ctx.expect.get("cudnn")
    if want in (None, "none"):
        return me.skipped("the stack declares none")
    cudnn_version = CudnnVersion(want)
    header = _cudnn_header(ctx, cudnn_version.major)
    if not header.exists():
        return me.failed(f"no {header}", expected=want, hint="run the cudnn role")
    found = hostparse.cudnn_header_version(header.read_text())
    want_xyz = cudnn_version.release
    said = f"cuDNN {found}" if found else "no CUDNN_MAJOR, CUDNN_MINOR and CUDNN_PATCHLEVEL"
    return me.judged(
        found == want_xyz,
        f"{header} says {said} ({ctx.cudnn_place.describe()})",
        found,
        want_xyz,
        "run the cudnn role",
    )


@CHECKS.add("cuda_tree.cudnn_loader", "cuDNN in the loader's cache")
def cudnn_loader(ctx: Context, me: Spec) -> Check:
    """The "Could not load library libcudnn_cnn_infer.so.8" case: a library of the declared cuDNN
    missing from the loader's cache, or shadowed there by another copy (a tarball's in a CUDA tree
    before the packages' in the system directory, or the other way round)."""
    want = ctx.expect.get("cudnn")
    if want in (None, "none"):
        return me.skipped("the stack declares no system cuDNN")
    place = ctx.cudnn_place
    lib = place.lib
    major = str(want).partition(".")[0]
    names = list(ctx.expect.get("cudnn_libraries") or sorted(p.name for p in lib.glob(f"libcudnn*.so.{major}")))
    if not names:
        return me.failed(
            f"no cuDNN {major} libraries in {lib}",
            expected=f"libcudnn*.so.{major} in {lib}",
            hint="run the cudnn role, which installs the declared cuDNN "
            + ("from NVIDIA's packages" if place.kind == "packages" else "into the CUDA tree"),
        )
    problems = loader_problems(names, lib, hostparse.parse_ldconfig(ctx.ldconfig()))
    if problems:
        return me.failed(
            f"{len(problems)} of {len(names)} cuDNN libraries do not load from {lib} ({place.describe()})",
            observed=problems,
            expected=f"each of {', '.join(names)} from {lib}",
            hint=_LOADER_HINT.format(lib=lib)
            + ("; gpuenv doctor names the copy that shadows it and why" if place.kind == "packages" else ""),
        )
    return me.passed(f"the loader finds all {len(names)} cuDNN libraries in {lib} ({place.describe()})", names)


@CHECKS.add("cuda_tree.cudnn_readable", "cuDNN readable by every user")
def cudnn_readable(ctx: Context, me: Spec) -> Check:
    """NVIDIA's `chmod a+r` after copying cuDNN in: a library or header only root can read loads in
    root's session (where verify runs) and fails in every member's, "Permission denied". The files
    are root's, so the members read them by their bits for others."""
    want = ctx.expect.get("cudnn")
    if want in (None, "none"):
        return me.skipped("the stack declares no system cuDNN")
    place = ctx.cudnn_place
    where = ctx.cuda_home if place.kind == "tree" else f"{place.lib} and {place.include}"
    files = sorted(
        {os.path.realpath(p) for p in [*place.lib.glob("libcudnn*.so*"), *place.include.glob("cudnn*.h")] if p.exists()}
    )
    if not files:
        return me.skipped(f"no cuDNN files in {where} (the system cuDNN check says why)")
    closed = [f"{f} (mode {os.stat(f).st_mode & 0o7777:04o})" for f in files if not os.stat(f).st_mode & 0o004]
    if closed:
        return me.failed(
            f"{len(closed)} of {len(files)} cuDNN files in {where} are not readable by other users",
            observed=closed,
            expected="every cuDNN header and library readable by all (a+r)",
            hint=(
                "run playbooks/site.yml again (the cudnn role puts the modes back), or chmod a+r the files "
                "named: members of the environment's group load them as themselves"
            ),
        )
    return me.passed(f"all {len(files)} cuDNN files in {where} are readable by every user", len(files))
