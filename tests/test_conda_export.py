"""A conda environment exported as a member makes it again elsewhere (gpuenv_conda_env's state
exported, plugins/module_utils/gpuenv_envexport.py): an environment.yml with every package at its
build, and an explicit list. The set is made again from the exported file with py-rattler, and
must be the same records with the same sha256."""

from __future__ import annotations

import asyncio
import hashlib
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import load_plugin, module_utils
from tests.test_conda_env_module import _member

rattler = pytest.importorskip("rattler")
export = module_utils("gpuenv_envexport")


def _package(noarch: Path, name: str, version: str, depends: list[str]) -> dict[str, Any]:
    index = {"name": name, "version": version, "build": "0", "build_number": 0, "depends": depends, "subdir": "noarch"}
    payload = f"{name} {version}\n".encode()
    paths = {"paths": [{"_path": f"share/{name}.txt", "path_type": "hardlink",
                        "sha256": hashlib.sha256(payload).hexdigest(), "size_in_bytes": len(payload)}],
             "paths_version": 1}  # fmt: skip
    package = noarch / f"{name}-{version}-0.tar.bz2"
    with tarfile.open(package, "w:bz2") as tar:
        _member(tar, "info/index.json", json.dumps(index).encode())
        _member(tar, "info/paths.json", json.dumps(paths).encode())
        _member(tar, f"share/{name}.txt", payload)
    data = package.read_bytes()
    return dict(index, sha256=hashlib.sha256(data).hexdigest(),
                md5=hashlib.md5(data, usedforsecurity=False).hexdigest(), size=len(data))  # fmt: skip


def make_channel(root: Path) -> str:
    """A file:// channel: app 1.0 needing lib, lib 1.0 and 2.0 (the solve takes 2.0)."""
    noarch = root / "noarch"
    noarch.mkdir(parents=True)
    (root / "linux-64").mkdir()
    (root / "linux-64" / "repodata.json").write_text(json.dumps({"info": {"subdir": "linux-64"}, "packages": {}}))
    records = [_package(noarch, "app", "1.0", ["lib >=1"]), _package(noarch, "lib", "1.0", []),
               _package(noarch, "lib", "2.0", [])]  # fmt: skip
    packages = {f"{r['name']}-{r['version']}-0.tar.bz2": r for r in records}
    (noarch / "repodata.json").write_text(json.dumps({"info": {"subdir": "noarch"}, "packages": packages}))
    return root.as_uri()


@pytest.fixture
def built(tmp_path: Path) -> dict[str, Any]:
    """An environment built and exported by the module, and its parameters."""
    module = load_plugin("plugins/modules/gpuenv_conda_env.py")
    params = {
        "prefix": str(tmp_path / "env"),
        "channels": [make_channel(tmp_path / "channel")],
        "specs": ["app"],
        "lock": str(tmp_path / "env.conda-lock.yml"),
        "cuda": "",
        "cache_dir": str(tmp_path / "pkgs"),
        "state": "present",
        "export_dir": str(tmp_path / "exports"),
        "env_name": "team",
        "pip": ["einops==0.8.1"],
    }
    module.run(params, check_mode=False)
    first = module.run(dict(params, state="exported"), check_mode=False)
    again = module.run(dict(params, state="exported"), check_mode=False)
    return {"params": params, "first": first, "again": again, "module": module}


def _lock_records(path: str) -> list[tuple[str, str, str, str]]:
    lock = rattler.LockFile.from_path(Path(path))
    platform = next(p for p in lock.platforms() if "linux-64" in str(p))
    records = lock.environment("default").conda_repodata_records_for_platform(platform)
    return sorted((str(r.name.normalized), str(r.version), str(r.build), r.sha256.hex()) for r in records)


def test_the_exported_environment_yml_makes_the_same_records_again(built: dict[str, Any], tmp_path: Path) -> None:
    params = built["params"]
    document = yaml.safe_load((tmp_path / "exports" / "environment.yml").read_text())
    assert document["name"] == "team"
    assert document["channels"] == [*params["channels"], "nodefaults"]
    assert document["dependencies"] == ["app=1.0=0", "lib=2.0=0", {"pip": ["einops==0.8.1"]}]
    # A member's machine: solve the file's exact specs with py-rattler, against the file's channels.
    specs = [rattler.MatchSpec(d) for d in document["dependencies"] if isinstance(d, str)]
    channels = [c for c in document["channels"] if c != "nodefaults"]
    again = asyncio.run(rattler.solve(sources=channels, specs=specs, virtual_packages=[]))
    made = sorted((str(r.name.normalized), str(r.version), str(r.build), r.sha256.hex()) for r in again)
    assert made == _lock_records(params["lock"])


def test_the_explicit_list_names_each_locked_file_with_its_md5_after_what_it_needs(
    built: dict[str, Any], tmp_path: Path
) -> None:
    text = (tmp_path / "exports" / "explicit.txt").read_text()
    assert "\n# platform: linux-64\n@EXPLICIT\n" in text
    lines = [line for line in text.splitlines() if not line.startswith(("#", "@"))]
    channel = built["params"]["channels"][0]
    assert [line.split("#")[0] for line in lines] == [f"{channel}/noarch/lib-2.0-0.tar.bz2",
                                                      f"{channel}/noarch/app-1.0-0.tar.bz2"]  # fmt: skip
    for line in lines:
        url, md5 = line.split("#")
        data = Path(url.removeprefix("file://")).read_bytes()
        assert md5 == hashlib.md5(data, usedforsecurity=False).hexdigest()
    # py-rattler (as conda and micromamba) reads it as an explicit environment
    from rattler.explicit_environment import ExplicitEnvironmentSpec  # noqa: PLC0415

    spec = ExplicitEnvironmentSpec.from_str(text)
    assert [p.url for p in spec.packages] == lines


def test_an_export_is_rewritten_only_where_it_differs(built: dict[str, Any], tmp_path: Path) -> None:
    assert built["first"]["changed"] is True
    assert built["again"]["changed"] is False
    (tmp_path / "exports" / "explicit.txt").write_text("damaged\n")
    check = built["module"].run(dict(built["params"], state="exported"), check_mode=True)
    assert check["changed"] is True
    assert (tmp_path / "exports" / "explicit.txt").read_text() == "damaged\n"  # check mode wrote nothing


def test_a_lock_without_md5_cannot_be_an_explicit_list() -> None:
    with pytest.raises(ValueError, match="no URL or md5 for lib"):
        export.explicit([{"name": "lib", "url": "https://x/lib.conda", "md5": ""}], name="e", host="h", prefix="/p")


def test_install_order_puts_dependencies_first_and_survives_a_cycle() -> None:
    packages = [{"name": "a", "depends": ["b >=1"]}, {"name": "b", "depends": ["c"]}, {"name": "c", "depends": ["a"]}]
    for p in packages:
        p.update(version="1", build="0")
    assert [p["name"] for p in export.install_order(packages)] == ["c", "b", "a"]
