"""The controller's side of the sandbox network: a bridge, NAT to the outside, the kernel settings the
hosts need, and each host's own network namespace on the bridge. Everything carries the sandbox's
names (gpuenv-br0, gsb-*, the iptables comment), so that cleanup finds it without a record."""

from __future__ import annotations

import ipaddress
import json
import os
import re
from pathlib import Path

from testbed.sandbox.hosts import INSTANCE, PEER_PREFIX, Host, sandbox_dir
from testbed.sandbox.util import SandboxError, run

BRIDGE = f"gpuenv{INSTANCE}-br0"
RULE_COMMENT = f"gpuenv{INSTANCE}-sandbox"
SUBNET = ipaddress.ip_network(os.environ.get("GPUENV_SANDBOX_SUBNET", f"10.199.{INSTANCE or 0}.0/24"))
# Every instance's bridge, this one's included (cleanup and the kernel settings' record need them).
BRIDGE_PATTERN = re.compile(r"gpuenv[1-9]?-br0")
# The kernel settings as they were before the first sandbox changed them. One record for every
# instance, in /run: the settings are restored when the last instance goes down, and a reboot,
# which resets them, also forgets the record.
SYSCTL_RECORD = Path(os.environ.get("GPUENV_SANDBOX_SYSCTL_RECORD", "/run/gpuenv-sandbox/sysctl-before.json"))
MIRROR_PORT = 8000
# The download cache (testbed.sandbox.cache): apt's HTTP proxy and the hosts' Python package index.
CACHE_PORT = 3142
INOTIFY_INSTANCES = "/proc/sys/fs/inotify/max_user_instances"
SYSCTLS = {
    # The hosts reach Debian's archive and PyPI through the controller.
    "/proc/sys/net/ipv4/ip_forward": "1",
    # Every host's systemd takes several inotify instances, all counted against root; the kernel
    # default of 128 runs out at a few dozen hosts ("Failed to create inotify object").
    INOTIFY_INSTANCES: "8192",
}


def controller_ip() -> str:
    return str(SUBNET.network_address + 1)


def cache_url() -> str:
    return f"http://{controller_ip()}:{CACHE_PORT}"


def _iptables_rules() -> list[list[str]]:
    net = str(SUBNET)
    return [
        ["-t", "nat", "POSTROUTING", "-s", net, "!", "-o", BRIDGE, "-j", "MASQUERADE"],
        ["-t", "filter", "FORWARD", "-i", BRIDGE, "-j", "ACCEPT"],
        [
            "-t",
            "filter",
            "FORWARD",
            "-o",
            BRIDGE,
            "-m",
            "conntrack",
            "--ctstate",
            "RELATED,ESTABLISHED",
            "-j",
            "ACCEPT",
        ],
    ]


def _rule(op: str, rule: list[str]) -> list[str]:
    table, chain, spec = rule[:2], rule[2], rule[3:]
    return ["iptables", *table, op, chain, *spec, "-m", "comment", "--comment", RULE_COMMENT]


def link_exists(name: str) -> bool:
    return run(["ip", "link", "show", name], capture=True, check=False).returncode == 0


def ensure_network() -> None:
    if not link_exists(BRIDGE):
        overlap = run(["ip", "-o", "route", "show", "to", "match", str(SUBNET.network_address + 1)], capture=True)
        for line in overlap.stdout.splitlines():
            if not line.startswith("default"):
                raise SandboxError(
                    f"the sandbox subnet {SUBNET} is already routed on this machine ({line.strip()}); "
                    "set GPUENV_SANDBOX_SUBNET to a free /24"
                )
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        run(["ip", "addr", "add", f"{controller_ip()}/{SUBNET.prefixlen}", "dev", BRIDGE])
        run(["ip", "link", "set", BRIDGE, "up"])
    # The kernel settings the sandbox changes, recorded once in a file of their own (it outlives
    # a lost state.json) and restored by the last instance's down.
    before = SYSCTL_RECORD
    if not before.exists():
        before.parent.mkdir(parents=True, exist_ok=True)
        before.write_text(json.dumps({key: Path(key).read_text().strip() for key in SYSCTLS}))
    for key, value in SYSCTLS.items():
        if key != INOTIFY_INSTANCES or int(Path(key).read_text()) < int(value):
            Path(key).write_text(value + "\n")
    for rule in _iptables_rules():
        if run(_rule("-C", rule), capture=True, check=False).returncode != 0:
            run(_rule("-I", rule), capture=True)


def link_names() -> list[str]:
    """Every network link of this machine, by name (`ip -o link show`; a veth's `@peer` cut off)."""
    return [
        line.split(":")[1].strip().split("@")[0]
        for line in run(["ip", "-o", "link", "show"], capture=True).stdout.splitlines()
    ]


def other_bridges() -> list[str]:
    """The bridges of the machine's other sandbox instances that are up."""
    return [n for n in link_names() if BRIDGE_PATTERN.fullmatch(n) and n != BRIDGE]


def teardown_network() -> None:
    for rule in _iptables_rules():
        while run(_rule("-C", rule), capture=True, check=False).returncode == 0:
            run(_rule("-D", rule), capture=True)
    # Rules left by a sandbox with another subnet: any rule carrying our comment.
    for table, listed in sandbox_rules():
        run(["iptables", "-t", table, "-D", *listed.split()[1:]], capture=True, check=False)
    if link_exists(BRIDGE):
        run(["ip", "link", "del", BRIDGE])
    before = SYSCTL_RECORD
    if not before.exists():
        # Where a sandbox brought up before instances existed keeps its record.
        before = sandbox_dir() / "sysctl-before.json"
    # Another instance still forwards and runs hosts: the settings stay until it goes down too.
    if before.exists() and not other_bridges():
        for key, value in json.loads(before.read_text()).items():
            Path(key).write_text(value + "\n")
        before.unlink()


def sandbox_rules() -> list[tuple[str, str]]:
    """iptables rules carrying the sandbox's comment: (table, rule as `iptables -S` prints it)."""
    return [
        (table, line)
        for table in ("nat", "filter")
        for line in run(["iptables", "-t", table, "-S"], capture=True).stdout.splitlines()
        # The comment as a whole word: another instance's comment is another word.
        if line.startswith("-A ") and RULE_COMMENT in line.split()
    ]


def host_network(host: Host) -> None:
    if run(["ip", "netns", "list"], capture=True).stdout.split().count(host.netns) == 0:
        run(["ip", "netns", "add", host.netns])
    if not link_exists(host.veth):
        peer = f"{PEER_PREFIX}{host.index}"
        run(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", peer])
        run(["ip", "link", "set", peer, "netns", host.netns])
        run(["ip", "-n", host.netns, "link", "set", peer, "name", "eth0"])
        run(["ip", "-n", host.netns, "addr", "add", f"{host.ip}/{SUBNET.prefixlen}", "dev", "eth0"])
        run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
        run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
        run(["ip", "-n", host.netns, "route", "add", "default", "via", controller_ip()])
    run(["ip", "link", "set", host.veth, "master", BRIDGE])
    run(["ip", "link", "set", host.veth, "up"])
