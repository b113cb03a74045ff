"""gpuenv verify's limits and its files: a hung torch import or check ends the run with a failing
report naming what overran (exit 2), a torch that exits on import still gets a report, the report
files are written atomically and never through a link, and the stack it reads is bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuenv.verify import cli, deadline, plan
from gpuenv.verify.base import Context, Spec
from gpuenv.verify.model import PASS, RUN_CHECK, Check

REPO = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_watchdog_names_the_check_that_overran_and_which_limit() -> None:
    clock = Clock()
    dog = deadline.Watchdog(total=60, per_check=10, clock=clock)
    clock.now += 9
    assert dog.overrun() is None
    clock.now += 2
    found = dog.overrun()
    assert found is not None
    assert (found.id, found.status) == (RUN_CHECK, "fail")
    assert (
        found.summary
        == "verify was stopped: importing torch ran past the limit of 10 s for one check (--check-deadline)"
    )
    # Each check gets its own time; the run's deadline counts from the start.
    dog.begin("cudnn.version")
    dog.finish(Check("torch.build", PASS, "ok"))
    assert dog.overrun() is None
    clock.now += 50
    found = dog.overrun()
    assert found is not None
    assert "cudnn.version ran past the whole run's limit of 60 s (--deadline)" in found.summary
    assert found.observed == "1 checks finished before; cudnn.version was still running"


def test_plan_run_tells_the_watchdog_each_check() -> None:
    clock = Clock()
    dog = deadline.Watchdog(total=60, per_check=10, clock=clock)

    def slow(ctx: Context, spec: Spec) -> Check:
        clock.now += 11  # this check alone takes past its limit
        return spec.passed("done")

    specs = [Spec("a.first", "first", lambda ctx, spec: spec.passed("ok")), Spec("b.slow", "slow", slow)]
    plan.run(specs, Context(), dog)
    assert [c.id for c in dog.finished_checks()] == ["a.first", "b.slow"]
    found = dog.overrun()
    assert found is not None
    assert "b.slow ran past the limit of 10 s" in found.summary


def _fake_torch(tmp_path: Path, body: str) -> dict[str, str]:
    package = tmp_path / "fake/torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(body)
    return {**os.environ, "PYTHONPATH": f"{tmp_path / 'fake'}{os.pathsep}{REPO}"}


def _verify(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuenv.verify", "--no-distributed", *args],
        capture_output=True, text=True, env=env, timeout=timeout, check=False,
    )  # fmt: skip


def test_a_hung_torch_import_ends_in_a_failing_report_naming_it(tmp_path: Path) -> None:
    env = _fake_torch(tmp_path, "import time\ntime.sleep(3600)\n")
    report = tmp_path / "verify.json"
    start = time.monotonic()
    run = _verify(env, "--check-deadline", "1", "--json", str(report))
    assert time.monotonic() - start < 30
    assert run.returncode == 2, run.stderr
    data = json.loads(report.read_text())
    assert data["exit_code"] == 2
    [check] = data["checks"]
    assert (
        check["summary"]
        == "verify was stopped: importing torch ran past the limit of 1 s for one check (--check-deadline)"
    )


def test_a_torch_that_exits_on_import_still_gets_a_failing_report(tmp_path: Path) -> None:
    env = _fake_torch(tmp_path, "raise SystemExit(0)\n")
    report = tmp_path / "verify.json"
    run = _verify(env, "--json", str(report))
    assert run.returncode == 2, run.stderr
    [check] = json.loads(report.read_text())["checks"]
    assert check["summary"].startswith("cannot import torch with")
    assert check["observed"] == "SystemExit: 0"


@pytest.mark.parametrize("option", ["--json", "--junit", "--prom"])
def test_a_report_path_that_is_a_link_is_refused_and_the_decoy_kept(
    tmp_path: Path, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    decoy = tmp_path / "decoy"
    decoy.write_text("precious\n")
    link = tmp_path / "report"
    link.symlink_to(decoy)
    assert cli.main([option, str(link), "--python-missing", "/nowhere/python"]) == 2
    assert decoy.read_text() == "precious\n"
    err = capsys.readouterr().err.strip().splitlines()
    why = "is a symbolic link; give the path of a regular file (verify never writes through a link)"
    assert err == [f"gpuenv verify: {option} {link} {why}"]


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("{tmp}", "is not a regular file"),
        ("/dev/full", "is not a regular file"),
        ("{tmp}/no/such/dir/v.json", "the directory {tmp}/no/such/dir does not exist"),
    ],
)
def test_a_report_path_that_cannot_be_a_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: str, says: str
) -> None:
    target = path.format(tmp=tmp_path)
    assert cli.main(["--json", target, "--python-missing", "/nowhere/python"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert says.format(tmp=tmp_path) in err[0]


def test_reports_are_written_whole_by_rename_and_a_failed_write_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "v.json"
    assert cli.main(["--json", str(out), "--prom", str(tmp_path / "v.prom"), "--python-missing", "/x"]) == 2
    assert json.loads(out.read_text())["exit_code"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.json", "v.prom"]  # no temporary file left
    assert out.stat().st_mode & 0o777 == 0o644

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    assert cli.main(["--json", str(out), "--python-missing", "/x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gpuenv verify: cannot write {out}: No space left on device"]
    assert json.loads(out.read_text())["exit_code"] == 2  # the earlier report is whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.json", "v.prom"]


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda tmp: "/dev/zero", "/dev/zero is not a regular file"),
        (lambda tmp: (os.mkfifo(tmp / "fifo"), str(tmp / "fifo"))[1], "is not a regular file"),
        (lambda tmp: ((tmp / "deep.json").write_text("[" * 100_000 + "]" * 100_000), str(tmp / "deep.json"))[1],
         "nested too deeply to be a stack"),
        (lambda tmp: ((tmp / "big.json").write_text(" " * (2 << 20) + "{}"), str(tmp / "big.json"))[1],
         "more than 1048576 bytes"),
        (lambda tmp: ((tmp / "list.json").write_text("[]"), str(tmp / "list.json"))[1], "a JSON list, not an object"),
    ],
)  # fmt: skip
def test_the_stack_read_is_bounded(tmp_path: Path, make: object, says: str) -> None:
    source = make(tmp_path)  # type: ignore[operator]
    out = tmp_path / "v.json"
    assert cli.main(["--stack", source, "--json", str(out)]) == 2
    [check] = json.loads(out.read_text())["checks"]
    assert check["summary"] == f"cannot read the stack to check against, {source}"
    assert says in check["observed"]


def test_deadlines_must_be_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--deadline", "nan"]) == 2
    assert capsys.readouterr().err.strip() == "gpuenv verify: --deadline nan: give a number of seconds above 0"
