"""Filters for the converged role's digest of a run's inputs, on the controller: gpuenv's own code,
the option names of the stage roles, and one digest of their values (tested in
tests/test_converged.py)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import yaml

# What a run of site.yml does on a host follows from these, below the repository's root: a change
# to any file in them (a role's defaults, a template, a module, the gpuenv package a filter calls)
# makes the next run run every stage. Tests, caches and the READMEs change nothing a host gets.
CODE_DIRS = ("roles", "plugins", "playbooks", "gpuenv")
CODE_FILES = ("ansible.cfg",)
SKIP_DIRS = frozenset({"tests", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"})
SKIP_SUFFIXES = (".pyc", ".pyo", ".md")


def gpuenv_code_digest(root: str) -> str:
    """sha256 over the relative path and content of every file of gpuenv's code below ROOT."""
    base = Path(root).resolve()
    h = hashlib.sha256()
    files: list[Path] = [base / name for name in CODE_FILES if (base / name).is_file()]
    for top in CODE_DIRS:
        for dirpath, dirnames, filenames in os.walk(base / top):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            files += [Path(dirpath) / f for f in filenames if not f.endswith(SKIP_SUFFIXES)]
    for path in sorted(files):
        h.update(str(path.relative_to(base)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


# The fleet's caches of builds (<role>_build_cache, _dir, _keep) decide where a host's build comes
# from, never what the host gets: another cache directory (a benchmark's per-run one) is no change.
NOT_HOST_INPUTS = "_build_cache"


def gpuenv_role_options(roles_dir: str, roles: list[str]) -> list[str]:
    """The option names the argument specs of ROLES declare (every entry point), sorted: the
    settings that make a stage do one thing or another."""
    names: set[str] = set()
    for role in roles:
        spec_file = Path(roles_dir) / role / "meta" / "argument_specs.yml"
        data = yaml.safe_load(spec_file.read_text()) or {}
        for entry in (data.get("argument_specs") or {}).values():
            names.update((entry or {}).get("options") or {})
    return sorted(n for n in names if NOT_HOST_INPUTS not in n)


def gpuenv_digest(value: Any) -> str:
    """sha256 of VALUE as canonical JSON (keys sorted; what JSON has no form for, as its str())."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "gpuenv_code_digest": gpuenv_code_digest,
            "gpuenv_role_options": gpuenv_role_options,
            "gpuenv_digest": gpuenv_digest,
        }
