"""What of the sandbox exists, found by name alone, and `down`, which removes all of it: this works
after a crashed `up` that recorded nothing."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from testbed.sandbox.access import known_hosts_path
from testbed.sandbox.hosts import (
    INSTANCE,
    NETNS_PREFIX,
    PEER_PREFIX,
    VETH_PREFIX,
    State,
    require_root_and_tools,
    sandbox_dir,
)
from testbed.sandbox.network import BRIDGE, link_names, sandbox_rules, teardown_network
from testbed.sandbox.nspawn import stop_host
from testbed.sandbox.servers import stop_cache, stop_mirror
from testbed.sandbox.util import run


def _instance_of(proc: Path) -> str | None:
    """The sandbox instance a process was started for (its GPUENV_SANDBOX_INSTANCE, "" when unset),
    or None when its environment cannot be read (it has ended)."""
    try:
        environ = (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for entry in environ:
        if entry.startswith(b"GPUENV_SANDBOX_INSTANCE="):
            return entry.split(b"=", 1)[1].decode(errors="replace")
    return ""


def _processes() -> list[tuple[int, str]]:
    """This instance's nspawn, supervisors, the mirror's HTTP server and the download cache: (pid,
    command line). Another instance's are left alone: nspawn by its root's directory, the others by
    the instance they were started for (their command lines are the same in every instance)."""
    base = str(sandbox_dir()) + "/"
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if (base in cmdline and "systemd-nspawn" in cmdline) or (
            (
                "testbed.sandbox supervise" in cmdline
                or ("http.server" in cmdline and "gpuenv-mirror" in cmdline)
                or "testbed.sandbox.cache" in cmdline
            )
            and _instance_of(proc) == INSTANCE
        ):
            found.append((int(proc.name), cmdline))
    return found


def container_pids() -> list[tuple[int, str]]:
    """Every process inside a sandbox host: the hosts' network namespaces hold all of them, and
    a container's systemd outlives a killed nspawn (reparented, still holding mounts and inotify
    instances), so this, not nspawn's pid, is what down must end."""
    found = []
    for ns in _namespaces():
        pids = run(["ip", "netns", "pids", ns], capture=True, check=False).stdout.split()
        found += [(int(pid), ns) for pid in pids]
    return found


def _mounts() -> list[str]:
    """Mount points under the sandbox directory, deepest first (the order to unmount them)."""
    base = str(sandbox_dir()) + "/"
    points = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    return sorted((p for p in points if p.startswith(base)), key=len, reverse=True)


def _loops() -> list[str]:
    base = str(sandbox_dir()) + "/"
    listing = run(["losetup", "-a"], capture=True, check=False).stdout.splitlines()
    return [line.split(":")[0] for line in listing if base in line]


def _namespaces() -> list[str]:
    return [ns for ns in run(["ip", "netns", "list"], capture=True).stdout.split() if ns.startswith(NETNS_PREFIX)]


def _links() -> list[str]:
    return [n for n in link_names() if n == BRIDGE or n.startswith((VETH_PREFIX, PEER_PREFIX))]


def down() -> None:
    require_root_and_tools()
    state = State.load()
    stop_mirror()
    stop_cache()
    for host in state.hosts.values():
        stop_host(host)
    # What a crashed up or a lost pid file left running: first ask every nspawn for an orderly
    # shutdown, then kill what remains, the containers' own processes included.
    for pid, cmdline in _processes():
        if "systemd-nspawn" in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any("systemd-nspawn" in c for _, c in _processes()):
        time.sleep(0.3)
    for _ in range(20):
        victims = [pid for pid, _ in _processes()] + [pid for pid, _ in container_pids()]
        if not victims:
            break
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.25)
    for mnt in _mounts():
        run(["umount", "-l", mnt], capture=True, check=False)
    for loop in _loops():
        run(["losetup", "-d", loop], capture=True, check=False)
    for ns in _namespaces():
        run(["ip", "netns", "del", ns], capture=True, check=False)
    for link in _links():
        if link != BRIDGE:
            run(["ip", "link", "del", link], capture=True, check=False)
    teardown_network()
    if state.inventory:
        Path(state.inventory).unlink(missing_ok=True)
    hosts_dir = sandbox_dir() / "hosts"
    if hosts_dir.exists():
        run(["rm", "-rf", "--one-file-system", str(hosts_dir)], capture=True)
    State.path().unlink(missing_ok=True)
    known_hosts_path().unlink(missing_ok=True)
    (sandbox_dir() / "mirror.log").unlink(missing_ok=True)
    (sandbox_dir() / "cache.log").unlink(missing_ok=True)


def leftovers() -> list[str]:
    """What of the sandbox still exists on this machine (empty after a clean `down`)."""
    found = [f"process {pid}: {cmdline}" for pid, cmdline in _processes()]
    found += [f"process {pid} in network namespace {ns}" for pid, ns in container_pids()]
    found += [f"mount {m}" for m in _mounts()]
    found += [f"loop {loop}" for loop in _loops()]
    found += [f"netns {ns}" for ns in _namespaces()]
    found += [f"link {link}" for link in _links()]
    found += [f"iptables -t {table} {rule}" for table, rule in sandbox_rules()]
    if (sandbox_dir() / "hosts").exists():
        found.append(f"directory {sandbox_dir() / 'hosts'}")
    return found
