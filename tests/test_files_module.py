"""The gpuenv_files module (plugins/modules): a role's directories and small files in one module
run, changed only where they differ, previewed in check mode, never written through a link."""

from __future__ import annotations

import grp
import os
import pwd
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import load_plugin, run_module

mod = load_plugin("plugins/modules/gpuenv_files.py")
ME = {"owner": pwd.getpwuid(os.getuid()).pw_name, "group": grp.getgrgid(os.getgid()).gr_name}


def call(capsys: pytest.CaptureFixture[str], paths: list[dict[str, Any]], *, check: bool = False) -> dict[str, Any]:
    params: dict[str, Any] = {"paths": paths, "_ansible_diff": True, "_ansible_check_mode": check, **ME}
    return run_module(mod, capsys, params)


def _entries(root: Path) -> list[dict[str, Any]]:
    return [
        {"path": str(root / "verify"), "state": "directory"},
        {"path": str(root / "verify" / "results"), "state": "directory", "mode": "0750"},
        {"path": str(root / "verify" / "gpuenv-verify"), "content": "#!/bin/sh\nexec true\n", "mode": "0755"},
        {"path": str(root / "verify" / "stack.json"), "content": "{}\n"},
    ]


def test_the_entries_are_made_in_order_and_a_second_run_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = call(capsys, _entries(tmp_path))
    assert first["changed"] is True
    assert first["changed_paths"] == [e["path"] for e in _entries(tmp_path)]
    assert oct((tmp_path / "verify").stat().st_mode & 0o7777) == "0o755"
    assert oct((tmp_path / "verify/results").stat().st_mode & 0o7777) == "0o750"
    assert (tmp_path / "verify/gpuenv-verify").read_text() == "#!/bin/sh\nexec true\n"
    assert oct((tmp_path / "verify/gpuenv-verify").stat().st_mode & 0o7777) == "0o755"
    assert oct((tmp_path / "verify/stack.json").stat().st_mode & 0o7777) == "0o644"
    again = call(capsys, _entries(tmp_path))
    assert again["changed"] is False
    assert again["changed_paths"] == []
    # No temporary file is left beside them.
    assert sorted(p.name for p in (tmp_path / "verify").iterdir()) == ["gpuenv-verify", "results", "stack.json"]


def test_only_what_differs_changes_and_check_mode_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    call(capsys, _entries(tmp_path))
    (tmp_path / "verify/stack.json").write_text('{"old": 1}\n')
    (tmp_path / "verify/results").chmod(0o777)
    preview = call(capsys, _entries(tmp_path), check=True)
    assert preview["changed_paths"] == [str(tmp_path / "verify/results"), str(tmp_path / "verify/stack.json")]
    stack_diff = next(d for d in preview["diff"] if d.get("after_header", "").endswith("stack.json"))
    # A directory's diff is its mode, as Ansible's file module shows it.
    assert {
        "before": {"path": str(tmp_path / "verify/results"), "mode": "0777"},
        "after": {"path": str(tmp_path / "verify/results"), "state": "directory", "mode": "0750"},
    } in preview["diff"]
    assert (stack_diff["before"], stack_diff["after"]) == ('{"old": 1}\n', "{}\n")
    assert (tmp_path / "verify/stack.json").read_text() == '{"old": 1}\n'
    assert oct((tmp_path / "verify/results").stat().st_mode & 0o7777) == "0o777"
    done = call(capsys, _entries(tmp_path))
    assert done["changed_paths"] == preview["changed_paths"]
    assert (tmp_path / "verify/stack.json").read_text() == "{}\n"
    assert oct((tmp_path / "verify/results").stat().st_mode & 0o7777) == "0o750"


def test_a_link_where_a_file_goes_is_replaced_not_written_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (tmp_path / "verify").mkdir()
    (tmp_path / "verify/stack.json").symlink_to(victim)
    call(capsys, _entries(tmp_path))
    assert victim.read_text() == "keep\n"
    assert not (tmp_path / "verify/stack.json").is_symlink()
    assert (tmp_path / "verify/stack.json").read_text() == "{}\n"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"path": "relative/x", "content": ""}, "is not an absolute path"),
        ({"path": "/nonexistent/x", "content": "", "mode": "rw-r--r--"}, "is not an octal mode"),
        ({"path": "/nonexistent/x"}, "a file needs its content"),
    ],
)
def test_a_malformed_entry_is_refused_by_name(
    entry: dict[str, Any], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = call(capsys, [entry])
    assert out["failed"] is True
    assert message in out["msg"]


def test_a_file_where_a_directory_goes_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "verify").write_text("not a directory\n")
    out = call(capsys, _entries(tmp_path))
    assert out["failed"] is True
    assert "exists and is not a directory" in out["msg"]
    assert (tmp_path / "verify").read_text() == "not a directory\n"
