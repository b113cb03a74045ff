"""The sandbox's state file under concurrent fault commands (the fleet tests inject faults on four
hosts side by side): each change is made under a lock, so none is lost."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from testbed.sandbox.hosts import Host, State


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUENV_SANDBOX_DIR", str(tmp_path))
    hosts = {f"sb{i}": Host(f"sb{i}", "debian12", i, f"10.199.0.{10 + i}", "debian12") for i in (1, 2)}
    State(hosts=hosts, inventory=str(tmp_path / "hosts.yml")).save()
    return tmp_path


def test_two_edits_at_once_keep_both_changes(state_dir: Path) -> None:
    inside = threading.Event()

    def first() -> None:
        with State.edit() as state:
            state.hosts["sb1"].faults.append("cut")
            inside.set()
            # The second edit starts meanwhile; without the lock it would read the state without
            # this change and save over it.
            time.sleep(0.3)

    def second() -> None:
        inside.wait(5)
        with State.edit() as state:
            state.hosts["sb2"].faults.append("block:8000")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    hosts = State.load().hosts
    assert hosts["sb1"].faults == ["cut"]
    assert hosts["sb2"].faults == ["block:8000"]


def _fail_while_editing() -> None:
    with State.edit() as state:
        state.hosts["sb1"].faults.append("stopped")
        raise RuntimeError("iptables failed")


def test_an_edit_that_raises_saves_nothing(state_dir: Path) -> None:
    with pytest.raises(RuntimeError):
        _fail_while_editing()
    assert State.load().hosts["sb1"].faults == []
    assert State.load().inventory == str(state_dir / "hosts.yml")
