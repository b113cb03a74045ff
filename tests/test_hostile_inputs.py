"""Inputs a user controls, made hostile or just odd: each ends in one clear line and its exit code,
never a traceback, a hang or a flood. check-spec's values and problem list are capped, versions
are ASCII digits only, a huge hex integer is described rather than printed; suggest refuses a FIFO
as an inventory and a compute capability no GPU has; doctor refuses a timeout that is not a number
of seconds; the fleet report shows a host whose report is malformed as FAILED, with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuenv import fleetreport

STACK = '  cuda: "12.4"\n  cudnn: "9.1.0"\n  python: "3.11"\n  torch: "2.5.1"\n'


def _gpuenv(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuenv", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _check_spec(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "stack.yml"
    path.write_text("gpu_stack:\n" + body)
    return _gpuenv("check-spec", str(path))


def test_full_width_digits_are_not_a_driver(tmp_path: Path) -> None:
    run = _check_spec(tmp_path, '  driver: "\uff15\uff15\uff10"\n' + STACK)
    assert run.returncode == 2
    assert "is not a driver branch" in run.stdout


def test_a_huge_hex_integer_is_described_not_printed(tmp_path: Path) -> None:
    run = _check_spec(tmp_path, "  driver: 0x" + "f" * 5000 + "\n" + STACK)
    assert (run.returncode, run.stderr) == (2, "")
    assert "is read by YAML as the number of about" in run.stdout
    assert len(run.stdout) < 1000


def test_a_pasted_blob_is_refused_not_echoed(tmp_path: Path) -> None:
    run = _check_spec(tmp_path, '  driver: "550"\n  gpu: ["' + "A" * 900_000 + '"]\n' + STACK)
    assert run.returncode == 2
    assert "is longer than any stack value (200 characters)" in run.stdout
    assert len(run.stdout) < 1000


def test_thousands_of_unknown_keys_print_a_bounded_list(tmp_path: Path) -> None:
    run = _check_spec(tmp_path, '  driver: "550"\n' + STACK + "".join(f"  k{i}: 1\n" for i in range(40_000)))
    assert run.returncode == 2
    assert "... and 39975 more problems not shown; fix those above first." in run.stdout
    assert len(run.stdout) < 10_000


def test_suggest_refuses_a_fifo_as_an_inventory(tmp_path: Path) -> None:
    fifo = tmp_path / "inventory"
    os.mkfifo(fifo)
    run = _gpuenv("suggest", "--inventory", str(fifo), timeout=30)
    assert run.returncode == 2
    assert "not a regular file or a directory" in run.stderr


def test_suggest_refuses_a_compute_capability_no_gpu_has() -> None:
    run = _gpuenv("suggest", "--gpu", "99.9")
    assert run.returncode == 2
    assert "compute capability 99.9 belongs to no GPU generation gpuenv knows" in run.stderr
    assert _gpuenv("suggest", "--gpu", "8.6").returncode == 0


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_doctor_refuses_a_timeout_that_is_not_seconds(value: str) -> None:
    run = _gpuenv("doctor", f"--verify-timeout={value}")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"gpuenv doctor: --verify-timeout {float(value):g}: give the seconds verify may take per environment"
    ]


@pytest.mark.parametrize(
    ("checks", "reason"),
    [
        (
            [{"id": "torch.build", "status": "great"}],
            "check torch.build has status 'great', not pass, warn, fail or skip",
        ),
        ([{"id": ["torch", "build"], "status": "pass"}], "a check's id is \"['torch', 'build']\", not a name"),
        ({"torch.build": "pass"}, "its checks are not a list"),
        (["torch.build"], "a check's id is 'None', not a name"),
    ],
)
def test_a_malformed_host_report_shows_as_failed_with_the_reason(tmp_path: Path, checks: object, reason: str) -> None:
    good = {"schema_version": 2, "host": "sb1", "exit_code": 0, "checks": [{"id": "torch.build", "status": "pass"}]}
    (tmp_path / "sb1.json").write_text(json.dumps(good))
    (tmp_path / "sb2.json").write_text(json.dumps({**good, "host": "sb2", "checks": checks}))
    hosts = {h.name: h for h in fleetreport.load(tmp_path)}
    assert hosts["sb1"].mark() == ""
    assert hosts["sb2"].mark() == f"FAILED (its report cannot be read: {reason})"
    text = fleetreport.markdown(list(hosts.values()))
    assert f"sb2 `report` fail: its report cannot be read: {reason}" in text
    assert "1 of 2 hosts" in text
    fleetreport.html_page(list(hosts.values()))  # renders, no crash
    run = _gpuenv("report", str(tmp_path))  # a report, not a verdict: exit 0 with the host shown FAILED
    assert (run.returncode, run.stderr) == (0, "")
    assert "1 of 2 hosts passed every check" in run.stdout
