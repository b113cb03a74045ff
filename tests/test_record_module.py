"""The gpuenv_record module (plugins/modules): a role's record, written once, reported as a change
only when it differs, previewed with a diff in check mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import load_plugin, run_module

mod = load_plugin("plugins/modules/gpuenv_record.py")
RECORD = {"version": "9.1.0.70", "trees": {"/usr/local/cuda-12.4": {"layout": "split"}}, "source": "tarball"}


def call(capsys: pytest.CaptureFixture[str], *, check: bool = False, **params: Any) -> dict[str, Any]:
    params.setdefault("_ansible_diff", True)
    params["_ansible_check_mode"] = check
    return run_module(mod, capsys, params)


def test_the_record_is_written_as_ansible_reads_it_and_a_second_run_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = tmp_path / "facts.d"
    first = call(capsys, name="cudnn", record=RECORD, facts_dir=str(facts))
    path = facts / "cudnn.fact"
    assert first["changed"] is True
    assert first["path"] == str(path)
    assert json.loads(path.read_text()) == RECORD
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    # The text to_nice_json(sort_keys=true) gave the copy tasks this replaces: an existing record
    # written by them is no change.
    assert path.read_text() == json.dumps(RECORD, indent=4, sort_keys=True) + "\n"
    again = call(capsys, name="cudnn", record=RECORD, facts_dir=str(facts))
    assert again["changed"] is False
    assert [p.name for p in facts.iterdir()] == ["cudnn.fact"]


def test_check_mode_shows_the_change_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = tmp_path / "facts.d"
    call(capsys, name="cudnn", record=RECORD, facts_dir=str(facts))
    newer = {**RECORD, "version": "9.2.1.18"}
    out = call(capsys, check=True, name="cudnn", record=newer, facts_dir=str(facts))
    assert out["changed"] is True
    assert '"9.1.0.70"' in out["diff"]["before"]
    assert '"9.2.1.18"' in out["diff"]["after"]
    assert json.loads((facts / "cudnn.fact").read_text()) == RECORD


def test_a_mode_someone_changed_is_put_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    call(capsys, name="cudnn", record=RECORD, facts_dir=str(tmp_path))
    (tmp_path / "cudnn.fact").chmod(0o600)
    out = call(capsys, name="cudnn", record=RECORD, facts_dir=str(tmp_path))
    assert out["changed"] is True
    assert oct((tmp_path / "cudnn.fact").stat().st_mode & 0o777) == "0o644"


@pytest.mark.parametrize("name", ["../x", "a b", "", "cudnn.fact"])
def test_a_name_that_is_not_a_plain_word_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    out = call(capsys, name=name, record=RECORD, facts_dir=str(tmp_path))
    assert out["failed"] is True
    assert "plain word" in out["msg"]
    assert list(tmp_path.iterdir()) == []
