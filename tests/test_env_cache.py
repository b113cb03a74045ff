"""The fleet's cache of built PyTorch environments (plugins/modules/gpuenv_env_cache.py on
plugins/module_utils/gpuenv_buildcache.py): the key changes with anything the environment depends
on, the plan gives one host per key the build and the others the wait or the restore, a damaged
entry is refused, and the host unpacks only a copy whose sha256 is the recorded one, leaving nothing
behind otherwise. The role's flow (a builder's tar fetched, the others unpacking it) runs in molecule's
pytorch_env scenario."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import load_plugin, run_module

mod = load_plugin("plugins/modules/gpuenv_env_cache.py")
ENV_NAME = "default-0123abcd"


def fields(**changes: str) -> dict[str, str]:
    base = {
        "env_id": "0123abcd",
        "env_dir": f"/opt/gpuenv/envs/.store/{ENV_NAME}",
        "installer": "venv-uv 0.13.9",
        "python_sha256": "a" * 64,
        "arch": "x86_64",
        "os": "debian 12",
        "lock_sha256": hashlib.sha256().hexdigest(),
    }
    return {**base, **changes}


def keyed(host: str, **changes: str) -> dict[str, Any]:
    f = fields(**changes)
    return {"host": host, "key": mod.digest_key(f, mod.KEY_FIELDS), "fields": f, "shareable": True}


def make_env(root: Path) -> tuple[Path, list[Path]]:
    """A built environment as the role leaves it: files of root's and the group's, a link, a hard
    link, an executable, the marker; and its locks."""
    env = root / ".store" / ENV_NAME
    (env / "bin").mkdir(parents=True)
    (env / "lib/site-packages/torch/lib").mkdir(parents=True)
    (env / "lib/site-packages/torch/lib/libtorch.so").write_bytes(os.urandom(300_000))
    os.link(env / "lib/site-packages/torch/lib/libtorch.so", env / "lib/site-packages/torch/lib/libtorch_alias.so")
    (env / "bin/python").symlink_to(sys.executable)
    (env / "bin/torchrun").write_text("#!/opt/gpuenv/envs/.store/default-0123abcd/bin/python\n")
    (env / "bin/torchrun").chmod(0o750)
    (env / ".gpuenv-env.json").write_text(json.dumps({"id": "0123abcd"}))
    group = grp.getgrnam("daemon").gr_gid
    for path in [env, *env.rglob("*")]:
        if not path.is_symlink():
            os.chown(path, 0, group)
    (env / "lib/site-packages/torch/lib/libtorch.so").chmod(0o640)
    locks = [root / ".locks" / f"{ENV_NAME}.txt", root / ".locks" / f"pylock.{ENV_NAME.replace('-', '-')}.toml"]
    locks[0].parent.mkdir(parents=True)
    locks[0].write_text("torch==2.5.1 --hash=sha256:" + "b" * 64 + "\n")
    return env, locks


def tree(path: Path) -> dict[str, tuple[Any, ...]]:
    """Each file's content digest (or link target), mode, owner and group, relative to path."""
    out: dict[str, tuple[Any, ...]] = {}
    for item in sorted([path, *path.rglob("*")]):
        st = item.lstat()
        rel = str(item.relative_to(path))
        if item.is_symlink():
            out[rel] = ("link", os.readlink(item))
        elif item.is_file():
            out[rel] = (
                "file",
                hashlib.sha256(item.read_bytes()).hexdigest(),
                stat.S_IMODE(st.st_mode),
                st.st_uid,
                st.st_gid,
            )
        else:
            out[rel] = ("dir", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
    return out


def pack(root: Path, env: Path, locks: list[Path], staging: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    k = keyed("sb1")
    out = run_module(
        mod,
        capsys,
        {
            "mode": "pack",
            "host": "sb1",
            "root": str(root),
            "env_dir": str(env),
            "locks": [str(p) for p in locks] + [str(root / ".locks/absent.conda-lock.yml")],
            "key": k["key"],
            "fields": k["fields"],
            "staging_dir": str(staging),
        },
    )
    record: dict[str, Any] = json.loads(Path(out["record"]).read_text())
    return {**record, "file": out["tar"], "record": out["record"]}


def unpack(root: Path, entry: dict[str, Any], src: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    params = {"mode": "unpack", "root": str(root), "env_dir": str(root / ".store" / ENV_NAME), "entry": entry}
    return run_module(mod, capsys, {**params, "src": str(src)})


@pytest.mark.parametrize("field", list(mod.KEY_FIELDS))
def test_any_difference_the_environment_depends_on_is_another_entry(field: str) -> None:
    assert mod.digest_key(fields(), mod.KEY_FIELDS) == mod.digest_key(fields(), mod.KEY_FIELDS)
    assert mod.digest_key(fields(), mod.KEY_FIELDS) != mod.digest_key(fields(**{field: "other"}), mod.KEY_FIELDS)


def test_facts_key_the_interpreter_os_release_and_the_hosts_own_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python3.11"
    python.write_bytes(b"\x7fELF interpreter")
    python.chmod(0o755)
    (tmp_path / "os-release").write_text('ID=debian\nVERSION_ID="12"\n')
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(mod, "OS_RELEASE", str(tmp_path / "os-release"))
    lock = tmp_path / "default-0123abcd.txt"
    args = {"env_dir": "/opt/e", "locks": [str(lock)], "env_id": "0123abcd", "installer": "venv-uv 0.13.9"}
    out = mod.facts(**args, python="python3.11", host="sb1")
    assert out["shareable"] is True
    assert out["fields"]["python_sha256"] == hashlib.sha256(b"\x7fELF interpreter").hexdigest()
    assert out["fields"]["os"] == "debian 12"
    # A host that keeps a lock of its own from an earlier build installs that lock: another key.
    lock.write_text("torch==2.5.1\n")
    assert mod.facts(**args, python="python3.11", host="sb1")["key"] != out["key"]
    # Another interpreter build is another key.
    lock.unlink()
    python.write_bytes(b"\x7fELF another interpreter")
    assert mod.facts(**args, python="python3.11", host="sb1")["key"] != out["key"]
    # A conda prefix brings its own Python: no interpreter of the host's in the key.
    assert mod.facts(**args, python="", host="sb1")["fields"]["python_sha256"] == ""
    missing = mod.facts(**args, python="python3.12", host="sb1")
    assert missing["shareable"] is False
    assert "python3.12 is not installed" in missing["why"]


def test_the_first_host_builds_identical_hosts_wait_and_another_key_builds_its_own(tmp_path: Path) -> None:
    hosts = [keyed("sb1"), keyed("sb2"), keyed("sb3", os="debian 13"), keyed("sb4")]
    out = mod.plan_env(str(tmp_path), hosts, True, 2)["hosts"]
    assert out["sb1"] == {
        "action": "build",
        "entry": None,
        "wait_for": None,
        "awaited": True,
        "notes": [],
        "replaces": False,
    }
    assert out["sb2"]["action"] == "wait"
    assert out["sb2"]["wait_for"] == "sb1"
    assert out["sb2"]["awaited"] is False
    assert out["sb3"]["action"] == "build"
    assert out["sb4"]["wait_for"] == "sb1"
    # The waiting host's own second read does not wait again: with no entry there, it builds.
    again = mod.plan_env(str(tmp_path), hosts[1:2], False, 2)["hosts"]["sb2"]
    assert again["action"] == "build"
    assert again["wait_for"] is None


def test_pack_then_unpack_gives_the_same_environment_and_its_locks_on_another_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    builder, host, cache = tmp_path / "builder", tmp_path / "host", tmp_path / "cache"
    env, locks = make_env(builder)
    entry = pack(builder, env, locks, tmp_path / "staging", capsys)
    assert entry["env"] == f".store/{ENV_NAME}"
    assert entry["locks"] == [f".locks/{ENV_NAME}.txt"]  # the pylock and conda lock do not exist here
    assert entry["sha256"] == hashlib.sha256(Path(entry["file"]).read_bytes()).hexdigest()
    assert entry["size"] == Path(entry["file"]).stat().st_size
    files = [
        p for p in [*env.rglob("*"), locks[0]] if p.is_file() and not p.is_symlink() and p.name != "libtorch_alias.so"
    ]
    assert entry["unpacked_size"] == sum(p.stat().st_size for p in files)  # the hard link once
    # The controller's cache, as the role fetches it (record last), read by the plan.
    cache.mkdir()
    shutil.copy(entry["file"], cache / f"{entry['key']}{mod.EXT}")
    shutil.copy(Path(entry["record"]), cache / f"{entry['key']}.json")
    planned = mod.plan_env(str(cache), [keyed("sb2")], True, 2)["hosts"]["sb2"]
    assert planned["action"] == "restore"
    assert planned["entry"]["built_by"] == "sb1"
    # The host's copy, unpacked.
    copy = tmp_path / "copy.tar.zst"
    shutil.copy(planned["entry"]["file"], copy)
    (host / ".store").mkdir(parents=True)
    out = unpack(host, planned["entry"], copy, capsys)
    assert out["restored"] is True
    assert out["changed"] is True
    assert tree(host / ".store" / ENV_NAME) == tree(env)
    assert (host / ".locks" / f"{ENV_NAME}.txt").read_text() == locks[0].read_text()
    restored_lib = host / ".store" / ENV_NAME / "lib/site-packages/torch/lib"
    assert (restored_lib / "libtorch.so").stat().st_ino == (restored_lib / "libtorch_alias.so").stat().st_ino
    assert not copy.exists()
    assert sorted(p.name for p in (host / ".store").iterdir()) == [ENV_NAME]  # no work directory left


def test_a_copy_that_changed_on_its_way_is_refused_and_nothing_is_put_in_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    builder, host = tmp_path / "builder", tmp_path / "host"
    env, locks = make_env(builder)
    entry = pack(builder, env, locks, tmp_path / "staging", capsys)
    copy = tmp_path / "copy.tar.zst"
    data = bytearray(Path(entry["file"]).read_bytes())
    data[2000] ^= 0xFF  # one byte of the compressed stream
    copy.write_bytes(bytes(data))
    (host / ".store").mkdir(parents=True)
    out = unpack(host, entry, copy, capsys)
    assert out["restored"] is False
    assert out["changed"] is False
    assert f"not the {entry['sha256']} the cache recorded" in out["refused"]
    assert list((host / ".store").iterdir()) == []
    assert not (host / ".locks").exists()
    assert not copy.exists()


def test_a_copy_whose_sha256_differs_is_not_extracted_at_all(tmp_path: Path) -> None:
    """The hash comes first: a damaged copy costs its read, never an extraction."""
    into = tmp_path / "into"
    into.mkdir()
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_bytes(b"payload")
    copy = tmp_path / "copy.tar.zst"
    packed = mod.pack_tar(shutil.which("tar"), str(src), ["d"], str(copy))
    assert packed["rc"] == 0
    refused = mod.extract_tar(shutil.which("tar"), str(copy), str(into), "0" * 64)
    assert refused == {"rc": None, "error": "", "sha256": packed["sha256"]}
    assert list(into.iterdir()) == []
    taken = mod.extract_tar(shutil.which("tar"), str(copy), str(into), packed["sha256"])
    assert taken["rc"] == 0
    assert (into / "d" / "f").read_bytes() == b"payload"


def test_a_copy_tar_cannot_read_is_refused_saying_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host = tmp_path / "host"
    (host / ".store").mkdir(parents=True)
    copy = tmp_path / "copy.tar.zst"
    copy.write_bytes(b"not a tar at all" * 100)
    entry = {"env": f".store/{ENV_NAME}", "sha256": hashlib.sha256(copy.read_bytes()).hexdigest(), "locks": []}
    out = unpack(host, entry, copy, capsys)
    assert out["restored"] is False
    assert "tar could not extract" in out["refused"]
    assert list((host / ".store").iterdir()) == []


def test_an_entry_for_another_directory_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "copy.tar.zst"
    copy.write_bytes(b"x")
    out = unpack(tmp_path, {"env": ".store/other-1", "sha256": "0", "locks": []}, copy, capsys)
    assert out["restored"] is False
    assert f"holds .store/other-1, not {tmp_path}/.store/{ENV_NAME}" in out["refused"]


def test_what_an_unfinished_build_or_a_killed_restore_left_is_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    builder, host = tmp_path / "builder", tmp_path / "host"
    env, locks = make_env(builder)
    entry = pack(builder, env, locks, tmp_path / "staging", capsys)
    left = host / ".store" / ENV_NAME / "lib"
    left.mkdir(parents=True)
    (left / "half-written.so").write_bytes(b"\0" * 10)
    killed = host / ".store" / ".gpuenv-restore-killed"  # a restore a killed run left
    (killed / ".store").mkdir(parents=True)
    out = unpack(host, entry, Path(entry["file"]), capsys)
    assert out["restored"] is True
    assert not (left / "half-written.so").exists()
    assert not killed.exists()
    assert tree(host / ".store" / ENV_NAME) == tree(env)


def test_a_damaged_entry_is_refused_in_the_plan_and_its_host_builds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    builder, cache = tmp_path / "builder", tmp_path / "cache"
    env, locks = make_env(builder)
    entry = pack(builder, env, locks, tmp_path / "staging", capsys)
    cache.mkdir()
    (cache / f"{entry['key']}{mod.EXT}").write_bytes(b"overwritten")
    shutil.copy(Path(entry["record"]), cache / f"{entry['key']}.json")
    out = run_module(mod, capsys, {"mode": "plan", "cache_dir": str(cache), "hosts": [keyed("sb2"), keyed("sb3")]})
    # The first host to read it replaces it; the next waits for that build.
    assert out["hosts"]["sb3"]["wait_for"] == "sb2"
    assert out["hosts"]["sb3"]["replaces"] is False
    assert out["hosts"]["sb2"]["action"] == "build"
    assert out["hosts"]["sb2"]["replaces"] is True
    assert f"not the {entry['sha256']} the cache recorded" in out["hosts"]["sb2"]["notes"][0]
    assert "this host builds it and replaces the entry" in out["hosts"]["sb2"]["notes"][0]


def test_the_plan_keeps_the_newest_entries_and_every_one_it_uses(tmp_path: Path) -> None:
    used = keyed("sb1")
    for age, key in enumerate(["old1", "old2", "old3", "new", used["key"]]):
        for ext in (".json", mod.EXT):
            (tmp_path / f"{key}{ext}").write_text("{}")
            os.utime(tmp_path / f"{key}{ext}", (1000 + age, 1000 + age))
    os.utime(tmp_path / f"{used['key']}.json", (1, 1))  # the oldest, but this plan uses it
    out = mod.plan_env(str(tmp_path), [used], True, 2)
    assert out["pruned"] == ["old1", "old2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{k}{e}" for k in ["old3", "new", used["key"]] for e in (".json", mod.EXT)
    )


def test_without_zstd_a_build_is_not_shared_and_a_copy_not_unpacked_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    builder, host = tmp_path / "builder", tmp_path / "host"
    env, locks = make_env(builder)
    entry = pack(builder, env, locks, tmp_path / "staging", capsys)
    only_tar = tmp_path / "bin"
    only_tar.mkdir()
    (only_tar / "tar").symlink_to(shutil.which("tar") or "/usr/bin/tar")
    monkeypatch.setenv("PATH", str(only_tar))
    k = keyed("sb1")

    class Module:  # what pack asks of AnsibleModule
        @staticmethod
        def get_bin_path(name: str, required: bool = False) -> str | None:
            return shutil.which(name)

    args = {"root": str(builder), "env_dir": str(env), "locks": [], "key": k["key"], "fields": k["fields"]}
    out = mod.pack(Module(), **args, staging=str(tmp_path / "staging2"), host="sb1")
    assert out["tar"] == ""
    assert out["changed"] is False
    assert out["warnings"] == [f"zstd is not installed on sb1: its build of {env} is not shared (apt install zstd)"]
    (host / ".store").mkdir(parents=True)
    restored = unpack(host, entry, Path(entry["file"]), capsys)
    assert restored["restored"] is False
    assert "zstd is not installed on this host" in restored["refused"]
    assert list((host / ".store").iterdir()) == []


def test_a_host_reached_through_sudo_builds_for_itself_and_the_next_host_builds_for_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SUDO_USER", "admin")
    args = {"env_dir": "/opt/e", "locks": [], "env_id": "0123abcd", "installer": "venv-uv 0.13.9", "python": ""}
    out = mod.facts(**args, host="sb1")
    assert out["exports"] is False
    assert "as admin with privilege escalation" in out["why_not_exports"]
    assert "connect as root" in out["why_not_exports"]
    monkeypatch.delenv("SUDO_USER")
    assert mod.facts(**args, host="sb1")["exports"] is True
    # Ansible's fetch through sudo would read the tar whole into memory: sb1 builds for itself, sb2
    # builds for the hosts after it, and nobody waits for a build that is never handed over.
    hosts = [{**keyed("sb1"), "exports": False}, keyed("sb2"), keyed("sb3")]
    planned = mod.plan_env(str(tmp_path), hosts, True, 2)["hosts"]
    assert [planned[h]["action"] for h in ("sb1", "sb2", "sb3")] == ["build", "build", "wait"]
    assert planned["sb3"]["wait_for"] == "sb2"
