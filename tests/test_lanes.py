"""scripts/test's disk reservations and the digest a failed run ends with (testbed.lanes)."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path

from testbed import lanes

GB = 1024


def _used(table: dict[str, int]) -> Callable[[Path], int]:  # a stand-in for du
    return lambda path: table.get(path.name, 0)


def test_a_scenario_starts_at_once_where_the_disk_holds_it_beside_the_others(tmp_path: Path) -> None:
    (tmp_path / "sandbox1").mkdir()
    held = lanes.Reservation("fleet", 20 * GB, (tmp_path / "sandbox", tmp_path / "basetemp"))
    d = lanes.decide(14 * GB, 60 * GB, [held], _used({"sandbox": 4 * GB, "basetemp": 1 * GB}))
    # 60 free, fleet still to write 15, margin 3: 42 to spare
    assert d.grant
    assert d.room_mb == 42 * GB
    assert d.pending_mb == 15 * GB


def test_a_scenario_waits_while_the_others_unwritten_growth_leaves_no_room(tmp_path: Path) -> None:
    others = [
        lanes.Reservation("fleet", 20 * GB, (tmp_path / "sandbox", tmp_path / "basetemp")),
        lanes.Reservation("pytorch_env", 15 * GB, (tmp_path / "sandbox2",)),
    ]
    d = lanes.decide(14 * GB, 30 * GB, others, _used({"sandbox": 2 * GB, "sandbox2": 1 * GB}))
    assert not d.grant
    assert d.holders == ("fleet", "pytorch_env")
    assert d.pending_mb == 32 * GB
    # Once they have written most of it, the same free space is enough.
    d = lanes.decide(14 * GB, 30 * GB, others, _used({"sandbox": 19 * GB, "sandbox2": 14 * GB}))
    assert d.grant


def test_a_scenario_alone_runs_even_where_its_peak_does_not_fit() -> None:
    # Waiting would wait for nothing; the run goes on and its failure, if any, says why.
    assert lanes.decide(40 * GB, 10 * GB, [], _used({})).grant


def test_reserve_waits_for_a_release_and_says_why(tmp_path: Path) -> None:
    state = tmp_path / "disk"
    watch = tmp_path / "sandbox2"
    watch.mkdir()
    lanes.reserve(state, "doctor", 14 * GB, (tmp_path / "sandbox1",), say=lambda m: None, free=lambda p: 20 * GB)
    said: list[str] = []
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        lanes.release(state, "doctor")  # the other lane's scenario ends while this one waits

    d = lanes.reserve(
        state, "pytorch_env", 12 * GB, (watch,), say=said.append, sleep=sleep, free=lambda p: 20 * GB, used=_used({})
    )
    assert d.grant
    assert len(sleeps) == 1
    assert said[0].startswith("disk: pytorch_env waits for room: it needs about 12 GB")
    assert "doctor" in said[0]
    assert said[-1].startswith("disk: pytorch_env starts after waiting")
    assert sorted(p.name for p in (state / "held").iterdir()) == ["pytorch_env"]


def test_reserve_gives_up_waiting_after_its_timeout_and_warns(tmp_path: Path) -> None:
    state = tmp_path / "disk"
    lanes.reserve(state, "fleet", 30 * GB, (tmp_path / "sandbox",), say=lambda m: None, free=lambda p: 10 * GB)
    said: list[str] = []
    d = lanes.reserve(
        state,
        "verify",
        20 * GB,
        (tmp_path / "sandbox2",),
        timeout_s=25,
        say=said.append,
        sleep=lambda s: None,
        free=lambda p: 10 * GB,
        used=_used({}),
    )
    assert not d.grant
    assert "it may run out of space" in said[-1]
    assert "fleet still to write 30 GB" in said[-1]


def test_reservations_from_two_threads_do_not_both_take_the_last_room(tmp_path: Path) -> None:
    state = tmp_path / "disk"
    lanes.reserve(state, "fleet", 10 * GB, (tmp_path / "sandbox",), say=lambda m: None)
    granted: list[str] = []

    def take(name: str) -> None:
        d = lanes.reserve(
            state,
            name,
            10 * GB,
            (tmp_path / name,),
            timeout_s=0,
            say=lambda m: None,
            free=lambda p: 25 * GB,
            used=_used({}),
        )
        if d.grant:
            granted.append(name)

    threads = [threading.Thread(target=take, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 25 free - 3 margin - fleet's 10 = 12: one more fits, not two.
    assert len(granted) == 1


LOG = """\
=== molecule-controller
--- molecule scenario preflight
CRITICAL 'molecule/default/molecule.yml' glob failed.  Exiting.
--- molecule scenario preflight ok (25 s)
--- molecule-controller ok (25 s)
=== molecule-unit-lane
--- molecule scenario pytorch_env
CRITICAL 'molecule/default/molecule.yml' glob failed.  Exiting.
TASK [pytorch_env : Refuse a bad checksum] ******
fatal: [sb1]: FAILED! => {"msg": "pytorch_env_micromamba_checksum must be ..."}

TASK [Record the refusal] ******
ok: [sb1]

TASK [Ignore a probe] ******
fatal: [sb1]: FAILED! => {"msg": "probe said no"}
...ignoring

TASK [pytorch_env : Install the environment] ******
fatal: [sb2]: FAILED! => {"changed": false,
    "msg": "pip could not install: OSError: [Errno 28] No space left on device"}

PLAY RECAP *****
sb2 : ok=3 changed=1 unreachable=0 failed=1
[  560 s] INFO     [pytorch_env > converge] Executed: Failed
CRITICAL Ansible return code was 2, command was: ansible-playbook converge.yml
--- molecule scenario pytorch_env FAILED (576 s)
--- molecule scenario verify
--- molecule scenario verify ok (754 s)
--- molecule-unit-lane FAILED (1330 s)
=== pytest-unit
...
FAILED tests/test_x.py::test_y - assert 1 == 2
========= short test summary info =========
FAILED tests/test_x.py::test_y - assert 1 == 2
========= 1 failed, 300 passed =========
--- pytest-unit FAILED (353 s)
lane failed: molecule-unit-lane pytest-unit
"""


def test_the_digest_names_the_failure_that_ended_a_scenario_not_the_refusals_it_expected() -> None:
    out = lanes.digest(LOG)
    start = out.index("--- why molecule scenario pytorch_env failed:")
    why = out[start + 1 : out.index("--- why pytest-unit failed:")]
    assert why[0] == "TASK [pytorch_env : Install the environment] ******"
    assert "No space left on device" in "\n".join(why)
    assert "micromamba" not in "\n".join(why)
    assert "probe said no" not in "\n".join(why)
    assert why[-1].startswith("CRITICAL Ansible return code was 2")
    assert not any("glob failed" in line for line in out)


def test_the_digest_gives_pytest_summary_and_skips_steps_whose_scenarios_said_why() -> None:
    out = lanes.digest(LOG)
    assert "--- why molecule-unit-lane failed:" not in out  # its scenario's lines said it
    assert "--- why molecule scenario verify failed:" not in out
    i = out.index("--- why pytest-unit failed:")
    assert out[i + 1].endswith("short test summary info =========")
    assert "FAILED tests/test_x.py::test_y - assert 1 == 2" in out[i + 2]


def test_the_digest_counts_a_block_cut_off_by_a_killed_run() -> None:
    out = lanes.digest("=== molecule-lane\n--- molecule scenario doctor\nTASK [x] ***\nfatal: [sb1]: FAILED! => boom\n")
    assert out[:3] == ["--- why molecule scenario doctor failed:", "TASK [x] ***", "fatal: [sb1]: FAILED! => boom"]


def test_the_disk_line_names_the_least_free_space_and_when() -> None:
    line = lanes.disk_summary("0 51200\n20 40960\n40 9216\n60 30720\n")
    assert line == "disk: 50.0 GB free when the lanes started, 9.0 GB at the least (40 s in)"
    assert lanes.disk_summary("") is None


def test_every_sandbox_scenario_has_a_disk_figure_in_scripts_test() -> None:
    # A scenario without one reserves nothing and can fill the disk under the other lanes.
    root = Path(__file__).resolve().parents[1]
    script = (root / "scripts" / "test").read_text()
    block = re.search(r"declare -A disk_gb=\((.*?)\)", script, re.S)
    assert block, "scripts/test has no disk_gb table"
    figures = dict(re.findall(r"\[(\w+)\]=(\d+)", block.group(1)))
    sandbox = {
        p.parent.name
        for p in (root / "molecule").glob("*/molecule.yml")
        if re.search(r"^ *create: \.\./shared/create\.yml", p.read_text(), re.M)
    }
    assert sandbox, "no sandbox scenarios found"
    assert sandbox | {"fleet"} == set(figures), (
        f"disk_gb names {sorted(figures)}; the sandbox scenarios are {sorted(sandbox)}"
    )
