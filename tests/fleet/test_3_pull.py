"""Pull mode on the shared fleet: signed commits only, and the reboot guard."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from testbed.sandbox import fleet
from tests.conftest import REPO
from tests.fleet.site import GIT, SITE_VARS, STACK_A, STACK_B, Site, link, make_signer, recap, ssh


def _commit(work: Path, message: str, key: Path | None) -> None:
    """Commit everything in the work tree, SSH-signed with key (None: unsigned)."""
    sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key}"] if key else []
    subprocess.run([*GIT, "add", "-A"], cwd=work, check=True)
    subprocess.run([*GIT, *sign, "commit", "-q", *(["-S"] if key else []), "-m", message], cwd=work, check=True)


def _declare_in_repo(work: Path, stack: dict[str, Any]) -> None:
    inventory = work / "inventory/site"
    (inventory / "group_vars").mkdir(parents=True, exist_ok=True)
    hosts = {"all": {"children": {"gpu_hosts": {"hosts": {"sb4": {}}}}}}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    site_vars = {"gpu_stack": stack, **SITE_VARS, "ansible_python_interpreter": "/usr/bin/python3"}
    (inventory / "group_vars/gpu_hosts.yml").write_text(yaml.safe_dump(site_vars))


def _site_repo(site: Site, stack: dict[str, Any], key: Path) -> Path:
    """The site's work tree: this repository's files with the site's inventory added, committed and
    signed with key."""
    work = site.root / "site-repo"
    shutil.rmtree(work, ignore_errors=True)
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],  # noqa: S607
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, work / name)
    _declare_in_repo(work, stack)
    subprocess.run([*GIT, "init", "-q", "-b", "main"], cwd=work, check=True)
    _commit(work, "site", key)
    return work


def _publish(site: Site, work: Path, host: str) -> None:
    """The work tree's history as the bare repository /srv/gpuenv-site.git on the host itself (a
    local git repository: no git server needed)."""
    bare = site.root / "gpuenv-site.git"
    shutil.rmtree(bare, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)  # noqa: S607
    tar = subprocess.run(["tar", "-C", str(bare.parent), "-czf", "-", bare.name], capture_output=True, check=True)  # noqa: S607
    h = fleet.State.load().hosts[host]
    placed = subprocess.run(
        fleet.ssh_argv(h, "rm -rf /srv/gpuenv-site.git && mkdir -p /srv && tar -C /srv -xzf -"),
        input=tar.stdout,
        capture_output=True,
        check=False,
    )
    assert placed.returncode == 0, placed.stderr


def test_pull_mode_applies_signed_commits_only_and_a_second_pull_changes_nothing(site: Site) -> None:
    key, signer = make_signer(site, "site")
    work = _site_repo(site, STACK_A, key)
    _publish(site, work, "sb4")
    site.declare(STACK_B)
    setup = site.play(
        "pull.yml",
        "--limit",
        "sb4",
        "-e",
        json.dumps(
            {
                "pull_mode_repo_url": "/srv/gpuenv-site.git",
                "pull_mode_inventory": "inventory/site",
                "pull_mode_allowed_signers": [signer],
            }
        ),
    )
    assert setup.returncode == 0, setup.stdout[-4000:]
    assert ssh("sb4", "systemctl is-enabled gpuenv-pull.timer").stdout.strip() == "enabled"
    first = ssh("sb4", "systemctl start gpuenv-pull.service", timeout=1800)
    log = ssh("sb4", "cat /var/log/gpuenv-pull.log").stdout
    assert first.returncode == 0, log[-4000:]
    # sb4 was on B (CUDA 12.4.1), untouched by the rollout; the site's repository declares A (12.1.1).
    assert link("sb4", "/usr/local/cuda") == "/usr/local/cuda-12.1"
    facts = json.loads(ssh("sb4", "cat /etc/ansible/facts.d/gpuenv.fact").stdout)
    assert facts["resolved"]["cuda"] == "12.1.1"
    assert ssh("sb4", "test -s /var/lib/gpuenv/pull/checkout/reports/sb4.json").returncode == 0
    second = ssh("sb4", "systemctl start gpuenv-pull.service", timeout=1800)
    log = ssh("sb4", "cat /var/log/gpuenv-pull.log").stdout
    assert second.returncode == 0, log[-4000:]
    counts = recap(log)["sb4"]
    assert (counts["changed"], counts["failed"]) == (0, 0), log.rsplit("PLAY RECAP", 1)[1]

    # Pushed to the branch: B, unsigned, then B signed by a key the host does not allow. Neither runs.
    other, _ = make_signer(site, "stranger")
    for signed_by in (None, other):
        _declare_in_repo(work, STACK_B)
        (work / "pushed-by").write_text(str(signed_by))
        _commit(work, f"B, signed by {signed_by}", signed_by)
        _publish(site, work, "sb4")
        ssh("sb4", "truncate -s 0 /var/log/gpuenv-pull.log")
        refused = ssh("sb4", "systemctl start gpuenv-pull.service", timeout=1800)
        log = ssh("sb4", "cat /var/log/gpuenv-pull.log").stdout
        assert refused.returncode != 0, log[-4000:]
        assert 'Failed to verify GPG signature of commit/tag "main"' in log, log[-4000:]
        assert "PLAY RECAP" not in log  # the playbook never started
        assert link("sb4", "/usr/local/cuda") == "/usr/local/cuda-12.1"
        facts = json.loads(ssh("sb4", "cat /etc/ansible/facts.d/gpuenv.fact").stdout)
        assert facts["resolved"]["cuda"] == "12.1.1"


def test_the_reboot_after_a_pull_waits_for_gpu_processes(site: Site) -> None:
    """The service's reboot guard (run after a pull that flagged a new driver): with a job on the
    GPU it does not reboot, whether NVML names the job or, after an upgrade, cannot answer
    ("Driver/library version mismatch", exit 18) and a process holds /dev/nvidia0; with none it
    does. systemctl is a stand-in that records the call."""
    guard = "/opt/gpuenv/pull/reboot-if-needed"
    assert ssh("sb4", f"test -x {guard}").returncode == 0  # written by the pull test's pull.yml
    fake = (
        "mkdir -p /tmp/fakebin && printf '#!/bin/sh\\necho \"$*\" >> /tmp/fakebin/systemctl.calls\\n' "
        "> /tmp/fakebin/systemctl && chmod 755 /tmp/fakebin/systemctl && rm -f /tmp/fakebin/systemctl.calls "
        "&& touch /run/gpuenv-reboot-required"
    )
    assert ssh("sb4", fake).returncode == 0

    def smi(body: str) -> None:
        h = fleet.State.load().hosts["sb4"]
        put = "cat > /tmp/fakebin/nvidia-smi && chmod 755 /tmp/fakebin/nvidia-smi"
        assert subprocess.run(fleet.ssh_argv(h, put), input=body, text=True, check=False).returncode == 0

    def guard_says() -> str:
        return ssh("sb4", f"PATH=/tmp/fakebin:$PATH {guard}").stdout

    def rebooted() -> bool:
        return ssh("sb4", "cat /tmp/fakebin/systemctl.calls").stdout.strip() == "reboot"

    try:
        smi('#!/bin/sh\ncase "$*" in *--query-compute-apps*) echo "4242, python3 train.py"; exit 0;; esac\nexit 9\n')
        out = guard_says()
        assert "not rebooting for the new NVIDIA driver: processes use the GPUs (4242, python3 train.py)" in out
        assert not rebooted()
        # After an upgrade NVML cannot answer (exit 18); a job still holds the device open.
        smi("#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n")
        holder = ssh("sb4", "touch /dev/nvidia0 && (nohup sleep 120 3</dev/nvidia0 >/dev/null 2>&1 &) && sleep 1")
        assert holder.returncode == 0, holder.stderr
        out = guard_says()
        assert "not rebooting" in out, out
        assert "sleep" in out
        assert not rebooted()
        ssh("sb4", "pkill -f 'sleep 120'; rm -f /dev/nvidia0")
        assert "rebooting for the new NVIDIA driver" in guard_says()
        assert rebooted()
        # No driver loaded (nvidia-smi exits 9): nothing can run on a GPU, so it reboots.
        ssh("sb4", "rm -f /tmp/fakebin/systemctl.calls")
        smi("#!/bin/sh\nexit 9\n")
        assert "rebooting for the new NVIDIA driver" in guard_says()
        assert rebooted()
    finally:
        ssh("sb4", "pkill -f 'sleep 120'; rm -rf /tmp/fakebin /run/gpuenv-reboot-required /dev/nvidia0")
