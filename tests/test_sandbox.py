"""The sandbox fleet for real: Debian hosts under systemd-nspawn, reached over SSH by Ansible.

Needs root (network namespaces, mounts); the first run builds the Debian roots (about a minute each),
later runs reuse them from the cache.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.sandbox import faults, fleet, mirror
from tests.conftest import run_tool

REPO = Path(__file__).resolve().parents[1]
SYSCTLS_BEFORE: dict[str, str] = {}

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root (network namespaces, mounts, nspawn)"),
]


def _ansible(venv_env: dict[str, str], inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_tool("ansible", "all", "-i", str(inventory), *args, env=venv_env, timeout=600)


def _ssh(host: fleet.Host, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(fleet.ssh_argv(host, command), capture_output=True, text=True, check=False, timeout=timeout)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[fleet.State, Path]]:
    inventory = tmp_path_factory.mktemp("sandbox") / "hosts.yml"
    fleet.down()  # a sandbox left by an interrupted run would otherwise be reused
    # Only when no other sandbox instance is up (scripts/test's molecule lane runs one beside) are
    # the kernel's settings still those from before any sandbox.
    if not fleet.other_bridges():
        SYSCTLS_BEFORE.update({key: Path(key).read_text().strip() for key in fleet.SYSCTLS})
    state = fleet.up(2, ["debian12", "debian13"], inventory)
    try:
        yield state, inventory
    finally:
        fleet.down()


def test_hosts_answer_ansible_over_ssh(sandbox: tuple[fleet.State, Path], venv_env: dict[str, str]) -> None:
    _, inventory = sandbox
    ping = _ansible(venv_env, inventory, "-m", "ansible.builtin.ping")
    assert ping.returncode == 0, ping.stdout + ping.stderr
    facts = _ansible(
        venv_env, inventory, "-m", "ansible.builtin.setup", "-a", "gather_subset=!all,!min,distribution", "--one-line"
    )
    assert facts.returncode == 0, facts.stdout
    by_host = {
        line.split(" | ")[0]: json.loads(line.split(" => ", 1)[1])
        for line in facts.stdout.splitlines()
        if " => " in line
    }
    versions = {h: f["ansible_facts"]["ansible_distribution_major_version"] for h, f in by_host.items()}
    assert versions == {"sb1": "12", "sb2": "13"}


def test_hosts_boot_systemd_and_trust_the_controllers_cas(sandbox: tuple[fleet.State, Path]) -> None:
    state, _ = sandbox
    for host in state.hosts.values():
        running = _ssh(host, "systemctl is-system-running --wait")
        assert running.stdout.strip() in {"running", "degraded"}, running.stdout
        # PyPI through this machine's TLS-intercepting proxy only works with the controller's CAs.
        pypi = _ssh(host, "curl -sS -o /dev/null -w '%{http_code}' https://pypi.org/simple/pip/", timeout=60)
        assert pypi.stdout == "200", pypi.stderr


def test_reboot_through_ansible_comes_back(sandbox: tuple[fleet.State, Path], venv_env: dict[str, str]) -> None:
    state, inventory = sandbox
    host = state.hosts["sb2"]
    assert _ssh(host, "touch /run/gpuenv-before-reboot").returncode == 0
    reboot = _ansible(venv_env, inventory, "--limit", "sb2", "-m", "ansible.builtin.reboot", "-a", "reboot_timeout=180")
    assert reboot.returncode == 0, reboot.stdout + reboot.stderr
    assert "rebooted: true" in reboot.stdout
    # /run is a fresh tmpfs after a boot: the marker is gone only if the host really restarted.
    assert _ssh(host, "test -e /run/gpuenv-before-reboot").returncode == 1


def test_faults_small_disk_cut_link_and_stop(sandbox: tuple[fleet.State, Path]) -> None:
    state, _ = sandbox
    host = state.hosts["sb1"]
    faults.disk("sb1", "/opt/gpuenv", 16)
    full = _ssh(host, "dd if=/dev/zero of=/opt/gpuenv/fill bs=1M count=64")
    assert full.returncode != 0
    assert "No space left on device" in full.stderr
    faults.cut("sb1")
    assert _ssh(host, "true", timeout=20).returncode == 255
    faults.restore("sb1")
    assert _ssh(host, "test -e /opt/gpuenv/fill || echo gone").stdout.strip() == "gone"
    faults.stop("sb1")
    assert fleet.status()[0]["running"] is False
    faults.start("sb1")
    assert _ssh(host, "true").returncode == 0


def test_hosts_fetch_from_the_mirror_over_http(sandbox: tuple[fleet.State, Path]) -> None:
    state, _ = sandbox
    site = mirror.default_site()
    mirror.build(site, mirror.default_wheels())
    manifest = site / "compute/cuda/redist/redistrib_12.4.1.json"
    entry = json.loads(manifest.read_text())["cuda_cudart"]["linux-x86_64"]
    url = f"http://{fleet.controller_ip()}:{fleet.MIRROR_PORT}/compute/cuda/redist/{entry['relative_path']}"
    got = _ssh(state.hosts["sb2"], f"curl -sSf {url} | sha256sum", timeout=60)
    assert got.stdout.split()[0] == entry["sha256"], got.stderr


def test_hosts_fetch_debian_and_pypi_through_the_download_cache(sandbox: tuple[fleet.State, Path]) -> None:
    """apt goes through the controller's cache as its HTTP proxy, and a package fetched twice is
    fetched from Debian once; PyPI's pages point at the cache, whose file is PyPI's own."""
    state, _ = sandbox
    host = state.hosts["sb1"]
    got = _ssh(host, "cd /tmp && apt-get update -qq && apt-get download -q hello && apt-get download -q hello", 300)
    assert got.returncode == 0, got.stderr
    log = (fleet.downloads_dir() / "upstream.jsonl").read_text().splitlines()
    fetched = [json.loads(line)["url"] for line in log if "/hello_" in line]
    assert len(fetched) <= 1  # once, or never when an earlier run on this machine cached it
    assert list(fleet.downloads_dir().glob("http/deb.debian.org/debian/pool/main/h/hello/hello_*.deb"))
    page = _ssh(host, f"curl -sSf {fleet.cache_url()}/pypi/simple/six/", 60)
    assert page.returncode == 0, page.stderr
    links = re.findall(r'href="([^"]+six-1\.16\.0-py2\.py3-none-any\.whl)#sha256=([0-9a-f]{64})"', page.stdout)
    assert links, page.stdout[:500]
    url, sha = links[0]
    assert url.startswith(f"{fleet.cache_url()}/pypi/files/")
    wheel = _ssh(host, f"curl -sSf {url} | sha256sum", 60)
    assert wheel.stdout.split()[0] == sha


def test_a_snapshot_starts_new_hosts_with_their_own_identity(sandbox: tuple[fleet.State, Path], tmp_path: Path) -> None:
    state, inventory = sandbox
    sb1 = state.hosts["sb1"]
    made = _ssh(sb1, "echo provisioned > /opt/gpuenv-snapshot-marker && rm /etc/motd")
    assert made.returncode == 0, made.stderr
    snap = fleet.snapshot("sb1", tmp_path / "snap")
    assert _ssh(sb1, "true").returncode == 0  # the origin runs again
    fleet.up(3, [], inventory, snapshot=snap)
    new = fleet.State.load().hosts["sb3"]
    assert new.os == "debian12"
    # What sb1 added and what it deleted (an overlayfs whiteout) both carry over.
    seen = _ssh(new, "cat /opt/gpuenv-snapshot-marker; test -e /etc/motd && echo motd; hostname")
    assert seen.stdout.split() == ["provisioned", "sb3"], seen.stdout + seen.stderr
    ident = "cat /etc/machine-id /etc/ssh/ssh_host_ed25519_key.pub"
    assert _ssh(new, ident).stdout != _ssh(sb1, ident).stdout
    assert fleet.State.load().hosts["sb2"].os == "debian13"  # the hosts already up are untouched


def test_down_after_a_crashed_up_leaves_nothing(sandbox: tuple[fleet.State, Path]) -> None:
    assert fleet.leftovers()  # the fixture's fleet is up
    inside = [pid for pid, _ in fleet.container_pids()]
    assert inside  # the hosts' systemd and sshd
    # A crashed `up` may have recorded nothing: down must find everything by name alone, the
    # containers' own processes included (a killed nspawn leaves its container's systemd running).
    fleet.State.path().unlink()
    recorded = json.loads(fleet.SYSCTL_RECORD.read_text())
    if SYSCTLS_BEFORE:
        assert recorded == SYSCTLS_BEFORE
    fleet.down()
    assert fleet.leftovers() == []
    alive = [pid for pid in inside if Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)]
    assert alive == []
    now = {key: Path(key).read_text().strip() for key in fleet.SYSCTLS}
    if fleet.other_bridges():
        # Another instance still forwards its hosts' traffic: the settings stay, with their record,
        # until the last instance goes down.
        for key, value in fleet.SYSCTLS.items():
            assert int(now[key]) >= int(value), key
        assert fleet.SYSCTL_RECORD.exists()
    else:
        assert now == recorded
        assert not fleet.SYSCTL_RECORD.exists()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
