"""gpuenv_conda_env against a channel made in the test: what it leaves in the prefix is a conda
environment conda itself can read (records, history, lock)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import load_plugin

rattler = pytest.importorskip("rattler")


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def make_channel(root: Path) -> Path:
    """A file:// channel holding one noarch package, hello-1.0-0, with one file."""
    noarch = root / "noarch"
    noarch.mkdir(parents=True)
    (root / "linux-64").mkdir()
    (root / "linux-64" / "repodata.json").write_text(json.dumps({"info": {"subdir": "linux-64"}, "packages": {}}))
    index = {"name": "hello", "version": "1.0", "build": "0", "build_number": 0, "depends": [], "subdir": "noarch"}
    payload = b"hello from the test channel\n"
    paths = {
        "paths": [
            {
                "_path": "share/hello.txt",
                "path_type": "hardlink",
                "sha256": hashlib.sha256(payload).hexdigest(),
                "size_in_bytes": len(payload),
            }
        ],
        "paths_version": 1,
    }
    package = noarch / "hello-1.0-0.tar.bz2"
    with tarfile.open(package, "w:bz2") as tar:
        _member(tar, "info/index.json", json.dumps(index).encode())
        _member(tar, "info/paths.json", json.dumps(paths).encode())
        _member(tar, "share/hello.txt", payload)
    data = package.read_bytes()
    record = dict(
        index,
        sha256=hashlib.sha256(data).hexdigest(),
        md5=hashlib.md5(data, usedforsecurity=False).hexdigest(),
        size=len(data),
    )
    repodata = {"info": {"subdir": "noarch"}, "packages": {package.name: record}}
    (noarch / "repodata.json").write_text(json.dumps(repodata))
    return root


def module_params(tmp_path: Path, prefix: str, spec: str) -> dict[str, Any]:
    """The module's parameters for a new environment from the test's channel (made here)."""
    return {
        "prefix": str(tmp_path / prefix),
        "channels": [make_channel(tmp_path / "channel").as_uri()],
        "specs": [spec],
        "lock": str(tmp_path / "env.conda-lock.yml"),
        "cuda": "",
        "cache_dir": str(tmp_path / "pkgs"),
    }


def test_a_new_environment_has_its_records_a_history_conda_reads_and_a_lock(tmp_path: Path) -> None:
    module = load_plugin("plugins/modules/gpuenv_conda_env.py")
    params = module_params(tmp_path, "env", "hello ==1.0")
    channel = params["channels"][0]
    result = module.run(params, check_mode=False)
    assert result["solved"] is True
    assert [(p["name"], p["version"]) for p in result["packages"]] == [("hello", "1.0")]
    meta = tmp_path / "env" / "conda-meta"
    assert json.loads((meta / "hello-1.0-0.json").read_text())["name"] == "hello"
    assert (tmp_path / "env" / "share" / "hello.txt").read_bytes() == b"hello from the test channel\n"
    history = (meta / "history").read_text().splitlines()
    # conda.history.History's format: a dated header, comments, one "+channel/subdir::dist" per package.
    assert history[0].startswith("==> ")
    assert history[0].endswith(" <==")
    assert f"+{channel}/noarch::hello-1.0-0" in history
    assert '# update specs: ["hello ==1.0"]' in history
    assert Path(params["lock"]).exists()


def test_the_lock_is_installed_again_without_a_solve_and_an_existing_environment_is_refused(tmp_path: Path) -> None:
    module = load_plugin("plugins/modules/gpuenv_conda_env.py")
    params = module_params(tmp_path, "one", "hello")
    module.run(params, check_mode=False)
    again = module.run(dict(params, prefix=str(tmp_path / "two")), check_mode=False)
    assert again["solved"] is False
    assert (tmp_path / "two" / "conda-meta" / "hello-1.0-0.json").exists()
    with pytest.raises(ValueError, match="holds an environment already"):
        module.run(params, check_mode=False)
