"""How the controller reaches the hosts: the sandbox's SSH key and known hosts, SSH itself, and the
Ansible inventory that names them."""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path
from typing import Any

import yaml

from testbed.sandbox.hosts import Host, State, sandbox_dir
from testbed.sandbox.network import MIRROR_PORT, cache_url, controller_ip
from testbed.sandbox.util import SandboxError, run


def wait_ssh(host: Host, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host.ip, 22), timeout=2):
            probe = run(ssh_argv(host, "true"), capture=True, check=False, timeout=20)
            if probe.returncode == 0:
                return
        time.sleep(0.5)
    raise SandboxError(
        f"{host.name} ({host.ip}) did not answer over SSH within {timeout:.0f} s; "
        f"its console log is {host.dir() / 'console.log'}"
    )


def key_path() -> Path:
    return sandbox_dir() / "id_ed25519"


def known_hosts_path() -> Path:
    return sandbox_dir() / "known_hosts"


def ssh_options() -> list[str]:
    return [
        "-i",
        str(key_path()),
        "-o",
        f"UserKnownHostsFile={known_hosts_path()}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
    ]


def ssh_argv(host: Host, *command: str) -> list[str]:
    return ["ssh", *ssh_options(), f"root@{host.ip}", *command]


def ensure_key() -> str:
    key = key_path()
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuenv-sandbox", "-f", str(key)])
    return key.with_suffix(".pub").read_text()


def write_known_hosts(state: State) -> None:
    lines = []
    for host in state.hosts.values():
        for pub in sorted((host.root() / "etc/ssh").glob("ssh_host_*_key.pub")):
            kind, value = pub.read_text().split()[:2]
            lines.append(f"{host.ip} {kind} {value}")
    known_hosts_path().write_text("\n".join(lines) + "\n")


def inventory(state: State) -> dict[str, Any]:
    by_os: dict[str, dict[str, Any]] = {}
    for host in state.hosts.values():
        by_os.setdefault(host.os, {"hosts": {}})["hosts"][host.name] = {}
    common = " ".join(f"-o {o}" for o in (f"UserKnownHostsFile={known_hosts_path()}", "StrictHostKeyChecking=yes"))
    return {
        "all": {
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(key_path()),
                "ansible_ssh_common_args": common,
                "ansible_python_interpreter": "/usr/bin/python3",
                "gpuenv_sandbox_controller": controller_ip(),
                "gpuenv_sandbox_mirror_url": f"http://{controller_ip()}:{MIRROR_PORT}",
                "gpuenv_sandbox_cache_url": cache_url(),
                # The controller's caches of built environments and unpacked cuDNNs live as long as
                # the sandbox (`down` removes them): gigabytes each, which the machine's caches have no
                # room to keep.
                "pytorch_env_build_cache_dir": str(sandbox_dir() / "env-cache"),
                "cudnn_build_cache_dir": str(sandbox_dir() / "cudnn-cache"),
            },
            "children": {
                "gpu_hosts": {"hosts": {h.name: {"ansible_host": h.ip} for h in state.hosts.values()}, "children": {}},
                **by_os,
            },
        }
    }


def write_inventory(state: State, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    header = "# Written by `scripts/sandbox up`; removed by `down`. Do not edit: it is regenerated.\n"
    path.write_text(header + yaml.safe_dump(inventory(state), sort_keys=False))
    state.inventory = str(path)
    state.save()
