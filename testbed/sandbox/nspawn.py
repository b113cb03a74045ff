"""A host's root and its systemd under systemd-nspawn: the overlay over a cached Debian root, what
makes the copy a host of its own (name, keys, the controller's proxies and CAs), and the supervisor
that boots it again when it asks for a reboot."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from testbed.sandbox.hosts import Host, State
from testbed.sandbox.network import cache_url, controller_ip
from testbed.sandbox.util import run

# systemd-nspawn's exit status when the container asked for a reboot (systemd-nspawn(1)).
REBOOT_EXIT = 133


def _mounted(path: Path) -> bool:
    return any(line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines())


def mount_root(host: Host) -> None:
    d = host.dir()
    for sub in ("upper", "work", "root"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    if not _mounted(host.root()):
        run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={host.base},upperdir={d / 'upper'},workdir={d / 'work'}",
                str(host.root()),
            ]
        )
    for disk in host.disks:
        mnt = Path(disk["mount"])
        if not _mounted(mnt):
            mnt.mkdir(parents=True, exist_ok=True)
            run(["mount", "-o", "loop", disk["image"], str(mnt)])


def _controller_extra_cas(host_root: Path) -> list[str]:
    """Certificates the controller trusts that the host's bundle lacks (e.g. a TLS proxy's CA)."""

    def certs(path: Path) -> list[str]:
        if not path.exists():
            return []
        text = path.read_text()
        out, current = [], []
        for line in text.splitlines():
            current.append(line)
            if line.startswith("-----END CERTIFICATE-----"):
                out.append("\n".join(c for c in current if not c.startswith("#")).strip() + "\n")
                current = []
        return out

    have = set(certs(host_root / "etc/ssl/certs/ca-certificates.crt"))
    return [c for c in certs(Path("/etc/ssl/certs/ca-certificates.crt")) if c not in have]


def customize(host: Host, pubkey: str) -> None:
    root = host.root()
    marker = root / "etc/gpuenv-sandbox-host"
    (root / "etc/hostname").write_text(host.name + "\n")
    (root / "etc/hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {host.name}\n{controller_ip()} controller\n")
    resolv = Path("/etc/resolv.conf").read_text()
    (root / "etc/resolv.conf").unlink(missing_ok=True)
    (root / "etc/resolv.conf").write_text(resolv)
    # Every host fetches Debian's packages and PyPI's files through the controller's download
    # cache, as a site's hosts go through its apt and PyPI proxies: N hosts, one upstream fetch.
    # The controller's own servers (the mirror) are reached directly: the cache forwards only to
    # Debian's archive, never to an address of the controller's networks.
    (root / "etc/apt/apt.conf.d/00gpuenv-sandbox-cache").write_text(
        f'Acquire::http::Proxy "{cache_url()}/";\nAcquire::http::Proxy::{controller_ip()} "DIRECT";\n'
    )
    (root / "etc/pip.conf").write_text(
        f"[global]\nindex-url = {cache_url()}/pypi/simple\ntrusted-host = {controller_ip()}\n"
    )
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(pubkey)
    (ssh_dir / "authorized_keys").chmod(0o600)
    if marker.exists():
        return
    (root / "etc/machine-id").write_text(secrets.token_hex(16) + "\n")
    run(["ssh-keygen", "-A", "-f", str(root)], capture=True)
    (root / "etc/ssh/sshd_config.d").mkdir(exist_ok=True)
    (root / "etc/ssh/sshd_config.d/gpuenv-sandbox.conf").write_text(
        "PasswordAuthentication no\nPermitRootLogin prohibit-password\nUseDNS no\n"
    )
    extra = _controller_extra_cas(root)
    if extra:
        ca_dir = root / "usr/local/share/ca-certificates/gpuenv-controller"
        ca_dir.mkdir(parents=True, exist_ok=True)
        for i, cert in enumerate(extra):
            (ca_dir / f"controller-{i:03d}.crt").write_text(cert)
        run(["chroot", str(root), "update-ca-certificates"], capture=True)
    marker.write_text(f"{host.os}\n")


def pid_of(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if pid_alive(pid) else None


def nspawn_argv(host: Host) -> list[str]:
    argv = [
        "systemd-nspawn",
        "--quiet",
        "--boot",
        "--directory",
        str(host.root()),
        "--register=no",
        "--keep-unit",
        f"--network-namespace-path=/run/netns/{host.netns}",
        f"--machine={host.name}",
        f"--hostname={host.name}",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
        "--console=passive",
    ]
    argv += [f"--bind={d['mount']}:{d['path']}" for d in host.disks]
    return argv


def supervise(name: str) -> int:
    """Run a host's systemd-nspawn until it exits for a reason other than a reboot request."""
    host = State.load().hosts[name]
    while True:
        proc = subprocess.Popen(nspawn_argv(host))  # noqa: S603
        (host.dir() / "nspawn.pid").write_text(str(proc.pid))
        code = proc.wait()
        if code != REBOOT_EXIT:
            return code


def start_host(host: Host) -> None:
    if pid_of(host.dir() / "supervisor.pid"):
        return
    logfile = (host.dir() / "console.log").open("ab")
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "testbed.sandbox", "supervise", host.name],
        stdin=subprocess.DEVNULL,
        stdout=logfile,
        stderr=logfile,
        start_new_session=True,
    )
    (host.dir() / "supervisor.pid").write_text(str(proc.pid))


def stop_host(host: Host, timeout: float = 30) -> None:
    supervisor = pid_of(host.dir() / "supervisor.pid")
    nspawn = pid_of(host.dir() / "nspawn.pid")
    if nspawn:
        # SIGTERM asks nspawn for an orderly shutdown of the container's systemd.
        with contextlib.suppress(ProcessLookupError):
            os.kill(nspawn, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (pid_of(host.dir() / "nspawn.pid") or pid_of(host.dir() / "supervisor.pid")):
        time.sleep(0.3)
    for pid in (nspawn, supervisor):
        if pid and pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for f in ("nspawn.pid", "supervisor.pid"):
        (host.dir() / f).unlink(missing_ok=True)


def is_running(host: Host) -> bool:
    return pid_of(host.dir() / "supervisor.pid") is not None


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie: a supervisor started by this process stays a zombie until reaped."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
