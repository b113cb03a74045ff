"""Pure helpers for the pytorch_env role: what an environment is made of (the pinned requirement
set and where torch comes from), its id, and a hash-pinned lock from pip's installation report.
Tested in tests/test_envplan.py."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from gpuenv import compat, condaplan, envfile

_PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+$")


class EnvPlanError(ValueError):
    """A declared environment that cannot be built; the message says what to fix."""


def plan(
    *,
    torch: str,
    variant: str,
    python: str,
    packages: list[str],
    companions: list[str] | str,
    index_template: str,
    pypi_url: str,
    backend: str,
    conda_style: str = "auto",
    environment: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The requirement set of an environment and where torch comes from.

    torch comes from PyPI when `variant` is PyPI's default build of that release (the wheel has no
    local version there), else from PyTorch's index for the variant (`index_template` with
    "{variant}"), where every wheel carries "+<variant>". For the conda backend, `conda` holds the
    conda specs and channels (gpuenv.condaplan); pip then installs only what no conda spec covers:
    the stack's pip packages, and torch itself where the style is "wheels".

    `environment` is a team's environment.yml (parsed): its channels, conda dependencies and pip
    section join the plan, its pytorch and python judged against the stack's (gpuenv.envfile)."""
    data = compat.load()
    declared = None
    if environment is not None:
        if backend != "conda":
            raise EnvPlanError(
                "pytorch_env_environment_file declares a conda environment; set pytorch_env_backend: conda "
                "(or declare a venv's packages in pytorch_env_packages)"
            )
        try:
            declared = envfile.read(environment, torch=torch, python=python)
        except envfile.EnvFileError as exc:
            raise EnvPlanError(str(exc)) from None
        packages = [*packages, *declared["pip"]]
    series = data.torch_series(torch)
    if series is None or torch not in series.releases:
        raise EnvPlanError(f"torch {torch} is not in the compatibility data; known: {', '.join(data.torch_releases())}")
    if variant != "cpu" and variant not in series.variants:
        raise EnvPlanError(
            f"torch {torch} has no {variant} build in the data; builds: cpu, {', '.join(sorted(series.variants))}"
        )
    conda = None
    if backend == "conda":
        try:
            conda = condaplan.plan(
                torch=torch, variant=variant, python=python, style=conda_style, companions=companions,
                packages=packages,
            )  # fmt: skip
        except condaplan.CondaPlanError as exc:
            raise EnvPlanError(str(exc)) from None
        if declared is not None:
            conda = {**conda, **_with_file(conda, declared)}
        packages = [p for p in packages if not p.startswith("conda:")]
    bad = [p for p in packages if not _PIN.match(p)]
    if bad:
        raise EnvPlanError(f"extra packages must be pinned as name==version: {', '.join(bad)}")
    from_pypi = variant == series.pypi_default
    local = "" if from_pypi else f"+{variant}"
    table = data.raw["torch_companions"]["releases"].get(torch, {})
    requirements = [f"torch=={torch}{local}"]
    if companions == "auto":  # each of torchvision / torchaudio that has a release for this torch
        companions = [name for name in ("torchvision", "torchaudio") if table.get(name)]
    pinned: dict[str, str] = {}
    for name in companions:
        if name not in ("torchvision", "torchaudio"):
            raise EnvPlanError(f"companion {name!r} is not torchvision or torchaudio")
        version = table.get(name)
        if version is None:
            raise EnvPlanError(
                f"no {name} release belongs to torch {torch} (compat.yaml torch_companions); "
                f"drop it from pytorch_env_companions or pin one in pytorch_env_packages"
            )
        requirements.append(f"{name}=={version}{local}")
        pinned[name] = version
    if conda is not None and conda["style"] != "wheels":
        requirements = []  # torch and its companions are conda packages
        pinned = dict(conda["companions"])
    requirements += sorted(packages)
    index = None if from_pypi else index_template.replace("{variant}", variant)
    spec: dict[str, Any] = {
        "backend": backend,
        "python": python,
        "requirements": requirements,
        "torch_index": index,
        "pypi": pypi_url,
    }
    if conda is not None:
        spec["conda"] = {k: conda[k] for k in ("style", "channels", "specs")}
        if requirements and "pip" not in spec["conda"]["specs"]:
            spec["conda"]["specs"] = [*spec["conda"]["specs"], "pip"]  # pip installs the rest
    # The companions and their versions are what verify's torch.companions expects (not part of the
    # id: the requirements and specs above already name them).
    return {
        **spec,
        "from_pypi": from_pypi,
        "id": env_id(spec),
        "companions": pinned,
        "notes": conda["notes"] if conda else [],
    }


def _spec_name(spec: str) -> str:
    parsed = envfile.split_spec(spec)
    return parsed[0] if parsed else spec


def _with_file(conda: dict[str, Any], declared: dict[str, Any]) -> dict[str, Any]:
    """The plan's specs and channels with an environment.yml's: a dependency the plan also names
    takes the file's spec where the file gives a version (a bare name keeps the plan's pin); the
    file's channels, where it names any, come first."""
    specs = list(conda["specs"])
    names = [_spec_name(s) for s in specs]
    companions = dict(conda["companions"])
    for spec in declared["specs"]:
        name, rest = envfile.split_spec(spec) or (spec, "")
        if name in names:
            if rest:  # it carries a version or build
                specs[names.index(name)] = spec
                companions.pop(name, None)  # the file's spec decides: no single version to expect
        else:
            specs.append(spec)
            names.append(name)
    channels = list(dict.fromkeys([*declared["channels"], *conda["channels"]]))
    return {"specs": specs, "channels": channels, "companions": companions}


def env_id(spec: dict[str, Any]) -> str:
    """12 hex digits naming an environment by what it contains: same stack, same directory."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def installed_from_report(report: dict[str, Any] | str) -> list[dict[str, str]]:
    """What `pip install --report` installed: name, version, the file's URL and its sha256 (the
    one reader of pip's report, for both locks below)."""
    data: dict[str, Any] = json.loads(report) if isinstance(report, str) else report
    found = []
    for item in data.get("install", []):
        meta = item.get("metadata", {})
        name, version = meta.get("name"), meta.get("version")
        if not name or not version:
            raise EnvPlanError("pip's report lists a distribution without name or version")
        download = item.get("download_info", {})
        info = download.get("archive_info", {})
        sha = info.get("hashes", {}).get("sha256")
        if not sha and str(info.get("hash", "")).startswith("sha256="):
            sha = info["hash"].split("=", 1)[1]
        if not sha:
            raise EnvPlanError(f"pip's report gives no sha256 for {name} {version}")
        found.append({"name": name, "version": version, "url": str(download.get("url", "")), "sha256": sha})
    return sorted(found, key=lambda d: d["name"].lower())


def lock_from_report(report: dict[str, Any] | str) -> str:
    """A requirements lock ("name==version --hash=sha256:...") from `pip install --report`.

    Every installed distribution is listed with the sha256 pip verified for it; the lock
    reinstalls exactly that set with `pip install --require-hashes --no-deps -r`."""
    lines = [f"{d['name']}=={d['version']} --hash=sha256:{d['sha256']}" for d in installed_from_report(report)]
    return "\n".join(lines) + "\n"


def pylock_from_report(report: dict[str, Any] | str, *, python: str) -> str:
    """The same set as a PEP 751 lock (pylock.toml): every package with its file's URL and sha256,
    which `uv pip install -r pylock.toml` (and any installer of the standard) installs as it is: a
    wheel, or the source archive of a package named in pytorch_env_source_builds."""
    lines = ['lock-version = "1.0"', 'created-by = "gpuenv"', f"requires-python = {_toml(f'=={python}.*')}", ""]
    for d in installed_from_report(report):
        path = d["url"].split("?", 1)[0].split("#", 1)[0]
        if path.endswith(".whl"):
            table = "[[packages.wheels]]"
        elif path.endswith(_SDIST_SUFFIXES):
            table = "[packages.sdist]"
        else:
            raise EnvPlanError(
                f"pip's report gives {d['name']} {d['version']} from {d['url']!r}, neither a wheel nor a source archive"
            )
        lines += [
            "[[packages]]",
            f"name = {_toml(d['name'])}",
            f"version = {_toml(d['version'])}",
            "",
            table,
            f"url = {_toml(d['url'])}",
            f"hashes = {{ sha256 = {_toml(d['sha256'])} }}",
            "",
        ]
    return "\n".join(lines)


_SDIST_SUFFIXES = (".tar.gz", ".zip")  # the source archives PEP 625 and PEP 751 know


def _toml(text: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's for these characters)."""
    return json.dumps(text)
