"""The cudnn role's one unpack for the fleet, for real on the controller: three inventory hosts (each
the controller, with a CUDA tree and a download directory of its own) run the role as site.yml does,
the placement in the background, then its join in a later play. The first host fetches and unpacks
the tarball; the others fetch nothing, wait, copy its unpacked copy from the controller's cache and
build their trees from it. A second play of hosts that lack the cuDNN restores the entry; an entry
overwritten on the controller is refused, unpacked again from the tarball and replaced."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import run_tool
from tests.cudnn_tarballs import make_host, make_tarball

VERSION = "8.6.0.163"
HOSTS = ("h1", "h2", "h3")


def _inventory(tmp_path: Path, hosts: dict[str, dict[str, Path]], archive: Path, sha: str) -> Path:
    inventory = {
        "all": {
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                # What the preflight resolves for a stack with cuDNN 8.6.0 on CUDA 11.
                "gpu_stack_resolved": {"cudnn": VERSION, "cudnn_release": "8.6.0", "cuda_major": "11"},
                "cudnn_tarball_path": str(archive),
                "cudnn_tarball_checksum": f"sha256:{sha}",
                "cudnn_controller_cache": str(tmp_path / "controller/redist"),
                "cudnn_build_cache_dir": str(tmp_path / "controller/cudnn-unpacked"),
            },
            "hosts": {
                name: {"cudnn_cuda_trees": [str(h["link"])], "cudnn_download_dir": str(h["downloads"])}
                for name, h in hosts.items()
            },
        }
    }
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inventory))
    return path


PLAYS = [
    {
        "name": "CUDA toolkit and cuDNN",
        "hosts": "all",
        "gather_facts": False,
        "roles": [{"role": "cudnn", "vars": {"cudnn_background": True}}],
    },
    {
        "name": "The cuDNN joined",
        "hosts": "all",
        "gather_facts": False,
        "tasks": [{"name": "Join", "ansible.builtin.include_role": {"name": "cudnn", "tasks_from": "join.yml"}}],
    },
]


def _run(tmp_path: Path, inventory: Path, venv_env: dict[str, str], *limit: str) -> str:
    (tmp_path / "play.yml").write_text(yaml.safe_dump(PLAYS, sort_keys=False))
    env = dict(venv_env, ANSIBLE_NOCOLOR="1", ANSIBLE_ROLES_PATH=str(Path(__file__).resolve().parents[1] / "roles"))
    out = run_tool("ansible-playbook", "-i", str(inventory), *limit, str(tmp_path / "play.yml"), env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-5000:]
    # Each run's output beside the test's files, for the one that failed.
    runs = len(list(tmp_path.glob("run-*.log")))
    (tmp_path / f"run-{runs + 1}.log").write_text(out.stdout + out.stderr)
    # The messages as one line each, however the callback wrapped them.
    return " ".join((out.stdout + out.stderr).split())


def _without_cudnn(*hosts: dict[str, Path]) -> None:
    """The hosts' links back at the toolkit alone, and no unpacked copy: a host that lacks the cuDNN."""
    for h in hosts:
        h["link"].unlink()
        h["link"].symlink_to(h["base"])
        for path in h["downloads"].iterdir():
            if path.is_dir():
                shutil.rmtree(path)


def _tree(link: Path) -> dict[str, Any]:
    marker = link.resolve() / ".gpuenv-cudnn.json"
    return json.loads(marker.read_text())


@pytest.mark.ansible
@pytest.mark.skipif(os.geteuid() != 0, reason="the cuDNN module builds trees as root, as on a host")
def test_one_host_unpacks_the_tarball_and_the_others_copy_its_unpacked_files(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    archive = tmp_path / "cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz"
    sha = make_tarball(archive, VERSION, legacy=False, blob=300_000)
    hosts = {name: make_host(tmp_path / name) for name in HOSTS}
    for h in hosts.values():
        h["downloads"].rmdir()  # fresh hosts: no download directory yet
    inventory = _inventory(tmp_path, hosts, archive, sha)
    out = _run(tmp_path, inventory, venv_env)
    assert "h1 unpacks cuDNN 8.6.0.163, then hands it to the controller's cache for the hosts that wait for it" in out
    assert "h2 waits for h1 to unpack cuDNN 8.6.0.163, then copies it" in out
    # Only h1 had the tarball; every host has the same unpacked copy and a tree with that cuDNN.
    for name, h in hosts.items():
        assert _tree(h["link"])["sha256"] == sha, name
        assert json.loads((h["downloads"] / sha / ".gpuenv-unpacked.json").read_text())["sha256"] == sha, name
        assert sorted(p.name for p in h["downloads"].iterdir() if not p.name.startswith(".")) == [sha], name
    cache = tmp_path / "controller/cudnn-unpacked"
    records = [json.loads(p.read_text()) for p in cache.glob("*.json")]
    assert [r["built_by"] for r in records] == ["h1"]
    assert [r["cudnn_sha256"] for r in records] == [sha]
    assert "TASK [cudnn : Copy the cached unpacked cuDNN from the controller, check it and put it in place]" in out
    # Only h1 fetched the tarball: the others' copies came from the cache, with no fallback.
    assert "unpacks it itself" not in out
    fetched = [part.split("TASK [")[0] for part in out.split("TASK [cudnn : Copy the tarball to the host]")[1:]]
    assert {h for part in fetched for h in HOSTS if f"changed: [{h}]" in part} == {"h1"}

    # Hosts that lack it later restore the entry at once.
    _without_cudnn(hosts["h2"], hosts["h3"])
    out = _run(tmp_path, inventory, venv_env, "--limit", "h2,h3")
    assert "h2 copies cuDNN 8.6.0.163 unpacked by h1 from the controller's cache" in out
    assert _tree(hosts["h2"]["link"])["sha256"] == sha

    # An entry overwritten on the controller is refused: its first host unpacks the tarball and
    # replaces the entry, the other waits for that.
    (entry,) = cache.glob("*.tar.zst")
    entry.write_bytes(b"overwritten")
    _without_cudnn(hosts["h2"], hosts["h3"])
    out = _run(tmp_path, inventory, venv_env, "--limit", "h2,h3")
    assert "is refused" in out
    assert "this host builds it and replaces the entry" in out
    assert "h3 waits for h2 to unpack cuDNN 8.6.0.163, then copies it" in out
    assert [json.loads(p.read_text())["built_by"] for p in cache.glob("*.json")] == ["h2"]
    assert _tree(hosts["h3"]["link"])["sha256"] == sha
