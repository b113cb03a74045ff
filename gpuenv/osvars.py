"""The OS vars chain: which of a role's vars files serves a host, named once.

Each role that installs packages keeps one vars file per OS it serves in roles/<role>/vars/, named
by the chain, most specific first (the same names Ansible's first_found lookup walks in the roles,
through the gpuenv_os_vars_files filter):

    <source>-<distribution>-<major>.yml   nvidia_repo-Ubuntu-24.yml
    <source>-<distribution>.yml           nvidia_repo-Ubuntu.yml
    <source>-<os_family>.yml              nvidia_repo-RedHat.yml (Rocky, Alma, RHEL)
    <source>-default.yml                  redist-default.yml (any OS)

<source> is the role's way of getting its software (nvidia_driver_source, cuda_toolkit_source,
cudnn_source, pytorch_env_backend; role_selectors() finds each in the role's argument specs); a role
with one way has no prefix. The file found sets the package manager and the package names. A file
that defines `__<role>_unserved`
(`__<role>_<part>_unserved` for a part with files of its own, gpu_services' toolkit-*.yml) says why
the role cannot serve that OS (Debian's driver packages on Ubuntu, whose family is
Debian too); no file found says the same in general. The preflight reads the same files
(unserved(), through gpuenv/preflight.py) and refuses such a host before anything is installed,
naming the role.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from gpuenv.stages import StagesError, stage_roles


class Selector(NamedTuple):
    """The variable that picks a role's source, the role's default for it, and the variable whose
    value that default follows where the role's defaults say so (gpu_services_source: the driver's)."""

    variable: str
    default: str | None
    follows: str | None = None


# A default that follows another variable: "{{ nvidia_driver_source | default('debian') }}".
_FOLLOWS = re.compile(r"^\{\{\s*(\w+)\s*\|\s*default\(\s*'([^']*)'\s*\)\s*\}\}$")


@functools.cache
def role_selectors(roles_dir: Path) -> dict[str, Selector]:
    """role -> its Selector, for every role under roles_dir with vars files for more than one
    source (`<source>-<OS>.yml`): the option of its argument specs whose choices name those sources,
    with the default the specs give, or else the role's defaults/main.yml (which may follow another
    variable). Read from the roles, since the preflight runs in a play without them, where their
    defaults are not visible; a new role with sources needs no list here. In site.yml's order where
    roles_dir has its playbooks beside it, so that the preflight names the roles in the order they run."""
    found: dict[str, Selector] = {}
    for vars_dir in sorted(roles_dir.glob("*/vars")):
        sources = {p.name.split("-", 1)[0] for p in vars_dir.glob("*-*.yml")}
        specs = vars_dir.parent / "meta" / "argument_specs.yml"
        if not sources or not specs.is_file():
            continue
        options = (yaml.safe_load(specs.read_text(encoding="utf-8")) or {}).get("argument_specs", {})
        options = (options.get("main") or {}).get("options") or {}
        for name, option in options.items():
            if sources & {str(c) for c in (option or {}).get("choices") or ()}:
                found[vars_dir.parent.name] = _selector(vars_dir.parent, str(name), option.get("default"))
                break
    try:
        order = stage_roles(roles_dir.parent / "playbooks")
    except StagesError:
        order = []
    ranked = sorted(found, key=lambda role: (order.index(role) if role in order else len(order), role))
    return {role: found[role] for role in ranked}


def _selector(role_dir: Path, variable: str, spec_default: Any) -> Selector:
    if spec_default is not None:
        return Selector(variable, str(spec_default))
    defaults_file = role_dir / "defaults" / "main.yml"
    defaults = yaml.safe_load(defaults_file.read_text(encoding="utf-8")) if defaults_file.is_file() else None
    default = (defaults or {}).get(variable) if isinstance(defaults, Mapping) else None
    follows = _FOLLOWS.match(str(default)) if default is not None else None
    if follows:
        return Selector(variable, follows[2], follows[1])
    return Selector(variable, None if default is None else str(default))


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


def selections(
    roles_dir: Path, settings: Mapping[str, Any], roles: Iterable[str] | None = None
) -> dict[str, str | None]:
    """Each role of the run with its source, from the variables beside the stack (None or missing:
    the role's default), for the roles under roles_dir. roles: the play's roles; none but the
    preflight's own (site.yml's preflight play), or None, means every role with sources; a play of
    other roles (verify.yml alone) installs nothing and checks none. A role whose source installs
    nothing is left out, and so is nvidia_driver in nvidia_driver_mode: none."""
    selectors = role_selectors(roles_dir)
    others = [r for r in (roles or ()) if r != "gpu_stack"]
    wanted = [r for r in others if r in selectors] if others else list(selectors)
    by_variable = {selector.variable: selector for selector in selectors.values()}

    def value(selector: Selector, seen: frozenset[str]) -> str:
        # Set, or else the default; a default that follows another role's selector takes that one's.
        given = settings.get(selector.variable)
        if given or selector.follows is None:
            return str(given or selector.default)
        followed = by_variable.get(selector.follows)
        if followed is not None and followed.variable not in seen:
            return value(followed, seen | {selector.variable})
        return str(settings.get(selector.follows) or selector.default)

    out: dict[str, str | None] = {}
    for role in wanted:
        source = value(selectors[role], frozenset())
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
            selectors = role_selectors(roles_dir)
            selector = f"{selectors[role].variable}: {source}" if role in selectors and source else None
            out.append(Unserved(role, selector, why, host))
    return out
