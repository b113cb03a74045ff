"""The OS vars chain: which of a role's vars files serves a host, named once.

Each role that installs packages keeps one vars file per OS it serves in roles/<role>/vars/, named
by the chain, most specific first (the same names Ansible's first_found lookup walks in the roles,
through the gpuenv_os_vars_files filter):

    <source>-<distribution>-<major>.yml   nvidia_repo-Ubuntu-24.yml
    <source>-<distribution>.yml           nvidia_repo-Ubuntu.yml
    <source>-<os_family>.yml              nvidia_repo-RedHat.yml (Rocky, Alma, RHEL)
    <source>-default.yml                  redist-default.yml (any OS)

<source> is the role's way of getting its software (nvidia_driver_source, cuda_toolkit_source,
cudnn_source, pytorch_env_backend; ROLE_SELECTORS); a role with one way has no prefix. The file
found sets the package manager and the package names. A file that defines `__<role>_unserved`
(`__<role>_<part>_unserved` for a part with files of its own, gpu_services' toolkit-*.yml) says why
the role cannot serve that OS (Debian's driver packages on Ubuntu, whose family is
Debian too); no file found says the same in general. The preflight reads the same files
(unserved(), through gpuenv/preflight.py) and refuses such a host before anything is installed,
naming the role.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# role -> (the variable that picks its source, the role's default for it). The defaults are the
# roles' own (defaults/main.yml; tests/test_osvars.py holds them equal): the preflight runs
# in a play without those roles, where their defaults are not visible.
ROLE_SELECTORS: dict[str, tuple[str, str]] = {
    "nvidia_driver": ("nvidia_driver_source", "debian"),
    "gpu_services": ("gpu_services_source", "debian"),
    "cuda_toolkit": ("cuda_toolkit_source", "redist"),
    "cudnn": ("cudnn_source", "tarball"),
    "pytorch_env": ("pytorch_env_backend", "venv"),
}

# A source that installs nothing: the role has no OS files for it.
_NOTHING = {"none"}


def chain(facts: Mapping[str, Any], prefix: str | None = None) -> list[str]:
    """The file names to look for, most specific first."""
    lead = f"{prefix}-" if prefix else ""
    names = []
    distribution = str(facts.get("distribution") or "")
    major = str(facts.get("distribution_major_version") or "")
    family = str(facts.get("os_family") or "")
    if distribution and major:
        names.append(f"{lead}{distribution}-{major}.yml")
    if distribution:
        names.append(f"{lead}{distribution}.yml")
    if family and family != distribution:
        names.append(f"{lead}{family}.yml")
    names.append(f"{lead}default.yml")
    return names


def first_found(vars_dir: Path, facts: Mapping[str, Any], prefix: str | None = None) -> Path | None:
    for name in chain(facts, prefix):
        if (vars_dir / name).is_file():
            return vars_dir / name
    return None


@dataclass(frozen=True)
class Unserved:
    role: str
    selector: str | None  # "cuda_toolkit_source: nvidia_repo", or None for a role with one way
    why: str  # the file's own reason, or which files were looked for
    host: str  # the host's OS as its facts name it ("Rocky 9.5")


def unserved_by(vars_dir: Path, role: str, facts: Mapping[str, Any], prefix: str | None = None) -> str | None:
    """Why the role cannot serve this host (None: it can)."""
    found = first_found(vars_dir, facts, prefix)
    if found is None:
        return f"it has no vars file for this OS (looked for {', '.join(chain(facts, prefix))} in roles/{role}/vars)"
    loaded = yaml.safe_load(found.read_text(encoding="utf-8")) or {}
    why = (
        next((v for k, v in loaded.items() if str(k).endswith("_unserved")), None)
        if isinstance(loaded, Mapping)
        else None
    )
    return f"{why} (roles/{role}/vars/{found.name})" if why else None


def selections(settings: Mapping[str, Any], roles: Iterable[str] | None = None) -> dict[str, str | None]:
    """Each role of the run with its source, from the variables beside the stack (None or missing:
    the role's default). roles: the play's roles; none but the preflight's own (site.yml's preflight
    play), or None, means every stage of site.yml; a play of other roles (verify.yml alone) installs
    nothing and checks none. A role whose source installs nothing is left out, and so is
    nvidia_driver in nvidia_driver_mode: none."""
    others = [r for r in (roles or ()) if r != "gpu_stack"]
    wanted = [r for r in others if r in ROLE_SELECTORS] if others else list(ROLE_SELECTORS)
    out: dict[str, str | None] = {}
    for role in wanted:
        variable, default = ROLE_SELECTORS[role]
        source = str(settings.get(variable) or default)
        if role == "gpu_services" and not settings.get(variable):
            source = str(settings.get("nvidia_driver_source") or default)
        if source in _NOTHING or (role == "nvidia_driver" and settings.get("nvidia_driver_mode") == "none"):
            continue
        out[role] = source
    return out


def unserved(roles_dir: Path, facts: Mapping[str, Any], chosen: Mapping[str, str | None]) -> list[Unserved]:
    """The roles of `chosen` (role -> source) that cannot serve the host whose facts these are."""
    out = []
    host = " ".join(str(facts.get(k, "")) for k in ("distribution", "distribution_version")).strip() or "this host"
    for role, source in chosen.items():
        why = unserved_by(roles_dir / role / "vars", role, facts, source)
        if why is not None:
            selector = f"{ROLE_SELECTORS[role][0]}: {source}" if role in ROLE_SELECTORS and source else None
            out.append(Unserved(role, selector, why, host))
    return out
