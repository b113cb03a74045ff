"""A team's conda environment.yml as the declaration of a conda environment
(pytorch_env_environment_file): its channels, its conda dependencies and its pip section, checked
against the stack before anything changes. The stack decides torch and Python; the file decides
the rest. A file whose pytorch or python is another than the stack's is refused, naming both."""

from __future__ import annotations

import re
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

# A conda dependency: [channel::]name[ version][=build] (conda's spellings: "pytorch=2.5.1",
# "pytorch==2.5.1", "pytorch 2.5.*", "pytorch>=2.4,<2.6", "conda-forge::numpy").
_DEP = re.compile(r"^(?:(?P<channel>[^:\s]+)::)?(?P<name>[A-Za-z0-9_][A-Za-z0-9_.-]*)\s*(?P<rest>.*)$")
_TORCH_NAMES = ("pytorch", "torch")


class EnvFileError(ValueError):
    """An environment.yml that cannot declare this stack's environment; the message says why."""


def split_spec(spec: str) -> tuple[str, str] | None:
    """A conda dependency as (its name, lower-case; what follows the name: version and build, ""
    for a bare name), or None where it is none ("pytorch ==2.5.1 cuda*" -> ("pytorch", "==2.5.1 cuda*"))."""
    match = _DEP.match(spec.strip())
    return (match.group("name").lower(), match.group("rest").strip()) if match else None


def read(document: Any, *, torch: str, python: str, where: str = "environment.yml") -> dict[str, Any]:
    """{channels, specs, pip} from a parsed environment.yml, with pytorch and python judged against
    the stack's: `specs` holds the file's conda dependencies but those two (the plan pins them)."""
    if not isinstance(document, dict):
        raise EnvFileError(f"{where} is not a mapping with channels and dependencies")
    channels = document.get("channels") or []
    deps = document.get("dependencies")
    if not isinstance(channels, list) or not all(isinstance(c, str) and c for c in channels):
        raise EnvFileError(f"{where}: channels must be a list of channel names or URLs")
    if not isinstance(deps, list) or not deps:
        raise EnvFileError(f"{where}: dependencies must be a non-empty list")
    specs: list[str] = []
    pip: list[str] = []
    for dep in deps:
        if isinstance(dep, dict):
            if set(dep) != {"pip"} or not isinstance(dep["pip"], list):
                raise EnvFileError(f"{where}: {dep!r} is neither a conda dependency nor a pip: list")
            pip += [_pip_line(str(p), where) for p in dep["pip"]]
            continue
        if not isinstance(dep, str):
            raise EnvFileError(f"{where}: dependency {dep!r} is not a string")
        parsed = split_spec(dep)
        if parsed is None:
            raise EnvFileError(f"{where}: {dep!r} is not a conda dependency (name, version, build)")
        name, rest = parsed
        if name in _TORCH_NAMES:
            _judge(dep, rest, torch, "torch", where)
        elif name == "python":
            _judge(dep, rest, python, "Python", where)
        elif name != "pip":  # the plan adds pip where there is a pip section
            specs.append(dep.strip())
    return {"channels": [c.strip() for c in channels if c.strip() != "nodefaults"], "specs": specs, "pip": pip}


def _pip_line(line: str, where: str) -> str:
    if line.startswith("-"):
        raise EnvFileError(
            f"{where}: pip option {line!r}: name the index with pytorch_env_pypi_url instead of in the file"
        )
    return line.strip()


def _judge(dep: str, rest: str, declared: str, what: str, where: str) -> None:
    """Refuse a pin of torch or Python that the stack's version does not meet."""
    version = rest.split("=", 2)[-2] if rest.count("=") == 2 and not rest.startswith("==") else rest
    version = version.split()[0] if version else ""  # "2.5.1 cuda*": the build is the plan's
    if not version or version == "*":
        return
    if not _matches(declared, version):
        raise EnvFileError(
            f"{where} asks for {dep.strip()!r}, but the stack declares {what} {declared}: make them one "
            f"(change the file's pin, or the stack's {what.lower()})"
        )


def _matches(declared: str, constraint: str) -> bool:
    """Whether a version meets a conda version constraint: "=2.5.1" and "2.5.1" (2.5.1 or
    2.5.1.x), "==2.5.1" (exactly), "2.5.*", ">=2.4,<2.6", "2.4|2.5"."""
    if "|" in constraint:
        return any(_matches(declared, part) for part in constraint.split("|"))
    try:
        have = Version(declared)
    except InvalidVersion:
        return False
    if constraint.startswith("=="):
        return _eq(have, constraint[2:])
    if constraint[0].isdigit() or constraint.startswith("="):
        prefix = constraint.lstrip("=").rstrip("*").rstrip(".")
        return _eq(have, prefix) or declared.startswith(prefix + ".")
    try:
        return have in SpecifierSet(constraint)
    except InvalidSpecifier:
        return False


def _eq(have: Version, text: str) -> bool:
    try:
        return have == Version(text)
    except InvalidVersion:
        return False
