"""The progress callback (plugins/callback/gpuenv_progress.py): its lines from made-up events and
times, and two real ansible-playbook runs on the controller with it as the stdout callback, one
into a pipe as CI has it and one on a terminal."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import pytest
import yaml

from gpuenv.stages import STAGES, stage_of, stage_times
from gpuenv.tests.conftest import REPO, load_plugin

pytest.importorskip("ansible")


@pytest.fixture(scope="module")
def progress() -> ModuleType:
    return load_plugin("plugins/callback/gpuenv_progress.py")


# --- stages -------------------------------------------------------------------------------------


def test_every_play_of_site_yml_has_a_stage() -> None:
    # A play renamed in playbooks/ without gpuenv/stages.py would show (and be benchmarked) as no stage.
    site = yaml.safe_load((REPO / "playbooks/site.yml").read_text())
    names = []
    for entry in site:
        for play in yaml.safe_load((REPO / "playbooks" / entry["ansible.builtin.import_playbook"]).read_text()):
            names.append(play["name"])
    assert len(names) >= 7
    assert {n: stage_of(n) for n in names if stage_of(n) is None} == {}
    assert [stage for stage, _ in STAGES] == ["preflight", "driver", "cuda", "env", "verify"]
    assert stage_of("Install the GPU services") == "driver"
    assert stage_of("Roll the stack out, a batch at a time") is None


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_name(self) -> str:
        return self.name


def test_the_timing_record_names_each_plays_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    timing = load_plugin("plugins/callback/gpuenv_timing.py").CallbackModule()
    timing.v2_playbook_on_play_start(_Named("Install the NVIDIA driver"))
    timing.v2_playbook_on_play_start(_Named("A play of another playbook"))

    class Stats:
        processed: ClassVar[dict[str, int]] = {}

    monkeypatch.setenv("GPUENV_TIMING_FILE", str(tmp_path / "t.json"))
    timing.v2_playbook_on_stats(Stats())
    plays = yaml.safe_load((tmp_path / "t.json").read_text())["plays"]
    assert [(p["name"], p["stage"]) for p in plays] == [
        ("Install the NVIDIA driver", "driver"),
        ("A play of another playbook", None),
    ]


def test_the_benchmarks_sum_play_times_by_the_same_stages() -> None:
    # A record as the timing callback writes it (bench/ charts these sums); an older one has no "stage".
    record = {
        "plays": [
            {"name": "Preflight of the declared GPU stack", "wall_s": 1.0},
            {"name": "Record the checked stack on each host", "wall_s": 2.5},
            {"name": "Install the GPU services", "stage": "driver", "wall_s": 3.0},
            {"name": "Not a play of site.yml", "stage": None, "wall_s": 100.0},
        ]
    }
    assert stage_times(record) == {"preflight": 3.5, "driver": 3.0, "cuda": 0.0, "env": 0.0, "verify": 0.0}


# --- the state and its lines --------------------------------------------------------------------


def test_durations(progress: ModuleType) -> None:
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


def _driver_play(progress: ModuleType) -> Any:
    return progress.Play(3, 8, "Install the NVIDIA driver", "driver")


def test_a_host_line_has_its_stage_elapsed_time_changes_and_task(progress: ModuleType) -> None:
    run = progress.Progress(start=1000.0)
    run.play_started(_driver_play(progress))
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


def test_a_playbook_without_stages_shows_the_play_name(progress: ModuleType) -> None:
    run = progress.Progress(start=0.0)
    run.play_started(progress.Play(1, 2, "Roll the stack out, a batch at a time", None))
    assert (
        run.task_started("sb1", "Drain", 1.0)
        == "[    1s] sb1: 1/2 Roll the stack out, a batch at a time (0 changed so far)"
    )
    assert run.lines(2.0, 200, 50) == ["sb1  1/2 Roll the stack out, a batch       2s    0 changed  Drain"]


def test_the_plain_line_comes_once_per_host_and_play(progress: ModuleType) -> None:
    run = progress.Progress(start=0.0)
    run.play_started(progress.Play(1, 8, "Preflight of the declared GPU stack", "preflight"))
    first = run.task_started("sb1", "Gather the OS facts", 0.5)
    assert first == "[    0s] sb1: 1/8 preflight: Preflight of the declared GPU stack (0 changed so far)"
    run.task_done("sb1", 1.0, changed=True)
    assert run.task_started("sb1", "Check the stack", 1.0) is None
    run.task_done("sb1", 2.0)
    run.play_started(_driver_play(progress))
    assert run.task_started("sb1", "Install the driver packages", 125.0) == (
        "[ 2m05s] sb1: 3/8 driver: Install the NVIDIA driver (1 changed so far)"
    )


def test_a_failed_host_keeps_its_time_and_a_rescued_one_runs_on(progress: ModuleType) -> None:
    run = progress.Progress(start=0.0)
    run.play_started(_driver_play(progress))
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


def test_more_hosts_than_rows_shows_the_running_ones_and_counts_the_rest(progress: ModuleType) -> None:
    run = progress.Progress(start=0.0)
    run.play_started(_driver_play(progress))
    for i in range(10):
        run.task_started(f"node{i}", "Install the driver packages", 1.0)
    run.task_done("node0", 2.0, state="failed")
    run.task_done("node1", 2.0, state="failed")
    lines = run.lines(3.0, 80, 5)
    assert len(lines) == 4
    assert [line.split()[0] for line in lines[:3]] == ["node2", "node3", "node4"]
    assert lines[3] == "... and 7 more hosts: 5 running, 2 failed"


def test_lines_never_wrap(progress: ModuleType) -> None:
    run = progress.Progress(start=0.0)
    run.play_started(_driver_play(progress))
    run.task_started("sb1", "A task with a name much longer than the narrow terminal it is shown on", 1.0)
    lines = run.lines(2.0, 40, 10)
    assert lines == ["sb1  3/8 driver      2s    0 changed  A"]
    assert all(len(line) < 40 for line in lines)


def test_without_a_terminal_a_long_task_says_so_once_a_minute(progress: ModuleType) -> None:
    run = progress.Progress(start=0.0)
    run.play_started(progress.Play(6, 8, "Build the PyTorch environment", "env"))
    run.task_started("sb1", "Install torch", 10.0)
    run.task_started("sb2", "Install torch", 11.0)
    assert run.still_running(69.0) == []
    assert run.still_running(71.0) == ["[ 1m11s] still running after 1m01s: Install torch on sb1, sb2"]
    assert run.still_running(100.0) == []
    run.task_done("sb2", 120.0)
    assert run.still_running(131.0) == ["[ 2m11s] still running after 2m01s: Install torch on sb1"]


def test_the_recap_has_each_hosts_counts_and_time(progress: ModuleType) -> None:
    run = progress.Progress(start=0.0)
    run.play_started(_driver_play(progress))
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


def test_a_failed_command_shows_its_message_and_the_end_of_its_output(progress: ModuleType) -> None:
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


def test_a_long_message_is_shown_in_full(progress: ModuleType) -> None:
    report = "\n".join(f"rule {i}: what is wrong and how to fix it" for i in range(60))
    text = progress.failure_text("sb1", "Stop when the stack cannot work", "1/8 preflight: Preflight", {"msg": report})
    assert text.splitlines()[1:] == ["  msg:"] + [f"    rule {i}: what is wrong and how to fix it" for i in range(60)]
    # a short task failure says nothing of its time
    assert "after" not in text.splitlines()[0]


def test_each_failed_item_of_a_loop_and_an_unreachable_host(progress: ModuleType) -> None:
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


def test_a_failure_without_a_message_shows_its_result(progress: ModuleType) -> None:
    text = progress.failure_text(
        "sb1", "Odd module", "2/8 preflight", {"failed": True, "reason": "x", "_ansible_no_log": False}
    )
    assert text.splitlines()[1:] == ["  {", '    "reason": "x"', "  }"]


def test_every_event_the_default_callback_prints_reaches_the_log(progress: ModuleType) -> None:
    # Ansible calls only the events a callback class defines: one this callback lacks would be
    # missing from the log.
    from ansible.plugins.loader import callback_loader, init_plugin_loader  # noqa: PLC0415

    # What ansible-playbook does first: without it no plugin is found by its full name.
    init_plugin_loader()
    default = callback_loader.get("ansible.builtin.default")
    ours = progress.CallbackModule()
    # The task queue manager's look at which events each callback defines.
    for callback in (default, ours):
        callback._init_callback_methods()
    assert "v2_playbook_on_include" in default._implemented_callback_methods
    assert default._implemented_callback_methods - ours._implemented_callback_methods == set()


# --- the screen ---------------------------------------------------------------------------------


def _screen(progress: ModuleType, *, tty: bool) -> tuple[Any, io.StringIO, io.StringIO]:
    out, log = io.StringIO(), io.StringIO()
    return progress.Screen(out, log, tty=tty, lock=threading.RLock()), out, log


def test_a_terminal_redraws_the_live_lines_in_place(progress: ModuleType) -> None:
    screen, out, log = _screen(progress, tty=True)
    screen.draw(["sb1 a", "sb2 a"])
    screen.draw(["sb1 b", "sb2 b"])
    assert out.getvalue() == "sb1 a\nsb2 a\n\r\x1b[2A\x1b[Jsb1 b\nsb2 b\n"
    # Someone else's text (a warning, another callback) replaces the live lines and goes to the log;
    # the next draw starts below it.
    screen.write(out, "\x1b[1;35m[WARNING]: a warning\x1b[0m\n")
    screen.draw(["sb1 c"])
    assert out.getvalue().endswith("\r\x1b[2A\x1b[J\x1b[1;35m[WARNING]: a warning\x1b[0m\nsb1 c\n")
    assert log.getvalue() == "[WARNING]: a warning\n"


def test_the_default_callbacks_text_goes_to_the_log_only(progress: ModuleType) -> None:
    screen, out, log = _screen(progress, tty=False)
    screen.to_log = True
    screen.write(out, "TASK [Install] ****\n")
    screen.write(out, "[WARNING]: deprecated thing\n")
    screen.to_log = False
    assert out.getvalue() == ""
    assert log.getvalue() == "TASK [Install] ****\n[WARNING]: deprecated thing\n"
    assert screen.warnings == 1


def test_no_escape_codes_without_a_terminal_and_no_redraw_inside_a_line(progress: ModuleType) -> None:
    screen, out, _ = _screen(progress, tty=False)
    screen.draw(["sb1 a"])
    screen.show("sb1: 1/8 preflight")
    assert out.getvalue() == "sb1: 1/8 preflight\n"
    screen, out, _ = _screen(progress, tty=True)
    screen.write(out, "Password: ")
    screen.draw(["sb1 a"])
    assert out.getvalue() == "Password: "


# --- real runs ----------------------------------------------------------------------------------

# Two plays named as site.yml's are, so the lines carry their stages; a change in the first, a
# failure on h2 in the second (h1 goes on), and the fact gpuenv_rollout (enabled in ansible.cfg)
# reports on, to see its summary still printed beside this callback.
PLAYBOOK = """
- name: Preflight of the declared GPU stack
  hosts: all
  gather_facts: false
  tasks:
    - name: Change something
      ansible.builtin.command: "true"
      changed_when: true
    - name: Take a moment
      ansible.builtin.command: sleep 1.5
      changed_when: false
    - name: Say where the host stands
      ansible.builtin.set_fact:
        fleet_upgrade_outcome: {state: upgraded}
- name: Install the NVIDIA driver
  hosts: all
  gather_facts: false
  tasks:
    - name: Break the build
      ansible.builtin.command: sh -c 'seq 1 40; echo the-build-broke >&2; exit 3'
      when: inventory_hostname == 'h2'
    - name: Go on
      ansible.builtin.command: "true"
      changed_when: false
"""


def _run_env(tmp: Path, venv_env: dict[str, str], log: Path) -> dict[str, str]:
    env = dict(venv_env)
    env.update(
        ANSIBLE_STDOUT_CALLBACK="gpuenv_progress",
        GPUENV_PROGRESS_LOG=str(log),
        ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"),
        # This checkout's gpuenv.stages, whichever checkout the venv's gpuenv was installed from.
        PYTHONPATH=str(REPO),
    )
    env.pop("ANSIBLE_NOCOLOR", None)
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, venv_env: dict[str, str]) -> dict[str, Any]:
    """The playbook run twice at once (a few seconds each): into a file, and on a pseudo-terminal."""
    tmp = tmp_path_factory.mktemp("progress")
    (tmp / "site.yml").write_text(PLAYBOOK)
    host = f"ansible_connection=local ansible_python_interpreter={sys.executable}"
    (tmp / "hosts").write_text(f"h1 {host}\nh2 {host}\n")
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp / "hosts"), str(tmp / "site.yml")]

    plain_out = (tmp / "plain.out").open("w")
    plain = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=_run_env(tmp, venv_env, tmp / "plain.log"),
        stdin=subprocess.DEVNULL,
        stdout=plain_out,
        stderr=subprocess.STDOUT,
    )

    master, slave = pty.openpty()
    env = _run_env(tmp, venv_env, tmp / "tty.log") | {"TERM": "xterm", "COLUMNS": "120", "LINES": "40"}
    on_tty = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if not ready:
            continue
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    tty_rc = on_tty.wait(timeout=30)
    plain_rc = plain.wait(timeout=120)
    plain_out.close()
    return {
        "plain": (plain_rc, (tmp / "plain.out").read_text(), tmp / "plain.log"),
        "tty": (tty_rc, b"".join(chunks).decode().replace("\r\n", "\n"), tmp / "tty.log"),
    }


@pytest.mark.ansible
def test_without_a_terminal_one_plain_line_per_host_and_stage(runs: dict[str, Any]) -> None:
    rc, out, log = runs["plain"]
    assert rc == 2, out
    assert "\x1b" not in out
    lines = out.splitlines()
    assert lines[0] == f"gpuenv_progress: the full output goes to {log}"
    stage_lines = [re.sub(r"^\[ *\d+s\] ", "", line) for line in lines if re.match(r"^\[ *\d+s\] ", line)]
    # The hosts of one play in the order they started; the plays in theirs.
    assert len(stage_lines) == 4, out
    assert sorted(stage_lines[:2]) == [
        "h1: 1/2 preflight: Preflight of the declared GPU stack (0 changed so far)",
        "h2: 1/2 preflight: Preflight of the declared GPU stack (0 changed so far)",
    ]
    assert sorted(stage_lines[2:]) == [
        "h1: 2/2 driver: Install the NVIDIA driver (1 changed so far)",
        "h2: 2/2 driver: Install the NVIDIA driver (1 changed so far)",
    ]
    # The failure in full: task, host, stage, message, the command's stderr and the end of its stdout.
    start = lines.index("FAILED: h2, task 'Break the build' (2/2 driver: Install the NVIDIA driver)")
    assert lines[start + 1 : start + 6] == [
        "  msg: non-zero return code",
        "  cmd: sh -c 'seq 1 40; echo the-build-broke >&2; exit 3'",
        "  rc: 3",
        "  stderr: the-build-broke",
        "  stdout (last 25 of 40 lines):",
    ]
    assert lines[start + 6 : start + 31] == [f"    {i}" for i in range(16, 41)]
    assert lines[start + 31] == f"  (the full output: {log})"
    # gpuenv_rollout, enabled in ansible.cfg, still prints its summary.
    assert "Rollout complete: every batch ran." in out
    recap = lines[lines.index("RECAP") + 1 :]
    assert re.match(r"^h1  ok +\d+s  ok=4 changed=1 failed=0 unreachable=0 skipped=1 ", recap[0]), recap
    assert re.match(r"^h2  FAILED +\d+s  ok=3 changed=1 failed=1 unreachable=0 skipped=0 ", recap[1]), recap
    assert recap[-1] == f"gpuenv_progress: the full output is in {log}"
    # None of the default callback's task output on the screen ...
    assert "TASK [" not in out
    assert "PLAY RECAP" not in out


@pytest.mark.ansible
def test_the_log_holds_what_the_default_callback_prints(runs: dict[str, Any]) -> None:
    _, _, log = runs["plain"]
    text = log.read_text()
    assert "\x1b" not in text
    for expected in (
        "PLAY [Preflight of the declared GPU stack] ***",
        "TASK [Change something] ***",
        "changed: [h1]",
        "changed: [h2]",
        "TASK [Break the build] ***",
        "skipping: [h1]",
        "fatal: [h2]: FAILED! =>",
        "stderr: the-build-broke",
        "ROLLOUT SUMMARY",
        "PLAY RECAP ***",
    ):
        assert expected in text, expected
    assert re.search(r"^h2 +: ok=3 +changed=1 +unreachable=0 +failed=1 ", text, re.MULTILINE), text
    assert "gpuenv_progress" not in text


@pytest.mark.ansible
def test_on_a_terminal_the_lines_are_redrawn_in_place(runs: dict[str, Any]) -> None:
    rc, out, log = runs["tty"]
    assert rc == 2, out
    assert f"gpuenv_progress: the full output goes to {log}" in out
    # Two hosts: each redraw goes up two lines and clears below; the 1.5 s task is drawn at least twice.
    redraws = out.count("\r\x1b[2A\x1b[J")
    assert redraws >= 2, out
    assert re.search(r"h1  1/2 preflight +\d+s +1 changed  Take a moment\n", out, re.MULTILINE), out
    assert "FAILED: h2, task 'Break the build' (2/2 driver: Install the NVIDIA driver)" in out
    assert "  stderr: the-build-broke" in out
    assert re.search(r"^h1  ok +\d+s  ok=4 changed=1 failed=0", out, re.MULTILINE), out
    assert out.rstrip().endswith(f"gpuenv_progress: the full output is in {log}")
    assert "TASK [" not in out
    assert "fatal: [h2]: FAILED!" in log.read_text()


# A second run, in check mode and into a pipe: a failure a rescue catches (also one in an included
# file, whose tasks Ansible copies), one a block with only `always` does not catch, a host that
# skips every task, and one that cannot be reached.
RESCUE_PLAYBOOK = """
- name: Verify each host
  hosts: all
  gather_facts: false
  tasks:
    - name: Write the marker
      ansible.builtin.copy:
        content: "x"
        dest: "{{ marker_dir }}/{{ inventory_hostname }}"
        mode: "0644"
      when: inventory_hostname != 'idle'
    - name: Try the mirror first
      when: inventory_hostname == 'h1'
      block:
        - name: Fetch from the mirror
          ansible.builtin.command: sh -c 'echo mirror-is-down >&2; exit 4'
          check_mode: false
          changed_when: false
        - name: Fetch through the include
          ansible.builtin.include_tasks: fetch.yml
      rescue:
        - name: Fetch from upstream
          ansible.builtin.debug:
            msg: fallback
    - name: Fetch through the include, rescued
      when: inventory_hostname == 'h1'
      block:
        - name: Fetch through the include
          ansible.builtin.include_tasks: fetch.yml
      rescue:
        - name: Fetch from upstream again
          ansible.builtin.debug:
            msg: fallback
    - name: Break without a rescue
      when: inventory_hostname == 'h2'
      block:
        - name: Break the build
          ansible.builtin.command: sh -c 'echo not-rescued >&2; exit 5'
          check_mode: false
          changed_when: false
      always:
        - name: Clean up
          ansible.builtin.debug:
            msg: cleaned
"""
FETCH_TASKS = """
- name: Fetch in the included file
  ansible.builtin.command: sh -c 'echo included-mirror-is-down >&2; exit 6'
  check_mode: false
  changed_when: false
"""


@pytest.fixture(scope="module")
def check_run(tmp_path_factory: pytest.TempPathFactory, venv_env: dict[str, str]) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("progress-check")
    (tmp / "site.yml").write_text(RESCUE_PLAYBOOK)
    (tmp / "fetch.yml").write_text(FETCH_TASKS)
    (tmp / "markers").mkdir()
    local = f"ansible_connection=local ansible_python_interpreter={sys.executable}"
    # Port 1 on the loopback refuses at once: unreachable without a wait.
    (tmp / "hosts").write_text(
        f"h1 {local}\nh2 {local}\nidle {local}\n"
        "down ansible_connection=ssh ansible_host=127.0.0.1 ansible_port=1 ansible_ssh_retries=0\n"
    )
    log = tmp / "check.log"
    cmd = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "--check",
        "-i",
        str(tmp / "hosts"),
        "-e",
        f"marker_dir={tmp / 'markers'}",
        str(tmp / "site.yml"),
    ]
    run = subprocess.run(
        cmd,
        cwd=REPO,
        env=_run_env(tmp, venv_env, log),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
    )
    return {"rc": run.returncode, "out": run.stdout + run.stderr, "log": log, "markers": tmp / "markers"}


def _recap(out: str) -> dict[str, str]:
    lines = out.splitlines()
    return {line.split()[0]: line for line in lines[lines.index("RECAP") + 1 :] if not line.startswith("gpuenv_")}


@pytest.mark.ansible
def test_a_rescued_failure_is_not_shown_as_one(check_run: dict[str, Any]) -> None:
    out = check_run["out"]
    # h1's two failures (the mirror's; the included file's, in the second block) are both caught:
    # nothing on the screen, and the recap says ok with rescued=2.
    assert "FAILED: h1" not in out, out
    assert "mirror-is-down" not in out, out
    assert re.match(r"^h1 +ok +\d+s  ok=\d+ changed=1 failed=0 unreachable=0 skipped=\d+ rescued=2 ", _recap(out)["h1"])
    # ... and the log has them as the default callback prints them.
    log = check_run["log"].read_text()
    assert "mirror-is-down" in log
    assert "included-mirror-is-down" in log
    assert re.search(r"^included: .*fetch\.yml for h1$", log, re.MULTILINE), log
    # A block with only `always` catches nothing: h2's failure is shown in full.
    lines = out.splitlines()
    start = lines.index("FAILED: h2, task 'Break the build' (1/1 verify: Verify each host)")
    assert lines[start + 1 : start + 5] == [
        "  msg: non-zero return code",
        "  cmd: sh -c 'echo not-rescued >&2; exit 5'",
        "  rc: 5",
        "  stderr: not-rescued",
    ]
    assert re.match(r"^h2 +FAILED +\d+s  ok=\d+ changed=1 failed=1 ", _recap(out)["h2"])
    assert check_run["rc"] != 0


@pytest.mark.ansible
def test_check_mode_an_idle_host_and_an_unreachable_one(check_run: dict[str, Any]) -> None:
    out = check_run["out"]
    assert "\x1b" not in out
    assert "gpuenv_progress: check mode: nothing changes; 'changed' counts what would change" in out.splitlines()[:3]
    # Check mode wrote nothing, but the copy counts as a change that would be made.
    assert list(check_run["markers"].iterdir()) == []
    assert re.match(r"^idle  ok +\d+s  ok=0 changed=0 failed=0 unreachable=0 skipped=\d+ ", _recap(out)["idle"])
    lines = out.splitlines()
    start = lines.index("UNREACHABLE: down, task 'Write the marker' (1/1 verify: Verify each host)")
    assert lines[start + 1].startswith("  msg: "), lines[start + 1]
    assert "Failed to connect to the host via ssh" in lines[start + 1]
    assert "port 1: Connection refused" in lines[start + 1]
    assert re.match(r"^down  UNREACHABLE +\d+s  ok=0 changed=0 failed=0 unreachable=1 ", _recap(out)["down"])
    # ansible-playbook's status for a run with an unreachable host.
    assert check_run["rc"] == 4, out
