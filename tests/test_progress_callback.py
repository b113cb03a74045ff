"""The progress callback (plugins/callback/gpuenv_progress.py): its lines from made-up events and
times, and two real ansible-playbook runs on the controller with it as the stdout callback, one
into a pipe as CI has it and one on a terminal."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import REPO, load_plugin

pytest.importorskip("ansible")


@pytest.fixture(scope="module")
def progress() -> ModuleType:
    return load_plugin("plugins/callback/gpuenv_progress.py")


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


# --- real runs ----------------------------------------------------------------------------------

# Two plays in files named as site.yml's are (gpuenv.stages knows a play's stage by its file), so
# the lines carry their stages; a change in the first, a failure on h2 in the second (h1 goes on),
# and the fact gpuenv_rollout (enabled in ansible.cfg) reports on, to see its summary still printed
# beside this callback.
SITE = """
- ansible.builtin.import_playbook: preflight.yml
- ansible.builtin.import_playbook: driver_start.yml
"""
PREFLIGHT = """
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
"""
DRIVER = """
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
    (tmp / "site.yml").write_text(SITE)
    (tmp / "preflight.yml").write_text(PREFLIGHT)
    (tmp / "driver_start.yml").write_text(DRIVER)
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
    (tmp / "verify.yml").write_text(RESCUE_PLAYBOOK)
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
        str(tmp / "verify.yml"),
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
