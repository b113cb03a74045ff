#!/usr/bin/python
"""Ansible module gpuenv_conda_env: a conda environment solved once with py-rattler, locked with
every package's URL and sha256, and rebuilt from the lock without solving again."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuenv_envexport import environment_yml, explicit, from_records, install_order

DOCUMENTATION = r"""
module: gpuenv_conda_env
short_description: Solve, lock and install a conda prefix with py-rattler
description:
  - Solves I(specs) against I(channels) for linux-64 and installs the packages into I(prefix), a
    real conda environment (C(conda-meta/*.json) for every package, C(conda-meta/history), the
    prefix replaced in text files, entry points), which C(conda activate) and
    C(micromamba activate) accept.
  - The solve does not ask the host's GPU or driver. The C(__cuda) virtual package is I(cuda) (the
    declared driver's CUDA, what C(CONDA_OVERRIDE_CUDA) sets), so a host before its first reboot,
    or one without a GPU, gets the CUDA build the stack declares.
  - The solved set is written to I(lock) (pixi's lock format, every package with its URL and
    sha256). When I(lock) exists, exactly its packages are installed and nothing is solved.
  - A spec the channels cannot solve fails with the solver's own explanation.
  - py-rattler must be importable by the Python this module runs with (the role runs it with the
    tools environment's Python).
options:
  prefix:
    description: The environment's directory (created; it must not hold another environment).
    type: path
    required: true
  channels:
    description: Channel URLs, highest priority first.
    type: list
    elements: str
    required: true
  specs:
    description: Match specs, as rattler reads them (C(pytorch ==2.5.1 cuda*), C(python 3.13.*)).
    type: list
    elements: str
    required: true
  lock:
    description: The lock file to install from, or to write after a solve.
    type: path
    required: true
  cuda:
    description: The C(__cuda) version to solve for (C(12.4)); empty for a host without CUDA.
    type: str
    default: ""
  cache_dir:
    description: rattler's package cache (packages are hard-linked from it into prefixes).
    type: path
    default: /var/cache/gpuenv/conda-pkgs
  state:
    description:
      - C(present) solves (or reads the lock) and installs.
      - C(exported) installs nothing; it writes I(export_dir)/C(environment.yml) and
        I(export_dir)/C(explicit.txt) from the lock, so that the environment can be made again
        elsewhere (C(conda env create -f), C(conda create --file), C(micromamba create -f)).
    type: str
    choices: [present, exported]
    default: present
  export_dir:
    description: Where C(exported) writes the two files (created, mode 0755; the files 0644).
    type: path
  env_name:
    description: The environment's name in the exported environment.yml.
    type: str
    default: default
  pip:
    description: What pip installed into the prefix (C(name==version)), the exported environment.yml's pip section.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Build the environment
  gpuenv_conda_env:
    prefix: /opt/gpuenv/envs/.store/default-0123456789ab
    channels: [https://conda.anaconda.org/conda-forge]
    specs: ["python 3.13.*", "pytorch ==2.5.1 cuda*", "cuda-version >=12.4,<13"]
    lock: /opt/gpuenv/envs/.locks/default-0123456789ab.conda-lock.yml
    cuda: "12.2"
  vars:
    ansible_python_interpreter: /opt/gpuenv/tools/rattler/bin/python
"""

RETURN = r"""
exports:
  description: With C(exported), the paths of the two files written.
  type: list
solved:
  description: Whether this run solved (no lock yet) or installed the lock's packages.
  type: bool
packages:
  description: Every package installed, with name, version, build, url and sha256.
  type: list
"""

PLATFORM = "linux-64"


def _records_from_lock(path: str) -> list[Any]:
    import rattler  # noqa: PLC0415 - the module must load without it, to say what is missing

    lock = rattler.LockFile.from_path(Path(path))
    env = lock.environment("default")
    # The lock's own platform object: py-rattler refuses one made anew.
    platform = next((p for p in lock.platforms() if _name(p) == PLATFORM), None)
    records = env.conda_repodata_records_for_platform(platform) if env and platform else None
    if not records:
        raise ValueError(f"{path} holds no linux-64 packages for the environment 'default'")
    return list(records)


def _name(platform: Any) -> str:
    name = platform.name
    return str(name() if callable(name) else name)


def _solve(channels: list[str], specs: list[str], cuda: str) -> list[Any]:
    import rattler  # noqa: PLC0415

    overrides = rattler.VirtualPackageOverrides(cuda=rattler.Override.string(cuda) if cuda else None)
    virtual = rattler.VirtualPackage.detect(overrides)
    if not cuda:
        virtual = [v for v in virtual if not str(v.into_generic().name.normalized).startswith("__cuda")]
    return list(asyncio.run(rattler.solve(sources=channels, specs=specs, virtual_packages=virtual)))


def _write_lock(path: str, channels: list[str], records: list[Any]) -> None:
    import rattler  # noqa: PLC0415

    platform = rattler.LockPlatform(PLATFORM)
    lock = rattler.LockFile([platform])
    lock.set_channels("default", [rattler.LockChannel(c) for c in channels])
    for record in records:
        lock.add_conda_package("default", platform, record)
    tmp = path + ".tmp"
    lock.to_path(Path(tmp))
    os.replace(tmp, path)


def history_entry(records: list[Any], specs: list[str], when: str, engine: str) -> str:
    """One revision in conda's own conda-meta/history format (conda.history.History)."""
    lines = [f"==> {when} <==", f"# cmd: gpuenv_conda_env (py-rattler {engine})"]
    for record in sorted(records, key=lambda r: str(r.name.normalized)):
        channel = str(record.url).rsplit("/", 2)[0]
        lines.append(f"+{channel}/{record.subdir}::{record.name.normalized}-{record.version}-{record.build}")
    lines.append(f"# update specs: {json.dumps(specs)}")
    return "\n".join(lines) + "\n"


def describe(record: Any) -> dict[str, str]:
    """What the module returns of a package: its name, version, build, url and sha256."""
    (full,) = from_records([record])
    return {k: full[k] for k in ("name", "version", "build", "url", "sha256")}


def export(p: dict[str, Any], check_mode: bool) -> dict[str, Any]:
    """environment.yml and explicit.txt from the lock, rewritten only where they differ."""
    if not p.get("export_dir"):
        raise ValueError("state exported needs export_dir")
    packages = install_order(from_records(_records_from_lock(p["lock"])))
    host = os.uname().nodename
    texts = {
        "environment.yml": environment_yml(
            p["env_name"], p["channels"], packages, p["pip"], host=host, prefix=p["prefix"]
        ),
        "explicit.txt": explicit(packages, name=p["env_name"], host=host, prefix=p["prefix"]),
    }
    paths = [os.path.join(p["export_dir"], n) for n in texts]
    changed = False
    for path, text in zip(paths, texts.values(), strict=True):
        try:
            with open(path, encoding="utf-8") as f:
                same = f.read() == text
        except OSError:
            same = False
        if same:
            continue
        changed = True
        if not check_mode:
            os.makedirs(p["export_dir"], mode=0o755, exist_ok=True)
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(path + ".tmp", 0o644)
            os.replace(path + ".tmp", path)
    return {"changed": changed, "exports": paths}


def run(p: dict[str, Any], check_mode: bool) -> dict[str, Any]:
    import rattler  # noqa: PLC0415

    if p.get("state") == "exported":
        return export(p, check_mode)

    if os.path.exists(os.path.join(p["prefix"], "conda-meta")):
        raise ValueError(f"{p['prefix']} holds an environment already; the role builds into a new directory")
    solved = not os.path.exists(p["lock"])
    records = _solve(p["channels"], p["specs"], p["cuda"]) if solved else _records_from_lock(p["lock"])
    result: dict[str, Any] = {"changed": True, "solved": solved, "packages": [describe(r) for r in records]}
    if check_mode:
        return result
    os.makedirs(p["cache_dir"], exist_ok=True)
    # py-rattler 0.28's install() takes its native match specs here, not the Python wrapper (a
    # TypeError otherwise).
    specs = [getattr(spec, "_match_spec", spec) for spec in (rattler.MatchSpec(s) for s in p["specs"])]
    asyncio.run(
        rattler.install(records, p["prefix"], cache_dir=p["cache_dir"], show_progress=False, requested_specs=specs)
    )
    # py-rattler leaves conda-meta/history empty; conda reads it for `conda list --revisions` and
    # for the specs a later `conda update` must keep, so write the revision conda would have.
    with open(os.path.join(p["prefix"], "conda-meta", "history"), "a", encoding="utf-8") as history:
        history.write(history_entry(records, p["specs"], time.strftime("%Y-%m-%d %H:%M:%S"), rattler.__version__))
    if solved:
        _write_lock(p["lock"], p["channels"], records)
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "prefix": {"type": "path", "required": True},
            "channels": {"type": "list", "elements": "str", "required": True},
            "specs": {"type": "list", "elements": "str", "required": True},
            "lock": {"type": "path", "required": True},
            "cuda": {"type": "str", "default": ""},
            "cache_dir": {"type": "path", "default": "/var/cache/gpuenv/conda-pkgs"},
            "state": {"type": "str", "choices": ["present", "exported"], "default": "present"},
            "export_dir": {"type": "path"},
            "env_name": {"type": "str", "default": "default"},
            "pip": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    try:
        import rattler  # noqa: PLC0415, F401
    except ImportError as exc:
        module.fail_json(
            msg=f"py-rattler cannot be imported by the Python running gpuenv_conda_env ({exc}); run it with the "
            "tools environment's Python (the pytorch_env role installs it into /opt/gpuenv/tools/rattler)"
        )
    try:
        result = run(module.params, module.check_mode)
    except Exception as exc:  # the solver's and the installer's errors are the message
        kind = type(exc).__name__
        what = "export" if module.params["state"] == "exported" else "solve" if "Solve" in kind else "install"
        module.fail_json(
            msg=f"the conda {what} of {module.params['prefix']} failed ({kind}): {str(exc).strip()[:3000]}",
            specs=module.params["specs"],
            channels=module.params["channels"],
        )
        raise  # fail_json exits; this line is for the type checker
    module.exit_json(**result)


if __name__ == "__main__":
    main()
