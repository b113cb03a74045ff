"""Fault injection on sandbox hosts, for tests of what gpuenv does when things go wrong."""

from __future__ import annotations

import re
from pathlib import Path

from testbed.sandbox.fleet import RULE_COMMENT, Host, State, is_running, restart, stop_host
from testbed.sandbox.util import SandboxError, run


def _host(state: State, name: str) -> Host:
    host = state.hosts.get(name)
    if host is None:
        known = ", ".join(state.hosts) or "none (run `scripts/sandbox up N` first)"
        raise SandboxError(f"no sandbox host named {name!r}; hosts: {known}")
    return host


def _mark(name: str, fault: str, on: bool) -> Host:
    """Record (or clear) a fault on the host under the state's lock; the host as recorded."""
    with State.edit() as state:
        host = _host(state, name)
        if on and fault not in host.faults:
            host.faults.append(fault)
        if not on and fault in host.faults:
            host.faults.remove(fault)
    return host


def stop(name: str) -> None:
    """Power the host off (its disk and network stay): unreachable until `start`."""
    stop_host(_host(State.load(), name))
    _mark(name, "stopped", True)


def start(name: str) -> None:
    restart(_host(State.load(), name))
    _mark(name, "stopped", False)


def cut(name: str) -> None:
    """Take the host's link down: packets are lost, connections time out."""
    run(["ip", "link", "set", _host(State.load(), name).veth, "down"])
    _mark(name, "cut", True)


def _block_rule(host: Host, port: int) -> list[str]:
    # The mirror and the download cache listen on the controller's bridge address: INPUT. The
    # sandbox's comment lets `down` remove a rule a failed test left.
    return ["INPUT", "-s", host.ip, "-p", "tcp", "--dport", str(port), "-j", "DROP",
            "-m", "comment", "--comment", RULE_COMMENT]  # fmt: skip


def block(name: str, port: int) -> None:
    """Drop what the host sends to one of the controller's ports (the mirror's 8000, the download
    cache's 3142): that server is out of reach, as a mirror behind a broken route is, while SSH works."""
    if not 1 <= port <= 65535:
        raise SandboxError(f"port {port}: give a TCP port, e.g. 8000 (the mirror) or 3142 (the download cache)")
    with State.edit() as state:
        host = _host(state, name)
        if f"block:{port}" not in host.faults:
            run(["iptables", "-I", *_block_rule(host, port)])
            host.faults.append(f"block:{port}")


def slow(name: str, rate: str = "1mbit") -> None:
    """Limit what the host receives to `rate` (tc tbf on the controller's end of its link)."""
    if not re.fullmatch(r"[0-9]+(kbit|mbit|gbit)", rate):
        raise SandboxError(f"rate {rate!r}: write it as tc does, e.g. 512kbit or 2mbit")
    tbf = ["tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
    run(["tc", "qdisc", "replace", "dev", _host(State.load(), name).veth, "root", *tbf], capture=True)
    _mark(name, f"slow:{rate}", True)


def disk(name: str, path: str, size_mb: int) -> None:
    """Give the host a small ext4 disk of `size_mb` MiB at `path` (restarts the host to mount it)."""
    if not path.startswith("/") or path == "/":
        raise SandboxError(f"disk path {path!r}: give an absolute directory inside the host, e.g. /opt/gpuenv")
    if not 8 <= size_mb <= 65536:
        raise SandboxError("disk size: from 8 to 65536 MiB")
    with State.edit() as state:
        host = _host(state, name)
        slug = path.strip("/").replace("/", "_")
        image = host.dir() / f"disk-{slug}.img"
        mount = host.dir() / "disks" / slug
        with image.open("wb") as f:
            f.truncate(size_mb * 1024 * 1024)
        run(["mkfs.ext4", "-q", "-F", str(image)], capture=True)
        host.disks = [d for d in host.disks if d["path"] != path]
        host.disks.append({"path": path, "image": str(image), "mount": str(mount), "size_mb": str(size_mb)})
        (host.root() / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    restart(host)


def restore(name: str) -> None:
    """Undo every fault on the host: link up, no rate limit, no small disks, running."""
    with State.edit() as state:
        host = _host(state, name)
        run(["ip", "link", "set", host.veth, "up"])
        run(["tc", "qdisc", "del", "dev", host.veth, "root"], capture=True, check=False)
        for fault in host.faults:
            if fault.startswith("block:"):
                run(["iptables", "-D", *_block_rule(host, int(fault.split(":", 1)[1]))], capture=True, check=False)
        needs_restart = bool(host.disks) or "stopped" in host.faults or not is_running(host)
        for d in host.disks:
            run(["umount", "-l", d["mount"]], capture=True, check=False)
            Path(d["image"]).unlink(missing_ok=True)
        host.disks = []
        host.faults = []
    if needs_restart:
        restart(host)
