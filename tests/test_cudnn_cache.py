"""The fleet's cache of unpacked cuDNNs (plugins/modules/gpuenv_cudnn_cache.py on
plugins/module_utils/gpuenv_buildcache.py): one host per tarball unpacks it and the others wait or
restore; a host puts a copy in place only when its sha256 is the recorded one and every file is the
one the unpack recorded, leaving nothing behind otherwise; and the trees built from a restored copy
are those built from the tarball. The role's flow (the copy handed over after the background
placement's join, the waiting hosts placing from it) runs on sandbox hosts in the fleet lane and the
bench's fleet phase."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import load_plugin, run_module
from tests.cudnn_tarballs import make_host, make_tarball

mod = load_plugin("plugins/modules/gpuenv_cudnn_cache.py")
tree_mod = load_plugin("plugins/modules/gpuenv_cuda_tree.py")
files = tree_mod.__dict__["unpacked_info"].__globals__  # gpuenv_cudnn_files, as the modules see it
VERSION = "8.6.0.163"


def unpacked(tmp_path: Path, unpack_dir: Path) -> str:
    """A tarball unpacked as gpuenv_cuda_tree unpacks it; returns its sha256."""
    archive = tmp_path / "cudnn.tar.xz"
    sha = make_tarball(archive, VERSION, legacy=False, blob=200_000)
    files["unpack"](str(archive), sha, VERSION, str(unpack_dir))
    return sha


def snapshot(path: Path) -> dict[str, tuple[Any, ...]]:
    """Each file's content digest (or link target) and mode, relative to path."""
    out: dict[str, tuple[Any, ...]] = {}
    for item in sorted([path, *path.rglob("*")]):
        rel = str(item.relative_to(path))
        if item.is_symlink():
            out[rel] = ("link", os.readlink(item))
        elif item.is_file():
            out[rel] = ("file", hashlib.sha256(item.read_bytes()).hexdigest(), stat.S_IMODE(item.lstat().st_mode))
        else:
            out[rel] = ("dir", stat.S_IMODE(item.lstat().st_mode))
    return out


def pack(unpack_dir: Path, sha: str, staging: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    out = run_module(
        mod,
        capsys,
        {
            "mode": "pack",
            "host": "sb1",
            "unpack_dir": str(unpack_dir),
            "sha256": sha,
            "version": VERSION,
            "key": mod.key_of(sha),
            "staging_dir": str(staging),
        },
    )
    return {**json.loads(Path(out["record"]).read_text()), "file": out["tar"], "record": out["record"]}


def unpack(unpack_dir: Path, entry: dict[str, Any], src: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    return run_module(mod, capsys, {"mode": "unpack", "unpack_dir": str(unpack_dir), "entry": entry, "src": str(src)})


class Module:
    """What pack asks of AnsibleModule, with its warnings kept (a module's warnings do not reach
    run_module's result reliably)."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    @staticmethod
    def get_bin_path(name: str, required: bool = False) -> str | None:
        return shutil.which(name)


def pack_direct(unpack_dir: Path, sha: str, staging: Path) -> tuple[dict[str, Any], list[str]]:
    module = Module()
    out = mod.pack(
        module,  # type: ignore[arg-type]  # the two methods pack calls
        unpack_dir=str(unpack_dir),
        sha256=sha,
        version=VERSION,
        key=mod.key_of(sha),
        staging=str(staging),
        host="sb1",
    )
    return out, module.warnings


def asked(host: str, sha: str) -> dict[str, str]:
    return {"host": host, "sha256": sha, "version": VERSION}


def test_the_key_is_the_tarball_and_the_unpack_s_format() -> None:
    assert mod.key_of("a" * 64) == mod.key_of("a" * 64)
    assert mod.key_of("a" * 64) != mod.key_of("b" * 64)
    with pytest.raises(files["TreeError"], match="is not a sha256"):
        mod.key_of("../etc")


def test_one_host_unpacks_the_others_wait_and_then_restore(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    builder, host, cache = tmp_path / "builder", tmp_path / "host", tmp_path / "cache"
    sha = unpacked(tmp_path, builder)
    cache.mkdir()
    planned = mod.plan_unpacks(str(cache), [asked(h, sha) for h in ("sb1", "sb2", "sb3")], True, 2)
    first = planned["hosts"]
    assert [first[h]["action"] for h in ("sb1", "sb2", "sb3")] == ["build", "wait", "wait"]
    assert first["sb1"]["awaited"] is True
    assert first["sb2"]["wait_for"] == "sb1"
    assert first["sb2"]["awaited"] is False
    # sb1's unpacked copy reaches the cache (the role's fetch); the waiting hosts read again.
    entry = pack(builder, sha, tmp_path / "staging", capsys)
    shutil.copy(entry["file"], cache)
    shutil.copy(entry["record"], cache)
    again = mod.plan_unpacks(str(cache), [asked("sb2", sha)], False, 2)["hosts"]["sb2"]
    assert again["action"] == "restore"
    assert again["entry"]["built_by"] == "sb1"
    assert again["entry"]["unpacked_size"] > 200_000
    copy = tmp_path / "copy.tar.zst"
    shutil.copy(again["entry"]["file"], copy)
    out = unpack(host, again["entry"], copy, capsys)
    assert out["restored"] is True
    assert out["changed"] is True
    assert not copy.exists()
    assert snapshot(host / sha) == snapshot(builder / sha)
    assert files["unpacked_info"](str(host), sha)["sha256"] == sha
    assert sorted(p.name for p in host.iterdir()) == [".lock", sha]
    # A second restore finds the copy there and changes nothing.
    shutil.copy(again["entry"]["file"], copy)
    assert unpack(host, again["entry"], copy, capsys)["changed"] is False


@pytest.mark.skipif(os.geteuid() != 0, reason="the cuDNN module builds trees as root, as on a host")
def test_a_tree_built_from_a_restored_copy_is_the_one_built_from_the_tarball(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    builder = make_host(tmp_path / "builder")
    archive = tmp_path / "cudnn.tar.xz"
    sha = make_tarball(archive, VERSION, legacy=False)
    args = {"cudnn_sha256": sha, "cudnn_version": VERSION, "remove_archive": False, "ldconfig": False}
    built = run_module(
        tree_mod,
        capsys,
        {"link": str(builder["link"]), "cudnn_archive": str(archive), "unpack_dir": str(builder["downloads"]), **args},
    )
    entry = pack(builder["downloads"], sha, tmp_path / "staging", capsys)
    host = make_host(tmp_path / "host")
    assert unpack(host["downloads"], entry, Path(entry["file"]), capsys)["restored"] is True
    # No tarball on this host: the tree is built from the restored copy.
    placed = run_module(
        tree_mod,
        capsys,
        {
            "link": str(host["link"]),
            "cudnn_archive": str(tmp_path / "absent.tar.xz"),
            "unpack_dir": str(host["downloads"]),
            **args,
        },
    )
    assert placed["changed"] is True
    assert placed["cudnn"]["sha256"] == sha
    assert snapshot(Path(placed["tree"]) / "include") == snapshot(Path(built["tree"]) / "include")
    assert snapshot(Path(placed["tree"]) / "lib") == snapshot(Path(built["tree"]) / "lib")


def test_a_damaged_copy_or_an_incomplete_one_is_refused_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    builder, host = tmp_path / "builder", tmp_path / "host"
    sha = unpacked(tmp_path, builder)
    entry = pack(builder, sha, tmp_path / "staging", capsys)
    damaged = tmp_path / "damaged.tar.zst"
    data = bytearray(Path(entry["file"]).read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    out = unpack(host, entry, damaged, capsys)
    assert out["restored"] is False
    assert f"not the {entry['sha256']} the cache recorded" in out["refused"]
    assert not damaged.exists()
    assert sorted(p.name for p in host.iterdir()) == [".lock"]
    # A tar whose sha256 is the recorded one, of a copy that lacks a file its unpack recorded.
    lib = next((builder / sha / "lib").glob("libcudnn_blob.so.*"))
    lib.unlink()
    incomplete = tmp_path / "incomplete.tar.zst"
    packed = mod.pack_tar("tar", str(builder), [sha], str(incomplete))
    out = unpack(host, {**entry, "sha256": packed["sha256"]}, incomplete, capsys)
    assert out["refused"] == f"it holds no complete unpacked copy of the tarball {sha}"
    assert sorted(p.name for p in host.iterdir()) == [".lock"]
    # The builder itself has no complete copy to hand over now: nothing is packed, and it says why.
    out, warnings = pack_direct(builder, sha, tmp_path / "staging2")
    assert out["tar"] == ""
    assert warnings == [f"sb1 has no complete unpacked copy of cuDNN {VERSION} in {builder}/{sha} to share"]


def test_an_entry_that_names_no_tarball_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "copy.tar.zst"
    src.write_bytes(b"x")
    out = unpack(tmp_path / "host", {"sha256": "0" * 64, "cudnn_sha256": "../../etc"}, src, capsys)
    assert "is not a sha256" in out["refused"]
    assert not src.exists()


def test_a_damaged_entry_is_refused_in_the_plan_and_its_host_unpacks_and_replaces_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    builder, cache = tmp_path / "builder", tmp_path / "cache"
    sha = unpacked(tmp_path, builder)
    entry = pack(builder, sha, tmp_path / "staging", capsys)
    cache.mkdir()
    (cache / f"{entry['key']}{mod.EXT}").write_bytes(b"overwritten")
    shutil.copy(entry["record"], cache)
    out = run_module(
        mod, capsys, {"mode": "plan", "cache_dir": str(cache), "hosts": [asked("sb2", sha), asked("sb3", sha)]}
    )
    assert out["hosts"]["sb2"]["action"] == "build"
    assert out["hosts"]["sb2"]["replaces"] is True
    assert out["hosts"]["sb3"]["wait_for"] == "sb2"
    assert "this host builds it and replaces the entry" in out["hosts"]["sb2"]["notes"][0]
    assert f"not the {entry['sha256']} the cache recorded" in out["hosts"]["sb2"]["notes"][0]


def test_a_host_reached_through_sudo_hands_nothing_over_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    builder = tmp_path / "builder"
    sha = unpacked(tmp_path, builder)
    monkeypatch.setenv("SUDO_USER", "admin")
    out, warnings = pack_direct(builder, sha, tmp_path / "staging")
    assert out["tar"] == ""
    assert "sb1 is reached as admin with privilege escalation" in warnings[0]
    assert "the other hosts unpack the tarball themselves" in warnings[0]
    assert not (tmp_path / "staging").exists()


def test_what_a_killed_restore_left_is_removed_by_the_next(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    builder, host = tmp_path / "builder", tmp_path / "host"
    sha = unpacked(tmp_path, builder)
    entry = pack(builder, sha, tmp_path / "staging", capsys)
    left = host / ".gpuenv-restore-killed"
    left.mkdir(parents=True)
    (left / "half.so").write_bytes(b"x")
    # And a copy in the tarball's own place that a killed unpack left incomplete.
    (host / sha / "lib").mkdir(parents=True)
    assert unpack(host, entry, Path(entry["file"]), capsys)["restored"] is True
    assert not left.exists()
    assert snapshot(host / sha) == snapshot(builder / sha)


def test_the_tar_keeps_links_as_links(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    builder = tmp_path / "builder"
    sha = unpacked(tmp_path, builder)
    entry = pack(builder, sha, tmp_path / "staging", capsys)
    listing = subprocess.run(
        ["tar", "--list", "--verbose", "--use-compress-program=zstd", "--file", entry["file"]],  # noqa: S607
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert any(line.startswith("l") and "libcudnn.so ->" in line for line in listing.splitlines())
