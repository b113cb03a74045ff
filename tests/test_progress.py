"""The progress callback's model without Ansible (gpuenv/progress.py): host lines, the recap, a
failure's text and the screen, from made-up events. The plugin itself, and real runs through it,
are in test_progress_callback.py."""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuenv import progress

# --- the state and its lines --------------------------------------------------------------------


def test_durations() -> None:
    assert [progress.duration(s) for s in (0, 9.9, 59, 60, 125, 3599, 3600, 3725)] == [
        "0s",
        "9s",
        "59s",
        "1m00s",
        "2m05s",
        "59m59s",
        "1h00m",
        "1h02m",
    ]


def _driver_play() -> Any:
    return progress.Play(3, 8, "Install the NVIDIA driver", "driver")


def test_a_host_line_has_its_stage_elapsed_time_changes_and_task() -> None:
    run = progress.Progress(start=1000.0)
    run.play_started(_driver_play())
    run.task_started("sb1", "Install the driver packages", 1010.0)
    run.task_done("sb1", 1030.0, changed=True)
    run.task_started("sb1", "Build the kernel module with DKMS", 1030.0)
    run.task_started("gpu-node-12", "Build the kernel module with DKMS", 1031.0)
    # A quick task shows no running time; past a few seconds it does, and it moves.
    assert run.lines(1032.0, 200, 50) == [
        "sb1          3/8 driver     32s    1 changed  Build the kernel module with DKMS",
        "gpu-node-12  3/8 driver     32s    0 changed  Build the kernel module with DKMS",
    ]
    assert run.lines(1030.0 + 62, 200, 50)[0] == (
        "sb1          3/8 driver   1m32s    1 changed  Build the kernel module with DKMS (1m02s)"
    )


def test_a_playbook_without_stages_shows_the_play_name() -> None:
    run = progress.Progress(start=0.0)
    run.play_started(progress.Play(1, 2, "Roll the stack out, a batch at a time", None))
    assert (
        run.task_started("sb1", "Drain", 1.0)
        == "[    1s] sb1: 1/2 Roll the stack out, a batch at a time (0 changed so far)"
    )
    assert run.lines(2.0, 200, 50) == ["sb1  1/2 Roll the stack out, a batch       2s    0 changed  Drain"]


def test_the_plain_line_comes_once_per_host_and_play() -> None:
    run = progress.Progress(start=0.0)
    run.play_started(progress.Play(1, 8, "Preflight of the declared GPU stack", "preflight"))
    first = run.task_started("sb1", "Gather the OS facts", 0.5)
    assert first == "[    0s] sb1: 1/8 preflight: Preflight of the declared GPU stack (0 changed so far)"
    run.task_done("sb1", 1.0, changed=True)
    assert run.task_started("sb1", "Check the stack", 1.0) is None
    run.task_done("sb1", 2.0)
    run.play_started(_driver_play())
    assert run.task_started("sb1", "Install the driver packages", 125.0) == (
        "[ 2m05s] sb1: 3/8 driver: Install the NVIDIA driver (1 changed so far)"
    )


def test_a_failed_host_keeps_its_time_and_a_rescued_one_runs_on() -> None:
    run = progress.Progress(start=0.0)
    run.play_started(_driver_play())
    run.task_started("sb1", "Build the kernel module with DKMS", 10.0)
    run.task_started("sb2", "Build the kernel module with DKMS", 10.0)
    assert run.running_for("sb1", 70.0) == 60.0
    run.task_done("sb1", 70.0, state="failed")
    run.task_done("sb2", 71.0, state="unreachable")
    assert run.running_for("sb1", 80.0) is None
    assert run.lines(300.0, 200, 50) == [
        "sb1  3/8 driver   1m10s    0 changed  FAILED: Build the kernel module with DKMS",
        "sb2  3/8 driver   1m11s    0 changed  UNREACHABLE: Build the kernel module with DKMS",
    ]
    # block/rescue: the host runs the rescue tasks, so it did not stop.
    run.task_started("sb1", "Remove the half-built module", 301.0)
    assert run.lines(302.0, 200, 50)[0] == "sb1  3/8 driver   5m02s    0 changed  Remove the half-built module"


def test_more_hosts_than_rows_shows_the_running_ones_and_counts_the_rest() -> None:
    run = progress.Progress(start=0.0)
    run.play_started(_driver_play())
    for i in range(10):
        run.task_started(f"node{i}", "Install the driver packages", 1.0)
    run.task_done("node0", 2.0, state="failed")
    run.task_done("node1", 2.0, state="failed")
    lines = run.lines(3.0, 80, 5)
    assert len(lines) == 4
    assert [line.split()[0] for line in lines[:3]] == ["node2", "node3", "node4"]
    assert lines[3] == "... and 7 more hosts: 5 running, 2 failed"


def test_lines_never_wrap() -> None:
    run = progress.Progress(start=0.0)
    run.play_started(_driver_play())
    run.task_started("sb1", "A task with a name much longer than the narrow terminal it is shown on", 1.0)
    lines = run.lines(2.0, 40, 10)
    assert lines == ["sb1  3/8 driver      2s    0 changed  A"]
    assert all(len(line) < 40 for line in lines)


def test_without_a_terminal_a_long_task_says_so_once_a_minute() -> None:
    run = progress.Progress(start=0.0)
    run.play_started(progress.Play(6, 8, "Build the PyTorch environment", "env"))
    run.task_started("sb1", "Install torch", 10.0)
    run.task_started("sb2", "Install torch", 11.0)
    assert run.still_running(69.0) == []
    assert run.still_running(71.0) == ["[ 1m11s] still running after 1m01s: Install torch on sb1, sb2"]
    assert run.still_running(100.0) == []
    run.task_done("sb2", 120.0)
    assert run.still_running(131.0) == ["[ 2m11s] still running after 2m01s: Install torch on sb1"]


def test_the_recap_has_each_hosts_counts_and_time() -> None:
    run = progress.Progress(start=0.0)
    run.play_started(_driver_play())
    run.task_started("sb1", "Install the driver packages", 1.0)
    run.task_done("sb1", 481.0, changed=True)
    run.task_started("sb2", "Install the driver packages", 1.0)
    run.task_done("sb2", 65.0, state="failed")
    zero = {"ok": 0, "changed": 0, "failures": 0, "unreachable": 0, "skipped": 0, "rescued": 0, "ignored": 0}
    recap = run.finish(
        {
            "sb1": {**zero, "ok": 40, "changed": 12},
            "sb2": {**zero, "ok": 7, "failures": 1},
            "sb3": {**zero, "unreachable": 1},
        }
    )
    assert recap == [
        "sb1  ok            8m01s  ok=40 changed=12 failed=0 unreachable=0 skipped=0 rescued=0 ignored=0",
        "sb2  FAILED        1m05s  ok=7 changed=0 failed=1 unreachable=0 skipped=0 rescued=0 ignored=0",
        "sb3  UNREACHABLE      0s  ok=0 changed=0 failed=0 unreachable=1 skipped=0 rescued=0 ignored=0",
    ]
    # The live line, drawn once more before the recap, says done and keeps the host's time.
    assert run.lines(500.0, 200, 50)[0] == "sb1  3/8 driver   8m01s    1 changed  done"


# --- what a failure says ------------------------------------------------------------------------


def test_a_failed_command_shows_its_message_and_the_end_of_its_output() -> None:
    result = {
        "changed": True,
        "msg": "non-zero return code",
        "cmd": ["dkms", "install", "nvidia/550.127.05", "-k", "6.1.0-27-amd64"],
        "rc": 10,
        "stderr": "Error! Bad return status for module build on kernel: 6.1.0-27-amd64 (x86_64)\n",
        "stdout": "\n".join(f"make line {i}" for i in range(1, 101)),
        "stdout_lines": ["<omitted>"],
    }
    text = progress.failure_text(
        "sb1", "Build the kernel module with DKMS", "3/8 driver: Install the NVIDIA driver", result, ran_for=190
    )
    lines = text.splitlines()
    assert lines[:6] == [
        "FAILED: sb1, task 'Build the kernel module with DKMS' (3/8 driver: Install the NVIDIA driver, after 3m10s)",
        "  msg: non-zero return code",
        "  cmd: dkms install nvidia/550.127.05 -k 6.1.0-27-amd64",
        "  rc: 10",
        "  stderr: Error! Bad return status for module build on kernel: 6.1.0-27-amd64 (x86_64)",
        f"  stdout (last {progress.TAIL_LINES} of 100 lines):",
    ]
    assert lines[6:] == [f"    make line {i}" for i in range(101 - progress.TAIL_LINES, 101)]


def test_a_long_message_is_shown_in_full() -> None:
    report = "\n".join(f"rule {i}: what is wrong and how to fix it" for i in range(60))
    text = progress.failure_text("sb1", "Stop when the stack cannot work", "1/8 preflight: Preflight", {"msg": report})
    assert text.splitlines()[1:] == ["  msg:"] + [f"    rule {i}: what is wrong and how to fix it" for i in range(60)]
    # a short task failure says nothing of its time
    assert "after" not in text.splitlines()[0]


def test_each_failed_item_of_a_loop_and_an_unreachable_host() -> None:
    result = {
        "msg": "One or more items failed",
        "results": [
            {"item": "cuda-toolkit", "changed": False, "failed": False},
            {"item": "libcudnn9", "failed": True, "msg": "No package matching 'libcudnn9' is available"},
        ],
    }
    text = progress.failure_text("sb2", "Install the packages", "5/8 cuda: Install", result)
    assert text.splitlines()[1:] == [
        "  msg: One or more items failed",
        '  item "libcudnn9":',
        "    msg: No package matching 'libcudnn9' is available",
    ]
    down = progress.failure_text(
        "sb3",
        "Gather the OS facts",
        "1/8 preflight",
        {"msg": "ssh: connect to host sb3 port 22: No route to host"},
        unreachable=True,
    )
    assert down.splitlines() == [
        "UNREACHABLE: sb3, task 'Gather the OS facts' (1/8 preflight)",
        "  msg: ssh: connect to host sb3 port 22: No route to host",
    ]


def test_a_failure_without_a_message_shows_its_result() -> None:
    text = progress.failure_text(
        "sb1", "Odd module", "2/8 preflight", {"failed": True, "reason": "x", "_ansible_no_log": False}
    )
    assert text.splitlines()[1:] == ["  {", '    "reason": "x"', "  }"]


# --- the screen ---------------------------------------------------------------------------------


def _screen(*, tty: bool) -> tuple[Any, io.StringIO, io.StringIO]:
    out, log = io.StringIO(), io.StringIO()
    return progress.Screen(out, log, tty=tty, lock=threading.RLock()), out, log


def test_a_terminal_redraws_the_live_lines_in_place() -> None:
    screen, out, log = _screen(tty=True)
    screen.draw(["sb1 a", "sb2 a"])
    screen.draw(["sb1 b", "sb2 b"])
    assert out.getvalue() == "sb1 a\nsb2 a\n\r\x1b[2A\x1b[Jsb1 b\nsb2 b\n"
    # Someone else's text (a warning, another callback) replaces the live lines and goes to the log;
    # the next draw starts below it.
    screen.write(out, "\x1b[1;35m[WARNING]: a warning\x1b[0m\n")
    screen.draw(["sb1 c"])
    assert out.getvalue().endswith("\r\x1b[2A\x1b[J\x1b[1;35m[WARNING]: a warning\x1b[0m\nsb1 c\n")
    assert log.getvalue() == "[WARNING]: a warning\n"


def test_the_default_callbacks_text_goes_to_the_log_only() -> None:
    screen, out, log = _screen(tty=False)
    screen.to_log = True
    screen.write(out, "TASK [Install] ****\n")
    screen.write(out, "[WARNING]: deprecated thing\n")
    screen.to_log = False
    assert out.getvalue() == ""
    assert log.getvalue() == "TASK [Install] ****\n[WARNING]: deprecated thing\n"
    assert screen.warnings == 1


def test_no_escape_codes_without_a_terminal_and_no_redraw_inside_a_line() -> None:
    screen, out, _ = _screen(tty=False)
    screen.draw(["sb1 a"])
    screen.show("sb1: 1/8 preflight")
    assert out.getvalue() == "sb1: 1/8 preflight\n"
    screen, out, _ = _screen(tty=True)
    screen.write(out, "Password: ")
    screen.draw(["sb1 a"])
    assert out.getvalue() == "Password: "


def test_the_default_log_is_a_new_private_file_and_a_named_one_is_never_opened_through_a_link(tmp_path: Path) -> None:
    """The temporary directory is shared: the default name carries a random part and is created O_EXCL, mode 0600; a
    link planted at the name a user gave is refused (the callback then falls back to the default)."""
    first, log = progress.open_default_log(0)
    log.close()
    second, log = progress.open_default_log(0)
    log.close()
    assert first != second
    assert first.name.startswith(f"gpuenv-progress-{time.strftime('%Y%m%d-%H%M%S', time.localtime(0))}-{os.getpid()}-")
    assert first.stat().st_mode & 0o777 == 0o600
    first.unlink()
    second.unlink()
    decoy = tmp_path / "decoy"
    decoy.write_text("precious\n")
    (tmp_path / "run.log").symlink_to(decoy)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        progress.open_log(tmp_path / "run.log")
    assert decoy.read_text() == "precious\n"
    with progress.open_log(tmp_path / "new.log") as named:
        named.write("x")
    assert (tmp_path / "new.log").stat().st_mode & 0o777 == 0o600
