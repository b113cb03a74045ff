"""`gpuenv report`: the fleet table from verify reports."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuenv import fleetreport
from gpuenv.verify import model, plan


def _write(directory: Path, host: str, checks: list[model.Check]) -> None:
    (directory / f"{host}.json").write_text(json.dumps(model.to_report(checks, host), default=str))


def test_rows_groups_versions_drift_and_hints(tmp_path: Path) -> None:
    hint = "unset LD_LIBRARY_PATH"
    _write(
        tmp_path,
        "sb1",
        [
            model.Check("torch.build", "pass", "ok", {"torch": "2.5.1+cu124", "cuda": "12.4"}, {"torch": "2.5.1"}),
            model.Check("cudnn.version", "pass", "ok", 90100, 90100),
            model.Check("driver.kernel", "skip", "skipped, no GPU", "no module"),
        ],
    )
    _write(
        tmp_path,
        "sb2",
        [
            model.Check("torch.build", "pass", "ok", {"torch": "2.5.1+cu124", "cuda": "12.4"}, {"torch": "2.5.1"}),
            model.Check("cudnn.version", "fail", "cuDNN 90800, not 9.1.0.70", 90800, 90100, hint=hint),
            model.Check("cudnn.loaded_library", "warn", "a system cuDNN is loaded", ["/usr/local/cuda/lib64/x"]),
        ],
    )
    hosts = fleetreport.load(tmp_path)
    md = fleetreport.markdown(hosts)
    rows = [line for line in md.splitlines() if line.startswith("| sb")]
    assert rows[0].startswith("| sb1 | skip | ok | - | ok |")
    assert rows[1].startswith("| sb2 **FAILED** | - | ok | - | FAIL |")  # the cudnn group's worst is the failure
    assert "**90800 (declared 90100)**" in rows[1]  # drift marked
    assert "- sb2 `cudnn.version` fail: cuDNN 90800, not 9.1.0.70. Fix: unset LD_LIBRARY_PATH" in md
    assert "1 of 2 hosts passed every check" in md
    page = fleetreport.html_page(hosts)
    assert page.count("<tr>") == 3
    assert 'class="drift"' in page
    assert "unset LD_LIBRARY_PATH" in page


def test_an_empty_or_foreign_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(fleetreport.ReportError, match="no gpuenv verify reports"):
        fleetreport.load(tmp_path)
    (tmp_path / "x.json").write_text('{"schema_version": 7}')
    with pytest.raises(fleetreport.ReportError, match="schema_version 7"):
        fleetreport.load(tmp_path)


@pytest.mark.browser
def test_the_html_report_renders_in_chromium(tmp_path: Path, repo: Path) -> None:
    """Debian's chromium, headless: the page parses into the table it should, and a screenshot of
    it is kept in reports/screenshots/ for people to look at."""
    chromium = shutil.which("chromium")
    assert chromium, "chromium is missing: ./scripts/setup installs it"
    _write(tmp_path, "sb1", [model.Check("torch.build", "pass", "ok", {"torch": "2.5.1"}, {"torch": "2.5.1"})])
    _write(tmp_path, "sb2", [model.Check("cudnn.version", "fail", "cuDNN 90800, not 9.1.0.70", 90800, 90100, "x")])
    page = tmp_path / "fleet.html"
    page.write_text(fleetreport.html_page(fleetreport.load(tmp_path)))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,600"]
    dom = subprocess.run(
        [chromium, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert dom.count("<tr>") == 3
    assert "1 of 2 hosts passed every check" in dom
    shots = repo / "reports" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    shot = shots / "fleet-report.png"
    shot.unlink(missing_ok=True)
    subprocess.run(
        [chromium, *flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120, check=True
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 5000  # a blank page is smaller than a rendered table


def test_a_host_verify_could_not_check_and_a_stale_report_are_marked(tmp_path: Path) -> None:
    ok = [model.Check("torch.build", "pass", "ok", {"torch": "2.5.1"}, {"torch": "2.5.1"})]
    report = model.to_report(ok, "sb1", generated="2026-12-01T10:00:00+00:00")
    (tmp_path / "sb1.json").write_text(json.dumps(report))
    broken = model.failed_report("sb2", "cannot import torch with /opt/x/bin/python", "No module named 'torch'", "h")
    (tmp_path / "sb2.json").write_text(json.dumps(broken, default=str))
    since = fleetreport.parse_since("2026-12-01T11:00:00+00:00")
    md = fleetreport.markdown(fleetreport.load(tmp_path, since))
    rows = {line.split(" ")[1]: line for line in md.splitlines() if line.startswith("| sb")}
    assert rows["sb1"].startswith("| sb1 **STALE (report from 2026-12-01T10:00:00+00:00, not from this run)**")
    assert rows["sb2"].startswith("| sb2 **FAILED (verify could not check)**")
    assert "- sb2 `verify.run` fail: cannot import torch with /opt/x/bin/python" in md
    assert "0 of 2 hosts passed every check" in md
    # Without --since nothing is stale; a version 1 report (no time) is stale as soon as one asks.
    assert "STALE" not in fleetreport.markdown(fleetreport.load(tmp_path))
    del report["generated"]
    report["schema_version"] = 1
    (tmp_path / "sb1.json").write_text(json.dumps(report))
    assert "STALE (report from an older gpuenv" in fleetreport.markdown(fleetreport.load(tmp_path, since))
    # The playbooks mark by run id (no clocks to compare): a report of another run is stale.
    mine = model.to_report(ok, "sb1", run="20261201T230000-1")
    (tmp_path / "sb1.json").write_text(json.dumps(mine))
    by_run = fleetreport.markdown(fleetreport.load(tmp_path, run="20261201T230000-1"))
    assert "| sb1 |" in by_run
    assert "| sb2 **STALE" in by_run  # sb2's report names no run
    with pytest.raises(fleetreport.ReportError, match="not an ISO 8601 time"):
        fleetreport.parse_since("yesterday")


def test_a_check_id_with_a_new_prefix_gets_its_own_column(tmp_path: Path) -> None:
    _write(tmp_path, "sb1", [model.Check("rdma.link", "fail", "no InfiniBand link", hint="check the cable")])
    md = fleetreport.markdown(fleetreport.load(tmp_path))
    header = md.splitlines()[0]
    assert header.split(" | ")[-len(fleetreport._VERSIONS) - 1] == "rdma"
    assert "| sb1 **FAILED** | - | - | - | - | - | - | - | - | FAIL |" in md


def test_a_report_with_an_unreadable_time_is_stale_not_a_crash(tmp_path: Path) -> None:
    report = model.to_report([model.Check("torch.build", "pass", "ok")], "sb1", generated="yesterday")
    (tmp_path / "sb1.json").write_text(json.dumps(report))
    md = fleetreport.markdown(fleetreport.load(tmp_path, fleetreport.parse_since("2026-12-01T11:00:00+00:00")))
    assert "| sb1 **STALE (report from yesterday, not from this run)**" in md


def test_every_check_verify_declares_has_a_column_and_every_version_column_a_check(tmp_path: Path) -> None:
    """The columns come from the check ids: a check verify declares under a new prefix gets one
    without an edit here, in verify's order; a version column names a check verify has."""
    declared = [spec.id for spec in plan.CHECKS]
    _write(tmp_path, "sb1", [model.Check(check_id, "pass", "ok") for check_id in declared])
    header = fleetreport.markdown(fleetreport.load(tmp_path)).splitlines()[0].split(" | ")
    columns = header[1 : -len(fleetreport._VERSIONS)]
    assert columns == [fleetreport._column(g) for g in dict.fromkeys(i.split(".")[0] for i in declared)]
    assert {check_id for _label, check_id, _key in fleetreport._VERSIONS} <= set(declared)


def test_a_later_report_by_hand_counts_the_last_run_s_hosts_only(tmp_path: Path) -> None:
    """What scripts/demo and a user run after site.yml: `gpuenv report DIR` with no --run. A report
    another run left in DIR (a benchmark's fan-out, a host since taken out of the inventory) is stale."""
    ok = [model.Check("torch.build", "pass", "ok", {"torch": "2.5.1"}, {"torch": "2.5.1"})]
    (tmp_path / "sb1.json").write_text(json.dumps(model.to_report(ok, "sb1", run="20261206T070000Z-1")))
    (tmp_path / "sb8.json").write_text(json.dumps(model.to_report(ok, "sb8", run="20261206T064500Z-7")))
    assert fleetreport.last_run(tmp_path) is None
    (tmp_path / fleetreport.LAST_RUN).write_text('{"run": "20261206T070000Z-1"}\n')
    assert fleetreport.last_run(tmp_path) == "20261206T070000Z-1"
    out = subprocess.run(
        [sys.executable, "-m", "gpuenv", "report", str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout
    assert "| sb8 **STALE" in out
    assert "1 of 2 hosts passed every check" in out
    every = subprocess.run(
        [sys.executable, "-m", "gpuenv", "report", str(tmp_path), "--all-runs"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "2 of 2 hosts passed every check" in every
    (tmp_path / fleetreport.LAST_RUN).write_text("not json")
    assert fleetreport.last_run(tmp_path) is None
