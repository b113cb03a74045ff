"""Drift and onboarding on the shared fleet."""

from __future__ import annotations

import base64
import json

from testbed.sandbox import fleet
from tests.fleet.site import CACHE, STACK_C, Site, link, make_signer, recap, ssh


def test_drift_finds_a_host_changed_by_hand(site: Site) -> None:
    site.declare(STACK_C)
    hand = ssh(
        "sb2",
        "ln -sfn /usr/local/cuda-12.4 /usr/local/cuda && ldconfig && "
        f"/opt/gpuenv/envs/default/bin/python -m pip install -q --index-url {CACHE}/pypi/simple "
        f"--trusted-host {fleet.controller_ip()} six==1.16.0",
    )
    assert hand.returncode == 0, hand.stderr
    run = site.play("drift.yml", "--limit", "sb1,sb2,localhost")
    assert run.returncode != 0  # sb2 differs
    counts = recap(run.stdout)
    assert counts["sb1"]["changed"] == counts["sb2"]["changed"] == 0
    assert (counts["sb1"]["failed"], counts["sb2"]["failed"]) == (0, 1)
    reports = {h: json.loads((site.reports / f"drift/{h}.json").read_text()) for h in ("sb1", "sb2")}
    assert reports["sb1"]["exit_code"] == 0, [c for c in reports["sb1"]["checks"] if c["status"] == "fail"]
    failed = {c["id"]: c for c in reports["sb2"]["checks"] if c["status"] == "fail"}
    assert {"drift.cuda_default", "drift.env_packages", "cuda_tree.toolkit"} <= set(failed), failed
    assert failed["drift.env_packages"]["observed"]["added"] == ["six==1.16.0"]
    md = (site.reports / "drift/drift.md").read_text()
    assert "sb2 **FAILED**" in md
    assert "drift" in md.splitlines()[0]
    # Drift changed nothing: the hand changes are still there.
    assert link("sb2", "/usr/local/cuda") == "/usr/local/cuda-12.4"


def test_onboarding_a_new_member_ends_with_verify_run_as_them(site: Site) -> None:
    run = site.play("onboard.yml", "--limit", "sb1", "-e", "onboard_user_name=carol")
    assert run.returncode == 0, run.stdout[-4000:]
    report = json.loads((site.reports / "onboard/sb1-carol.json").read_text())
    assert report["exit_code"] == 0
    assert "What to type next" in run.stdout
    groups = ssh("sb1", "id -nG carol").stdout.split()
    assert "gpuenv" in groups
    # Their own shells, login or not, find the environment.
    shells = ssh("sb1", "su - carol -c 'command -v python' && su carol -c 'bash -ic \"command -v python\"'")
    assert shells.stdout.split() == ["/opt/gpuenv/envs/default/bin/python"] * 2, shells.stdout + shells.stderr
    assert ssh("sb1", "test -s ~carol/WELCOME-gpuenv.txt").returncode == 0
    again = site.play("onboard.yml", "--limit", "sb1", "-e", "onboard_user_name=carol")
    assert again.returncode == 0
    assert recap(again.stdout)["sb1"]["changed"] == 0


def test_a_member_s_own_start_up_files_cannot_write_the_onboarding_report(site: Site) -> None:
    """The report the controller keeps comes from verify run as the member in a clean environment
    with the group's profile alone: a gpuenv-verify their ~/.bash_profile defines never runs."""
    forged = '{"schema_version": 2, "host": "forged", "exit_code": 0, "checks": [{"id": "forged", "status": "pass"}]}'
    dotfile = base64.b64encode(f"gpuenv-verify() {{ echo '{forged}'; }}\npython() {{ :; }}\n".encode()).decode()
    plant = (
        "(id dave >/dev/null 2>&1 || useradd -m -s /bin/bash dave) && cd ~dave"
        f" && echo {dotfile} | base64 -d | tee -a .bash_profile >> .bashrc && chown dave: .bash_profile .bashrc"
    )
    placed = ssh("sb1", plant)
    assert placed.returncode == 0, placed.stderr
    run = site.play("onboard.yml", "--limit", "sb1", "-e", "onboard_user_name=dave")
    assert run.returncode == 0, run.stdout[-4000:]
    report = json.loads((site.reports / "onboard/sb1-dave.json").read_text())
    assert report["host"] == "sb1"
    assert "forged" not in [c["id"] for c in report["checks"]]
    assert report["run_as"]["account"] == "dave"
    assert report["run_as"]["environment"] == "env -i, /etc/profile.d/gpuenv-env-default.sh only"


def test_onboarding_writes_nothing_through_links_a_member_planted(site: Site) -> None:
    """An existing account's home is the member's: links they plant there to system files must not
    make root write, or chown, what they point at."""
    _, signer = make_signer(site, "member")
    key_line = signer.split(" ", 1)[1] + " member@example"
    targets = ["/etc/profile.d", "/etc/bash.bashrc", "/etc/motd", "/root/.ssh/authorized_keys"]
    plant = (
        "mkdir -p /root/.ssh && touch /root/.ssh/authorized_keys"
        " && useradd -m -s /bin/bash mallory && cd ~mallory && rm -f .bashrc"
        " && ln -s /etc/profile.d .ssh && ln -s /etc/bash.bashrc .bashrc && ln -s /etc/motd WELCOME-gpuenv.txt"
        " && chown -h mallory: .ssh .bashrc WELCOME-gpuenv.txt"
        " && useradd -m -s /bin/bash trudy && mkdir ~trudy/.ssh"
        " && ln -s /root/.ssh/authorized_keys ~trudy/.ssh/authorized_keys && chown -hR trudy: ~trudy/.ssh"
    )
    state = f"stat -c '%n %U %G %a' {' '.join(targets)} && sha256sum {' '.join(targets[1:])}"
    placed = ssh("sb1", plant)
    assert placed.returncode == 0, placed.stderr
    before = ssh("sb1", state).stdout
    try:
        for user, links in {
            "mallory": [
                "/home/mallory/.ssh is a symbolic link to /etc/profile.d",
                "/home/mallory/.bashrc is a symbolic link to /etc/bash.bashrc",
                "/home/mallory/WELCOME-gpuenv.txt is a symbolic link to /etc/motd",
            ],
            "trudy": ["/home/trudy/.ssh/authorized_keys is a symbolic link to /root/.ssh/authorized_keys"],
        }.items():
            extra = json.dumps({"onboard_user_name": user, "onboard_user_ssh_keys": [key_line]})
            run = site.play("onboard.yml", "--limit", "sb1", "-e", extra)
            assert run.returncode != 0, run.stdout[-3000:]
            assert f"Refusing to onboard {user} on sb1" in run.stdout, run.stdout[-3000:]
            for sentence in links:
                assert sentence in run.stdout, run.stdout[-3000:]
            assert ssh("sb1", state).stdout == before
            # Refused before the account was touched: not even the environment's group was added.
            assert "gpuenv" not in ssh("sb1", f"id -nG {user}").stdout.split()
    finally:
        ssh("sb1", "userdel -r mallory; userdel -r trudy")


def test_a_rerun_skips_the_stages_of_a_host_nothing_changed_and_runs_them_after_a_change(site: Site) -> None:
    """site.yml's stamp (roles/converged): the run after a complete one verifies and skips
    every stage but the driver's read of its branch; a file a stage placed, removed by hand, makes
    the next run run the stages and put it back."""
    site.declare(STACK_C)
    stage_task = "TASK [cuda_toolkit : "
    first = site.play("site.yml", "--limit", "sb1")
    assert first.returncode == 0, first.stdout[-4000:]
    assert stage_task in first.stdout  # no stamp of this stack yet: upgrade.yml does not stamp
    again = site.play("site.yml", "--limit", "sb1")
    assert again.returncode == 0, again.stdout[-4000:]
    assert recap(again.stdout)["sb1"]["changed"] == 0
    for skipped in (
        stage_task,
        "TASK [cudnn : ",
        "TASK [pytorch_env : ",
        "TASK [gpu_services : ",
        "TASK [stack_record : ",
    ):
        assert skipped not in again.stdout, skipped
    assert "TASK [nvidia_driver : Ask apt which driver versions it offers]" in again.stdout  # the branch "535"
    assert "TASK [nvidia_driver : Install" not in again.stdout
    assert "TASK [gpu_verify : Run gpuenv verify]" in again.stdout
    assert json.loads((site.reports / "verify/sb1.json").read_text())["exit_code"] == 0

    assert ssh("sb1", "rm /etc/profile.d/gpuenv-cuda.sh").returncode == 0
    repaired = site.play("site.yml", "--limit", "sb1")
    assert repaired.returncode == 0, repaired.stdout[-4000:]
    assert stage_task in repaired.stdout
    assert recap(repaired.stdout)["sb1"]["changed"] >= 1
    assert ssh("sb1", "test -s /etc/profile.d/gpuenv-cuda.sh").returncode == 0
    last = site.play("site.yml", "--limit", "sb1")
    assert last.returncode == 0, last.stdout[-4000:]
    assert stage_task not in last.stdout
