"""Fleet operations on a sandbox fleet of 4 Debian 12 hosts (issue 9): a rolling upgrade, a second
one that a broken host stops, drift, onboarding and pull mode.

The hosts start on stack A (CUDA 12.1.1, torch 2.5.1+cu124 from PyPI through the download cache,
cuDNN 9.1.0.70 from the mirror, the driver's user space): one host is provisioned with site.yml
and the other three start from its snapshot. Then:
  B  CUDA 12.4.1: rolled out to all, a canary and then two at a time;
  C  CUDA 12.1.1 again and einops in the environment: sb3, in the second batch, has a broken PyPI
     path, so its environment cannot be built after its toolkit default already moved; it must get
     its B toolkit back, still verify, and the rollout must stop before sb4;
  a host whose GPU runs a job (a stand-in nvidia-smi says so) is refused, and left as it was.
Needs root; about a quarter of an hour.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuenv.sandbox import fleet, mirror
from gpuenv.tests.conftest import REPO, run_tool

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root (network namespaces, mounts, nspawn)"),
]

MIRROR = f"http://{fleet.controller_ip()}:{fleet.MIRROR_PORT}"
CACHE = fleet.cache_url()
BASE_STACK = {
    "profile": "torch-2.5-cu124",
    "driver": "535",
    "cudnn": "9.1.0.70",
    "python": "3.11",
    "torch": "2.5.1",
    "torch_variant": "cu124",
}
STACK_A = {**BASE_STACK, "cuda": "12.1.1"}
STACK_B = {**BASE_STACK, "cuda": "12.4.1"}
STACK_C = {**BASE_STACK, "cuda": "12.1.1", "packages": ["einops==0.8.1"]}
SITE_VARS = {
    "cuda_toolkit_redist_url": f"{MIRROR}/compute/cuda/redist",
    "cudnn_redist_url": f"{MIRROR}/compute/cudnn/redist",
    "cuda_toolkit_components": ["cuda_cudart", "cuda_nvcc", "cuda_nvrtc"],
    "pytorch_env_pypi_url": f"{CACHE}/pypi/simple",
    "nvidia_driver_mode": "userspace",
}


class Site:
    """An inventory directory of the sandbox's hosts with a declared stack, and the reports."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.inventory = root / "inventory"
        self.reports = root / "reports"
        self.env = env
        (self.inventory / "group_vars").mkdir(parents=True, exist_ok=True)
        (self.inventory / "host_vars").mkdir(exist_ok=True)

    def declare(self, stack: dict[str, Any], host_vars: dict[str, dict[str, Any]] | None = None) -> None:
        shutil.copy(fleet.State.load().inventory or "", self.inventory / "hosts.yml")
        (self.inventory / "group_vars/gpu_hosts.yml").write_text(yaml.safe_dump({"gpu_stack": stack, **SITE_VARS}))
        for old in (self.inventory / "host_vars").glob("*.yml"):
            old.unlink()
        for host, values in (host_vars or {}).items():
            (self.inventory / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(values))

    def play(self, playbook: str, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        extra = {
            "gpu_verify_reports_dir": str(self.reports / "verify"),
            "gpuenv_upgrade_reports_dir": str(self.reports / "rollout"),
            "gpuenv_drift_reports_dir": str(self.reports / "drift"),
            "onboard_user_reports_dir": str(self.reports / "onboard"),
        }
        return run_tool(
            "ansible-playbook",
            "-i",
            str(self.inventory),
            f"playbooks/{playbook}",
            "-e",
            json.dumps(extra),
            *args,
            env=self.env,
            timeout=timeout,
        )


def ssh(host: str, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    h = fleet.State.load().hosts[host]
    return subprocess.run(fleet.ssh_argv(h, command), capture_output=True, text=True, check=False, timeout=timeout)


def link(host: str, path: str) -> str:
    return ssh(host, f"readlink {path}").stdout.strip()


def recap(stdout: str) -> dict[str, dict[str, int]]:
    """The last PLAY RECAP of a run: host -> {ok, changed, failed, ...}."""
    out = {}
    for line in stdout.rsplit("PLAY RECAP", 1)[1].splitlines():
        if " : " in line:
            host, counts = line.split(" : ", 1)
            out[host.strip()] = {k: int(v) for k, v in (kv.split("=") for kv in counts.split())}
    return out


def summary(site: Site) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((site.reports / "rollout/summary.json").read_text())
    return loaded


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, venv_env: dict[str, str]) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("fleet")
    env = {**venv_env, "ANSIBLE_NOCOLOR": "1"}
    fleet.down()
    # The hosts install CUDA and cuDNN from the local mirror: built here on a fresh machine (where no
    # demo or molecule scenario built it first), checked when it exists.
    mirror.build(mirror.default_site(), mirror.default_wheels())
    try:
        fleet.up(1, ["debian12"], root / "hosts-1.yml")
        s = Site(root, env)
        s.declare(STACK_A)
        first = s.play("site.yml")
        assert first.returncode == 0, first.stdout[-4000:]
        snap = fleet.snapshot("sb1", root / "snapshot")
        fleet.down()
        fleet.up(4, [], root / "hosts.yml", snapshot=snap)
        s.declare(STACK_A)
        yield s
    finally:
        fleet.down()
        # A provisioned host's layer is 7.5 GB, and pytest keeps its last three runs' directories.
        shutil.rmtree(root / "snapshot", ignore_errors=True)


def test_a_rolling_upgrade_reaches_every_host_a_batch_at_a_time(site: Site) -> None:
    site.declare(STACK_B)
    run = site.play("upgrade.yml")
    assert run.returncode == 0, run.stdout[-4000:]
    assert "ROLLOUT SUMMARY" in run.stdout
    got = summary(site)
    assert got["stopped"] is None
    assert {h: (v["state"], v["batch"]) for h, v in got["hosts"].items()} == {
        "sb1": ("upgraded", 1),
        "sb2": ("upgraded", 2),
        "sb3": ("upgraded", 2),
        "sb4": ("upgraded", 3),
    }
    for host in ("sb1", "sb2", "sb3", "sb4"):
        assert link(host, "/usr/local/cuda") == "/usr/local/cuda-12.4"
        assert ssh(host, "gpuenv-verify >/dev/null").returncode == 0
    # The same stack again changes nothing.
    again = site.play("upgrade.yml")
    assert again.returncode == 0, again.stdout[-3000:]
    assert {v["state"] for v in summary(site)["hosts"].values()} == {"unchanged"}
    assert {h: c["changed"] for h, c in recap(again.stdout).items()} == dict.fromkeys(
        ("localhost", "sb1", "sb2", "sb3", "sb4"), 0
    )


def test_a_host_that_fails_is_put_back_and_stops_the_rollout(site: Site) -> None:
    env_before = {h: link(h, "/opt/gpuenv/envs/default") for h in ("sb3", "sb4")}
    # sb3's PyPI path is broken: its environment cannot be built once its toolkit default moved.
    site.declare(STACK_C, {"sb3": {"pytorch_env_pypi_url": f"{CACHE}/pypi/broken-path/simple"}})
    run = site.play("upgrade.yml")
    assert run.returncode != 0
    got = summary(site)
    states = {h: v["state"] for h, v in got["hosts"].items()}
    assert states == {"sb1": "upgraded", "sb2": "upgraded", "sb3": "rolled back", "sb4": "waiting"}, got
    assert "sb4" in (got["stopped"] or "")
    assert got["hosts"]["sb3"]["verify"] == "pass"
    assert "untouched: the rollout stopped before its batch" in (site.reports / "rollout/summary.md").read_text()
    # sb3 has its previous toolkit default and environment, and verify passes on them.
    assert link("sb3", "/usr/local/cuda") == "/usr/local/cuda-12.4"
    assert link("sb3", "/opt/gpuenv/envs/default") == env_before["sb3"]
    assert ssh("sb3", "gpuenv-verify >/dev/null").returncode == 0
    # The batch after it was not touched at all.
    assert link("sb4", "/usr/local/cuda") == "/usr/local/cuda-12.4"
    assert link("sb4", "/opt/gpuenv/envs/default") == env_before["sb4"]
    # The hosts that did upgrade run C.
    for host in ("sb1", "sb2"):
        assert link(host, "/usr/local/cuda") == "/usr/local/cuda-12.1"
        assert ssh(host, "/opt/gpuenv/envs/default/bin/python -c 'import einops'").returncode == 0


def test_a_host_whose_gpus_are_busy_is_refused_and_left_as_it_was(site: Site) -> None:
    # A stand-in nvidia-smi that reports a training job on the GPU (the real one finds no driver).
    shim = (
        "#!/bin/sh\n"
        'case "$*" in *--query-compute-apps*) echo "4242, python3 train.py, 1024 MiB"; exit 0;; esac\n'
        'exec /usr/bin/nvidia-smi.real "$@"\n'
    )
    h = fleet.State.load().hosts["sb4"]
    put = (
        "mv /usr/bin/nvidia-smi /usr/bin/nvidia-smi.real && cat > /usr/bin/nvidia-smi && chmod 755 /usr/bin/nvidia-smi"
    )
    placed = subprocess.run(fleet.ssh_argv(h, put), input=shim, capture_output=True, text=True, check=False)
    assert placed.returncode == 0, placed.stderr
    try:
        before = (link("sb4", "/usr/local/cuda"), link("sb4", "/opt/gpuenv/envs/default"))
        site.declare(STACK_C)
        for extra in (
            [],
            ["-e", '{"fleet_upgrade_busy": "wait", "fleet_upgrade_wait_timeout": 4, "fleet_upgrade_wait_interval": 2}'],
        ):
            run = site.play("upgrade.yml", "--limit", "sb4", *extra)
            assert run.returncode != 0
            sb4 = summary(site)["hosts"]["sb4"]
            assert sb4["state"] == "refused"
            assert "4242, python3 train.py" in sb4["note"]
            assert (link("sb4", "/usr/local/cuda"), link("sb4", "/opt/gpuenv/envs/default")) == before
    finally:
        ssh("sb4", "mv /usr/bin/nvidia-smi.real /usr/bin/nvidia-smi")


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


def test_onboarding_writes_nothing_through_links_a_member_planted(site: Site) -> None:
    """An existing account's home is the member's: links they plant there to system files must not
    make root write, or chown, what they point at (issue 17, security item 1)."""
    _, signer = _signer(site, "member")
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


GIT = ["git", "-c", "user.name=gpuenv test", "-c", "user.email=site@gpuenv.invalid"]


def _signer(site: Site, name: str) -> tuple[Path, str]:
    """An SSH signing key made for the test, and its allowed_signers line."""
    key = site.root / f"signer-{name}"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True)  # noqa: S607
    kind, blob = key.with_suffix(".pub").read_text().split()[:2]
    return key, f"site@gpuenv.invalid {kind} {blob}"


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
    key, signer = _signer(site, "site")
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
    other, _ = _signer(site, "stranger")
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
