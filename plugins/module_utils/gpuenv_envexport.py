"""What a built conda environment exports, so that a member can make the same set elsewhere (a
laptop, a CI runner): an environment.yml with every package pinned to its version and build, which
`conda env create -f` and `micromamba create -f` accept, and an explicit spec list (CEP 23: the
`@EXPLICIT` marker, one package URL per line with its md5), which `conda create --file` and
`micromamba create -f` install without solving. Pure functions over the packages' records
(name, version, build, url, md5, sha256), as gpuenv_conda_env reads them from its lock."""

from __future__ import annotations

import json
from typing import Any

HEADER = (
    "# The environment {name} as gpuenv built it on {host} ({prefix}), every package pinned to its build.\n"
    "# Made again elsewhere with: {command}\n"
)


def _sorted(packages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(packages, key=lambda p: (str(p["name"]), str(p["version"]), str(p["build"])))


def environment_yml(
    name: str, channels: list[str], packages: list[dict[str, Any]], pip: list[str], *, host: str, prefix: str
) -> str:
    """conda's environment.yml: the channels (nodefaults: no channel but these), each package as
    name=version=build, and a pip section for what pip installed into the prefix. Written by hand
    (JSON strings are YAML strings) so that the host needs no YAML library."""
    lines = [HEADER.format(name=name, host=host, prefix=prefix, command="conda env create -f environment.yml")]
    lines.append(f"name: {json.dumps(name)}\n")
    lines.append("channels:\n")
    lines += [f"  - {json.dumps(c)}\n" for c in [*channels, "nodefaults"]]
    lines.append("dependencies:\n")
    lines += [f"  - {json.dumps(spec(p))}\n" for p in _sorted(packages)]
    if pip:
        lines.append("  - pip:\n")
        lines += [f"      - {json.dumps(r)}\n" for r in pip]
    return "".join(lines)


def spec(package: dict[str, Any]) -> str:
    """The exact match spec of one package: name=version=build."""
    return f"{package['name']}={package['version']}={package['build']}"


def explicit(packages: list[dict[str, Any]], *, name: str, host: str, prefix: str) -> str:
    """The explicit spec list: each package's URL with its md5 (CEP 23's checksum). Packages in the
    order of the lock, which installs each after what it depends on (conda installs them in the
    file's order)."""
    missing = [p["name"] for p in packages if not p.get("md5") or not p.get("url")]
    if missing:
        names = ", ".join(map(str, missing))
        raise ValueError(f"the lock gives no URL or md5 for {names}: the explicit list needs both")
    head = HEADER.format(name=name, host=host, prefix=prefix, command="conda create --name NAME --file explicit.txt")
    body = [f"{p['url']}#{p['md5']}\n" for p in packages]
    return head + "# platform: linux-64\n@EXPLICIT\n" + "".join(body)


def from_records(records: list[Any]) -> list[dict[str, Any]]:
    """py-rattler's records as plain dicts (its hashes are bytes)."""

    def _hex(value: Any) -> str:
        return value.hex() if isinstance(value, bytes) else str(value or "")

    return [
        {
            "name": str(r.name.normalized),
            "version": str(r.version),
            "build": str(r.build),
            "url": str(r.url),
            "md5": _hex(r.md5),
            "sha256": _hex(r.sha256),
            "depends": [str(d) for d in r.depends],
        }
        for r in records
    ]


def install_order(packages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The packages with each after those it depends on (by name; a cycle keeps the name order)."""
    by_name = {p["name"]: p for p in packages}
    done: list[dict[str, Any]] = []
    seen: set[str] = set()

    def visit(name: str, stack: tuple[str, ...]) -> None:
        if name in seen or name not in by_name or name in stack:
            return
        for dep in by_name[name].get("depends", []):
            visit(str(dep).split()[0], (*stack, name))
        seen.add(name)
        done.append(by_name[name])

    for package in _sorted(packages):
        visit(package["name"], ())
    return done
