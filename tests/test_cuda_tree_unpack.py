"""The cuda_toolkit role's unpack of NVIDIA's redist archives (tasks/tree.yml), run as root on the
controller: an archive's owners, modes and setuid, setgid and sticky bits never reach the tree,
which ends readable by all and writable by root alone."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from tests.conftest import run_local_play

REPO = Path(__file__).resolve().parents[1]
TREE = {"name": "cuda_toolkit", "tasks_from": "tree.yml"}


def _archive(path: Path) -> None:
    """A redist archive with what a hostile or careless one could hold: setuid and setgid files, a
    setgid, sticky and world-writable directory, another owner."""
    with tarfile.open(path, "w:xz") as tar:
        for name, kind, mode in [
            ("cuda_cudart-linux-x86_64-12.4.127-archive", tarfile.DIRTYPE, 0o755),
            ("cuda_cudart-linux-x86_64-12.4.127-archive/bin", tarfile.DIRTYPE, 0o3777),
            ("cuda_cudart-linux-x86_64-12.4.127-archive/bin/setuid-tool", tarfile.REGTYPE, 0o4755),
            ("cuda_cudart-linux-x86_64-12.4.127-archive/bin/setgid-tool", tarfile.REGTYPE, 0o2775),
            ("cuda_cudart-linux-x86_64-12.4.127-archive/lib", tarfile.DIRTYPE, 0o777),
            ("cuda_cudart-linux-x86_64-12.4.127-archive/lib/libcudart.so.12", tarfile.REGTYPE, 0o666),
        ]:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.uid, info.gid = kind, mode, 4242, 4242
            data = b"#!/bin/sh\n" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)


@pytest.mark.ansible
@pytest.mark.skipif(os.geteuid() != 0, reason="root's tar keeps modes and owners: the case under test needs root")
def test_an_archive_s_setuid_bits_and_owners_never_reach_the_tree(tmp_path: Path, venv_env: dict[str, str]) -> None:
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    _archive(downloads / "cuda_cudart.tar.xz")
    archive = {"file": "cuda_cudart.tar.xz", "component": "cuda_cudart", "sha256": "a" * 64}
    plan = {"12.4": {"id": "0123456789ab", "archives": [archive]}}
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {
                "cuda_toolkit_root": str(tmp_path / "root"),
                "cuda_toolkit_version": "12.4",
                "cuda_toolkit_plan": plan,
                "cuda_toolkit_download_dir": str(downloads),
                "cuda_toolkit_redist_url": "http://mirror.example/compute/cuda/redist",
            },
            "tasks": [{"name": "Build the tree", "ansible.builtin.include_role": TREE}],
        }
    ]
    (tmp_path / "root").mkdir()
    out = run_local_play(tmp_path, play, venv_env)
    assert out.returncode == 0, out.stdout[-3000:]
    tree = tmp_path / "root/12.4-0123456789ab"
    entries = [tree, *tree.rglob("*")]
    assert (tree / "bin/setuid-tool").is_file()
    for entry in entries:
        st = entry.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue
        assert st.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX) == 0, f"{entry}: {oct(st.st_mode)}"
        assert st.st_mode & 0o022 == 0, f"{entry}: {oct(st.st_mode)}"
        assert (st.st_uid, st.st_gid) == (0, 0), entry
