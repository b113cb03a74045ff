"""The build caches' action (gpuenv.cacheaction): the entry's tar brought to the host by the unpack's
task itself, as the connection's user, or through ansible.builtin.copy's action where the task becomes
another user. The transfers are recorded by a stand-in connection; the plays of test_cudnn_share_play
and the sandbox's scenarios run it over real connections."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ansible.errors import AnsibleConnectionFailure

from gpuenv.cacheaction import CacheUnpackAction

# The copy's path on the host (the module's src): never touched here, the connection is a stand-in.
SRC = "/var/lib/gpuenv/build/key.tar.zst"


class Task(SimpleNamespace):
    def copy(self) -> Task:
        return Task(**vars(self))


class Connection:
    def __init__(self, become: object = None, fail: bool = False) -> None:
        self.become = become
        self.fail = fail
        self.put: list[tuple[str, str]] = []
        self._shell = SimpleNamespace(tmpdir=None)

    def put_file(self, local: str, remote: str) -> None:
        if self.fail:
            raise AnsibleConnectionFailure("lost the host")
        self.put.append((local, remote))


class CopyAction:
    def __init__(self, failed: bool) -> None:
        self.failed = failed
        self.task: Any = None

    def run(self, task_vars: dict[str, Any]) -> dict[str, Any]:
        return {"failed": True, "msg": "no room"} if self.failed else {"changed": True}


def action(
    tmp_path: Path,
    *,
    args: dict[str, Any],
    become_user: str | None = None,
    remote_user: str = "root",
    check_mode: bool = False,
    fail: bool = False,
    copy_fails: bool = False,
) -> tuple[CacheUnpackAction, dict[str, Any]]:
    """The action with a stand-in connection, and what it did: the module runs, the chmods, the copy
    action's task."""
    did: dict[str, Any] = {"modules": [], "chmod": [], "copy": None}
    task = Task(args=args, action="gpuenv_env_cache", check_mode=check_mode, async_val=0)
    connection = Connection(become=object() if become_user else None, fail=fail)
    copy = CopyAction(copy_fails)

    def get(name: str, task: Any, **_: Any) -> CopyAction:
        assert name == "ansible.legacy.copy"
        did["copy"] = task
        return copy

    plugin = CacheUnpackAction(
        task=task,
        connection=connection,
        play_context=SimpleNamespace(),
        loader=None,
        templar=None,
    )
    # Ansible's own plugin loader is the base class's whatever it is given.
    plugin._shared_loader_obj = SimpleNamespace(action_loader=SimpleNamespace(get=get))
    plugin.get_become_option = lambda option: become_user  # type: ignore[method-assign]
    plugin._get_remote_user = lambda: remote_user  # type: ignore[method-assign]

    def chmod(paths: list[str], mode: str) -> dict[str, Any]:
        did["chmod"].append((paths, mode))
        return {"rc": 0}

    def module(module_name: str, module_args: dict[str, Any], task_vars: Any) -> dict[str, Any]:
        did["modules"].append((module_name, module_args))
        return {"changed": True, "restored": True}

    plugin._remote_chmod = chmod  # type: ignore[method-assign]
    plugin._execute_module = module  # type: ignore[method-assign]
    did["connection"] = connection
    return plugin, did


def entry(tmp_path: Path) -> Path:
    tar = tmp_path / "key.tar.zst"
    tar.write_bytes(b"entry")
    return tar


def unpack_args(tar: Path, **more: Any) -> dict[str, Any]:
    return {"mode": "unpack", "root": "/opt/gpuenv/envs", "entry": {}, "src": SRC, "copy_from": str(tar), **more}


def test_the_connection_user_transfers_the_tar_to_src_and_the_module_gets_no_copy_from(tmp_path: Path) -> None:
    tar = entry(tmp_path)
    plugin, did = action(tmp_path, args=unpack_args(tar))
    result = plugin.run(task_vars={})
    assert result["restored"] is True
    assert did["connection"].put == [(str(tar), SRC)]
    assert did["chmod"] == [([SRC], "0600")]
    assert did["modules"] == [("gpuenv_env_cache", {k: v for k, v in unpack_args(tar).items() if k != "copy_from"})]
    assert did["copy"] is None


@pytest.mark.parametrize(("become_user", "remote_user"), [("root", "root"), ("admin", "admin")])
def test_becoming_the_connection_user_transfers_straight(tmp_path: Path, become_user: str, remote_user: str) -> None:
    plugin, did = action(tmp_path, args=unpack_args(entry(tmp_path)), become_user=become_user, remote_user=remote_user)
    plugin.run(task_vars={})
    assert len(did["connection"].put) == 1
    assert did["copy"] is None


def test_a_task_that_becomes_another_user_copies_through_the_copy_action(tmp_path: Path) -> None:
    tar = entry(tmp_path)
    plugin, did = action(tmp_path, args=unpack_args(tar), become_user="root", remote_user="admin")
    result = plugin.run(task_vars={})
    assert did["connection"].put == []
    assert did["copy"].args == {"src": str(tar), "dest": SRC, "mode": "0600"}
    assert [name for name, _ in did["modules"]] == ["gpuenv_env_cache"]
    assert result["restored"] is True


def test_a_failed_copy_action_fails_the_task_before_the_module(tmp_path: Path) -> None:
    plugin, did = action(
        tmp_path, args=unpack_args(entry(tmp_path)), become_user="root", remote_user="admin", copy_fails=True
    )
    result = plugin.run(task_vars={})
    assert result["failed"] is True
    assert "on the host failed: no room" in result["msg"]
    assert did["modules"] == []


def test_a_lost_transfer_fails_the_task_with_what_was_copied_where(tmp_path: Path) -> None:
    tar = entry(tmp_path)
    plugin, did = action(tmp_path, args=unpack_args(tar), fail=True)
    result = plugin.run(task_vars={})
    assert result["failed"] is True
    assert f"copying {tar} to {SRC} on the host failed: lost the host" in result["msg"]
    assert did["modules"] == []


def test_an_entry_gone_from_the_controller_says_to_run_again(tmp_path: Path) -> None:
    plugin, did = action(tmp_path, args=unpack_args(tmp_path / "gone.tar.zst"))
    result = plugin.run(task_vars={})
    assert result["failed"] is True
    assert "the controller's cache has no file" in result["msg"]
    assert "run the play again" in result["msg"]
    assert did["connection"].put == []
    assert did["modules"] == []


def test_check_mode_copies_nothing_and_the_module_says_so(tmp_path: Path) -> None:
    plugin, did = action(tmp_path, args=unpack_args(entry(tmp_path)), check_mode=True)
    plugin.run(task_vars={})
    assert did["connection"].put == []
    assert len(did["modules"]) == 1


@pytest.mark.parametrize("args", [{"mode": "plan", "cache_dir": "/c", "hosts": []}, {"mode": "unpack", "src": SRC}])
def test_other_modes_and_an_unpack_without_copy_from_are_the_module_alone(tmp_path: Path, args: dict[str, Any]) -> None:
    plugin, did = action(tmp_path, args=args)
    plugin.run(task_vars={})
    assert did["connection"].put == []
    assert did["modules"] == [("gpuenv_env_cache", args)]
