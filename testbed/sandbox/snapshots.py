"""Snapshots: a provisioned host's changes over its root, saved so that new hosts start from them (a
fleet provisioned once, booted many times), each with an identity of its own."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.sandbox.access import wait_ssh
from testbed.sandbox.hosts import State
from testbed.sandbox.nspawn import start_host, stop_host
from testbed.sandbox.util import SandboxError, run

# What makes a host itself rather than a copy: a snapshot drops these, and each host started from
# it gets its own (the marker makes customize generate them).
_IDENTITY = ("etc/ssh/ssh_host_*", "etc/machine-id", "etc/gpuenv-sandbox-host", "etc/hostname", "etc/hosts")


def snapshot(name: str, dest: Path) -> Path:
    """Save a host's changes over its root (its overlay's upper layer) as a starting point for new
    hosts: a fleet provisioned once, booted many times. The host is stopped for the copy and
    started again."""
    state = State.load()
    host = state.hosts.get(name)
    if host is None:
        raise SandboxError(f"no sandbox host {name}: scripts/sandbox status lists them")
    if ":" in host.base:
        raise SandboxError(f"{name} was itself started from a snapshot; snapshot its origin instead")
    stop_host(host)
    if dest.exists():
        run(["rm", "-rf", "--one-file-system", str(dest)], capture=True)
    dest.mkdir(parents=True)
    # cp -a keeps overlayfs's whiteouts (character devices) and opaque-directory xattrs, which
    # record what the host deleted from its root.
    run(["cp", "-a", str(host.dir() / "upper"), str(dest / "upper")], capture=True, timeout=1800)
    for pattern in _IDENTITY:
        for path in (dest / "upper").glob(pattern):
            path.unlink()
    (dest / "snapshot.json").write_text(json.dumps({"host": name, "os": host.os, "base": host.base}) + "\n")
    start_host(host)
    wait_ssh(host)
    return dest


def read_snapshot(path: Path) -> dict[str, str]:
    try:
        meta: dict[str, str] = json.loads((path / "snapshot.json").read_text())
    except (OSError, ValueError) as exc:
        raise SandboxError(
            f"{path} is not a snapshot ({exc}): make one with scripts/sandbox snapshot HOST DIR"
        ) from None
    if not Path(meta["base"]).is_dir():
        raise SandboxError(f"the root under snapshot {path} ({meta['base']}) is gone: make the snapshot again")
    return meta
