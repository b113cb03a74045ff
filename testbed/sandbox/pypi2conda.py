"""From a wheel's metadata to conda's terms: conda-forge's names, versions and dependencies.

Pure functions over a wheel's METADATA and entry points; recipes.py turns them into recipes.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from testbed.sandbox.util import SandboxError

# The target of every package: markers in a wheel's requirements are evaluated for it.
TARGET_MARKERS = {
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "implementation_name": "cpython",
}
_LICENSE = re.compile(r"(LICEN[CS]E|COPYING|NOTICE|AUTHORS)[^/]*", re.IGNORECASE)
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_SCRIPT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class WheelInfo:
    project: str
    version: str
    requires: list[str]
    requires_python: str | None
    summary: str
    license: str | None
    dist_info: str
    license_files: list[str]
    console_scripts: dict[str, str]
    nvidia_dirs: dict[str, list[str]] = field(default_factory=dict)  # nvidia/<x> -> what it holds
    data_dirs: list[str] = field(default_factory=list)  # what <name>.data/ holds: data, purelib, ...


def normalize(project: str) -> str:
    """PEP 503's normalized project name."""
    return re.sub(r"[-_.]+", "-", project).lower()


def conda_name(project: str, names: dict[str, str]) -> str:
    """The conda-forge name of a PyPI project: the data's map where they differ, else the normalized name."""
    return names.get(normalize(project), normalize(project))


def conda_version(version: str) -> str:
    """A PyPI version as conda-forge writes it: 2.13.0+cpu is pytorch 2.13.0 (the variant is the build string)."""
    try:
        return Version(version).public
    except InvalidVersion:
        raise SandboxError(f"{version!r} is not a PEP 440 version; fix the pin in channel.yaml") from None


def python_dep(requires_python: str | None) -> str:
    """Requires-Python as a conda dependency on python."""
    if not requires_python or not requires_python.strip():
        return "python"
    try:
        spec = SpecifierSet(requires_python)
    except InvalidSpecifier:
        raise SandboxError(f"Requires-Python {requires_python!r} is not a PEP 440 specifier") from None
    return _with_spec("python", spec)


def _with_spec(name: str, spec: SpecifierSet) -> str:
    parts = sorted(str(s) for s in spec)
    if any(p.startswith("===") for p in parts):
        raise SandboxError(f"{name}{spec}: conda has no arbitrary equality (===); pin another way")
    return f"{name} {','.join(parts)}" if parts else name


def requirement_spec(line: str, pythons: dict[str, str], names: dict[str, str]) -> str | None:
    """One Requires-Dist line as a conda dependency, or None when its markers exclude it.

    `pythons` maps each Python the package is for ("3.13") to its full version ("3.13.5"): one for
    a package built per Python, all of the channel's for a noarch one, whose dependencies must then
    be the same for every Python (conda has no markers).
    """
    try:
        req = Requirement(line)
    except InvalidRequirement as exc:
        raise SandboxError(f"Requires-Dist {line!r} cannot be parsed: {exc}") from None
    if req.url:
        raise SandboxError(f"Requires-Dist {line!r} names a URL: a conda package can only depend on packages")
    wanted = {_marker_holds(req.marker, minor, full) for minor, full in pythons.items()}
    if wanted == {False}:
        return None
    if len(wanted) > 1:
        raise SandboxError(
            f"{line!r} holds for some of Pythons {', '.join(sorted(pythons))} and not others: a noarch package "
            "cannot say that; build it per Python (kind: python in channel.yaml)"
        )
    return _with_spec(conda_name(req.name, names), req.specifier)


def _marker_holds(marker: Marker | None, minor: str, full: str) -> bool:
    if marker is None:
        return True
    env = {**TARGET_MARKERS, "python_version": minor, "python_full_version": full, "extra": ""}
    return marker.evaluate(env)


def read_wheel(path: Path) -> WheelInfo:
    """What a recipe needs from a wheel: its metadata, entry points, license files and layout."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            dist_infos = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
            if len(dist_infos) != 1:
                raise SandboxError(f"{path.name}: expected one .dist-info folder, found {sorted(dist_infos)}")
            dist_info = dist_infos.pop()
            meta = HeaderParser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
            entry_points = (
                zf.read(f"{dist_info}/entry_points.txt").decode() if f"{dist_info}/entry_points.txt" in names else ""
            )
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise SandboxError(f"{path}: not a readable wheel ({exc}); remove it and build again") from None
    nvidia: dict[str, set[str]] = {}
    data: set[str] = set()
    for n in names:
        parts = PurePosixPath(n).parts
        if len(parts) >= 3 and parts[0] == "nvidia":
            nvidia.setdefault(parts[1], set()).add(parts[2])
        if len(parts) >= 3 and parts[0].endswith(".data"):
            data.add(parts[1])
    # Only PEP 639's License-Expression is SPDX, as rattler-build requires; the older free-text
    # License field is not (channel.yaml's `license` names those).
    lic = meta.get("License-Expression")
    return WheelInfo(
        project=str(meta["Name"]),
        version=str(meta["Version"]),
        requires=[str(r) for r in meta.get_all("Requires-Dist", [])],
        requires_python=meta.get("Requires-Python"),
        summary=" ".join(str(meta.get("Summary", "")).split()),
        license=" ".join(str(lic).split()) if lic else None,
        dist_info=dist_info,
        license_files=sorted(
            n for n in names if n.startswith(dist_info + "/") and _LICENSE.fullmatch(n.split("/")[-1])
        ),
        console_scripts=_console_scripts(entry_points),
        nvidia_dirs={k: sorted(v) for k, v in nvidia.items()},
        data_dirs=sorted(data),
    )


def _console_scripts(text: str) -> dict[str, str]:
    scripts: dict[str, str] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == "console_scripts" and "=" in line and not line.startswith(("#", ";")):
            name, _, target = line.partition("=")
            scripts[name.strip()] = target.split("[")[0].strip()
    return scripts


def entry_point(name: str, target: str) -> tuple[str, str, str]:
    """(script, module, callable) of a console script, refused unless plain names (they go into a script)."""
    module, _, attr = target.partition(":")
    if not (_SCRIPT_NAME.fullmatch(name) and _DOTTED.fullmatch(module) and _DOTTED.fullmatch(attr)):
        raise SandboxError(f"console script {name} = {target}: not a plain name = module:callable")
    return name, module, attr
