"""Running site.yml again repairs what verify, drift.yml or the converged stamp finds: the fault x
repair matrix (tests/fleet/matrix.py, the table in docs/reliability.md), after the other
modules, on the hosts as they left them.

Each host's rows are injected together and go through two rounds: with the stamp of the last
complete run in place (as a user reruns), then with it removed. A round proves, per row:
1. verify (as a user runs it, and inside drift.yml) or drift flags it, with a hint;
2. site.yml repairs it: the row's proof holds, verify passes, drift finds nothing new;
3. nothing else changed: every record, the switch points and the environment's id are as before.
A refused row instead fails site.yml with a message that names the cause, changes nothing, and
passes once the user's fix (the row's proof) is made. The hosts run side by side;
GPUENV_TEST_REPAIR_HOSTS=sb2,sb3 runs those hosts' rows alone (while working on them)."""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from testbed.sandbox import fleet
from tests.conftest import run_tool
from tests.fleet.matrix import ROWS, STAMP, Row
from tests.fleet.site import CACHE, STACK_D, STACK_K, STACK_N, Site, ssh

STACKS = {"sb1": STACK_K, "sb2": STACK_N, "sb3": STACK_D, "sb4": STACK_D}
# sb2 runs the persistence daemon (gpu_services_persistenced: on) for its row.
HOST_VARS = {"sb2": {"gpu_services_persistenced": "on"}}
# Each record, where each switch point leads, and the environment's id: nothing but the faults may
# differ after a repair.
RECORDS = (
    'for f in /etc/ansible/facts.d/*.fact /etc/gpuenv/stack.json; do echo "== $f"; cat "$f"; echo; done; '
    'for l in /usr/local/cuda /usr/local/cuda-* /opt/gpuenv/envs/default; do echo "-> $l $(readlink $l)"; done'
)
LD_WARNING = "sets LD_LIBRARY_PATH globally"


def records(host: str) -> str:
    got = ssh(host, RECORDS)
    assert got.returncode == 0, got.stderr
    return got.stdout


def findings(site: Site, host: str) -> dict[str, tuple[str, str]]:
    """Every failing check with what it says and its hint: drift.yml's report (drift's checks and
    verify's against the declared stack) and verify as a user runs it (against the host's own stack
    record)."""
    drift = site.play("drift.yml", "--limit", host, "-e", json.dumps({"gpuenv_drift_fail_host": False}))
    assert drift.returncode == 0, drift.stdout[-3000:]
    report = json.loads((site.reports / "drift" / f"{host}.json").read_text())
    own = ssh(host, "/usr/local/bin/gpuenv-verify --json - 2>/dev/null")
    checks = report["checks"] + json.loads(own.stdout)["checks"]
    return {c["id"]: (c["summary"], c.get("hint") or "") for c in checks if c["status"] == "fail"}


def inject(host: str, rows: list[Row]) -> None:
    pypi = f"{CACHE}/pypi/simple"
    env = f"PYPI={pypi} PYPI_HOST={fleet.controller_ip()}; export PYPI PYPI_HOST; "
    for row in rows:
        done = ssh(host, env + row.inject)
        assert done.returncode == 0, f"{row.key}: {done.stderr[-2000:]}"


def a_round(
    site: Site, host: str, rows: list[Row], *, stamp: bool, before: dict[str, tuple[str, str]], settle: bool = True
) -> dict[str, tuple[str, str]]:
    """One round on the host; returns the findings after it (the next round's baseline), read again
    only with settle. A check flags a fault when it fails where it passed before, or says something
    else than before (the sandbox's persistence daemon fails to start at every boot: no GPU)."""
    log = site.root / "timeline.txt"
    started = time.monotonic()
    kept = records(host)
    inject(host, rows)
    if not stamp:
        assert ssh(host, "rm -f /var/lib/gpuenv/converged.json").returncode == 0
    found = findings(site, host)
    new = {k: hint for k, (said, hint) in found.items() if before.get(k, ("", ""))[0] != said}
    for row in rows:
        want = set(row.detected_by) - (set() if stamp else {STAMP})
        assert want <= set(new), f"{row.key} (stamp {stamp}): not flagged by {sorted(want - set(new))}; flagged {new}"
    assert all(new.values()), f"a failing check without a hint: {new}"
    refused = [r for r in rows if r.promise == "refuse"]
    run = site.play("site.yml", "--limit", host)
    assert LD_WARNING not in run.stdout, run.stdout[-3000:]
    if refused:
        assert run.returncode != 0
        assert "Another cuDNN comes first: a file in /etc/ld.so.conf.d names /opt/other-cudnn/lib" in run.stdout, (
            run.stdout[-3000:]
        )
        assert records(host) == kept  # refused: nothing changed
        for row in refused:
            assert ssh(host, row.proof).returncode == 0
        run = site.play("site.yml", "--limit", host)
    assert run.returncode == 0, run.stdout[-4000:]
    for row in rows:
        if row.promise == "repair":
            proof = ssh(host, row.proof)
            assert proof.returncode == 0, f"{row.key} (stamp {stamp}) not repaired: {row.proof}\n{proof.stderr[-1000:]}"
    assert ssh(host, "/usr/local/bin/gpuenv-verify >/dev/null 2>&1").returncode == 0
    assert records(host) == kept
    after = findings(site, host) if settle else before
    assert set(after) <= set(before), f"still flagged after the repair: {sorted(set(after) - set(before))}"
    with log.open("a") as out:
        out.write(f"{host} {[r.key for r in rows]} stamp {stamp}: {time.monotonic() - started:.0f} s\n")
    return after


def repair_host(site: Site, host: str) -> None:
    site.declare(STACKS[host], HOST_VARS)
    # As the earlier modules left the host, brought to its stack by a complete run: the stamp.
    first = site.play("site.yml", "--limit", host)
    assert first.returncode == 0, first.stdout[-4000:]
    assert LD_WARNING not in first.stdout
    before = findings(site, host)
    rows = [r for r in ROWS if r.host == host]
    repaired = [r for r in rows if r.promise == "repair"]
    after = a_round(site, host, repaired, stamp=True, before=before)
    a_round(site, host, repaired, stamp=False, before=after)
    # Each refused row alone (it stops site.yml before the stages that would repair the others); the
    # rounds before proved drift clean after a passing run.
    for refused in (r for r in rows if r.promise == "refuse"):
        for stamp in (True, False):
            a_round(site, host, [refused], stamp=stamp, before=after, settle=False)


def stale_reports_are_never_counted(site: Site) -> None:
    """The fleet report of a run counts that run's hosts only, written by site.yml itself even when
    limited to some hosts: a report another run left (here of sb9, a host not in the inventory) is
    STALE, and `gpuenv report` run later by hand says the same."""
    verify = site.reports / "verify"
    mine = json.loads((verify / "sb1.json").read_text())
    (verify / "sb9.json").write_text(json.dumps({**mine, "host": "sb9", "run": "an-earlier-run"}))
    run = site.play("site.yml", "--limit", "sb1")
    assert run.returncode == 0, run.stdout[-3000:]
    fleet_md = (verify / "fleet.md").read_text()
    assert "| sb9 **STALE" in fleet_md, fleet_md
    assert "1 of 2 hosts passed every check" in fleet_md
    later = run_tool("python", "-m", "gpuenv", "report", str(verify), env=site.env, timeout=120)
    assert "1 of 2 hosts passed every check" in later.stdout, later.stdout


HOSTS: dict[str, Callable[[Site], None]] = {
    host: (lambda s, h=host: repair_host(s, h))
    for host in sorted({r.host for r in ROWS})
    if host in os.environ.get("GPUENV_TEST_REPAIR_HOSTS", host).split(",")
}


def test_a_rerun_repairs_every_fault_of_the_matrix(site: Site) -> None:
    with ThreadPoolExecutor(len(HOSTS)) as pool:
        running = {host: pool.submit(check, site.child(f"repair-{host}")) for host, check in HOSTS.items()}
    failed = {
        host: "".join(traceback.format_exception(error))
        for host, future in running.items()
        if (error := future.exception()) is not None
    }
    assert not failed, "\n\n".join(f"{host} failed:\n{why}" for host, why in failed.items())
    if "sb1" in HOSTS:
        stale_reports_are_never_counted(site.child("repair-sb1"))
