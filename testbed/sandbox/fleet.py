"""The sandbox fleet: Debian hosts booted with systemd under systemd-nspawn, each in its own network
namespace on a private bridge, reached by Ansible over real SSH.

Everything the sandbox creates is named `gpuenv-*` / `gsb-*` or lives under its state directory, so
that `down` can find and remove it even after a crashed `up` that recorded nothing.

This module is the fleet's face: up, restart, status, and the names its users need from the parts,
which live beside it by concern: hosts (directories, Host, State), network (bridge, NAT, namespaces),
nspawn (a host's root and systemd), access (SSH, the inventory), servers (the mirror and the download
cache), snapshots, cleanup (down, leftovers).
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path
from typing import Any

from testbed.sandbox import roots
from testbed.sandbox.access import (
    ensure_key,
    inventory,
    key_path,
    known_hosts_path,
    ssh_argv,
    ssh_options,
    wait_ssh,
    write_inventory,
    write_known_hosts,
)
from testbed.sandbox.cleanup import container_pids, down, leftovers
from testbed.sandbox.hosts import Host, State, cache_dir, downloads_dir, require_root_and_tools, roots_dir, sandbox_dir
from testbed.sandbox.network import (
    BRIDGE,
    CACHE_PORT,
    MIRROR_PORT,
    RULE_COMMENT,
    SUBNET,
    SYSCTL_RECORD,
    SYSCTLS,
    cache_url,
    controller_ip,
    ensure_network,
    host_network,
    other_bridges,
)
from testbed.sandbox.nspawn import customize, is_running, mount_root, nspawn_argv, start_host, stop_host, supervise
from testbed.sandbox.servers import mirror_root, serve_cache, serve_mirror, stop_cache, stop_mirror
from testbed.sandbox.snapshots import read_snapshot, snapshot
from testbed.sandbox.util import SandboxError

# What the fleet's users (scripts/sandbox, faults, the mirror and channel builders, the benchmarks,
# the tests) take from it, wherever it is defined.
__all__ = [
    "BRIDGE",
    "CACHE_PORT",
    "MIRROR_PORT",
    "RULE_COMMENT",
    "SUBNET",
    "SYSCTLS",
    "SYSCTL_RECORD",
    "Host",
    "State",
    "cache_dir",
    "cache_url",
    "container_pids",
    "controller_ip",
    "down",
    "downloads_dir",
    "inventory",
    "is_running",
    "key_path",
    "known_hosts_path",
    "leftovers",
    "mirror_root",
    "nspawn_argv",
    "other_bridges",
    "restart",
    "roots_dir",
    "sandbox_dir",
    "serve_cache",
    "serve_mirror",
    "snapshot",
    "ssh_argv",
    "ssh_options",
    "start_host",
    "status",
    "stop_cache",
    "stop_host",
    "stop_mirror",
    "supervise",
    "up",
    "wait_ssh",
    "write_inventory",
]


def up(
    count: int,
    oses: list[str],
    inventory_path: Path,
    *,
    kernel: bool = False,
    kernel_hosts: tuple[str, ...] = (),
    snapshot: Path | None = None,
) -> State:
    """Boot hosts sb1..sbN (those already up stay as they are).

    kernel: the hosts' root also has Debian's kernel package installed, as a workstation's has, so
    that the driver role's full mode builds its module for it; kernel_hosts: only these hosts' (a
    fleet of workstations and containers, as molecule's nvidia_driver scenario has). snapshot: new hosts start from a
    provisioned host's saved changes (`snapshot`) over its root, each with its own identity."""
    require_root_and_tools()
    if count < 1 or count > 200:
        raise SandboxError("up takes a host count from 1 to 200")
    oses = oses or ["debian12"]
    unknown = sorted(set(kernel_hosts) - {f"sb{i}" for i in range(1, count + 1)})
    if unknown:
        raise SandboxError(f"--kernel-host names {', '.join(unknown)}, which is not among sb1..sb{count}")
    for o in oses:
        roots.release(o)
    # Absolute: the path goes into the state and the overlays, which later commands read from
    # whatever directory they run in.
    snapshot = snapshot.resolve() if snapshot else None
    snap = read_snapshot(snapshot) if snapshot else None
    state = State.load()
    pubkey = ensure_key()
    ensure_network()
    for i in range(1, count + 1):
        name = f"sb{i}"
        want_os = snap["os"] if snap else oses[min(i - 1, len(oses) - 1)]
        host = state.hosts.get(name)
        # With a snapshot, hosts already up stay as they are; only the new ones start from it.
        if host is not None and host.os != want_os and not snap:
            raise SandboxError(f"{name} already runs {host.os}, not {want_os}: run `scripts/sandbox down` first")
        if host is None:
            if snap:
                base = f"{snapshot}/upper:{snap['base']}"
            else:
                with_kernel = kernel or name in kernel_hosts
                packages = (*roots.PACKAGES, *roots.KERNEL_PACKAGES) if with_kernel else roots.PACKAGES
                base = str(roots.ensure_root(roots_dir(), roots.release(want_os), packages))
            host = Host(name=name, os=want_os, index=i, ip=str(SUBNET.network_address + 10 + i), base=base)
            state.hosts[name] = host
            state.save()
        mount_root(host)
        customize(host, pubkey)
        host_network(host)
    write_known_hosts(state)
    for host in state.hosts.values():
        start_host(host)
    for host in state.hosts.values():
        wait_ssh(host)
    serve_mirror()
    serve_cache()
    write_inventory(state, inventory_path)
    return state


def restart(host: Host) -> None:
    stop_host(host)
    mount_root(host)
    host_network(host)
    start_host(host)
    wait_ssh(host)


def status() -> list[dict[str, Any]]:
    state = State.load()
    rows = []
    for host in state.hosts.values():
        running = is_running(host)
        reachable = False
        if running:
            with contextlib.suppress(OSError), socket.create_connection((host.ip, 22), timeout=1):
                reachable = True
        rows.append(
            {
                "name": host.name,
                "os": host.os,
                "ip": host.ip,
                "running": running,
                "ssh": reachable,
                "faults": host.faults,
                "disks": [d["path"] for d in host.disks],
            }
        )
    return rows
