"""What the sandbox is made of: its directories, its hosts and the state that records them (what
every other part of the fleet reads), and what it needs from this machine."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.sandbox.util import SandboxError


def _instance() -> str:
    """GPUENV_SANDBOX_INSTANCE: unset for the machine's sandbox, or 1 to 9 for another one beside it
    (scripts/test runs the molecule scenarios in sandbox 1 while the fleet tests use the first).
    Each instance has its own directory, subnet, bridge, names and firewall comment, so that one's
    `down` never touches the other's hosts; the caches (roots, mirror, downloads) are shared."""
    value = os.environ.get("GPUENV_SANDBOX_INSTANCE", "")
    if value not in ("", *"123456789"):
        raise SandboxError(f"GPUENV_SANDBOX_INSTANCE={value!r}: leave it unset, or give a digit from 1 to 9")
    return value


INSTANCE = _instance()
# Each name of an instance starts with a prefix none of another instance's starts with (gpuenv- is
# not a prefix of gpuenv1-), because cleanup finds what to remove by these prefixes alone.
NETNS_PREFIX = f"gpuenv{INSTANCE}-"
VETH_PREFIX = f"gsb{INSTANCE}-"
# The veth's other end, named so until it is moved into the host's namespace and renamed eth0.
PEER_PREFIX = f"gsbc{INSTANCE}-"


def sandbox_dir() -> Path:
    default = f"/var/lib/gpuenv/sandbox{INSTANCE}" if INSTANCE else "/var/lib/gpuenv/sandbox"
    return Path(os.environ.get("GPUENV_SANDBOX_DIR", default))


def cache_dir() -> Path:
    return Path(os.environ.get("GPUENV_CACHE", "/var/cache/gpuenv"))


def roots_dir() -> Path:
    """Where the built Debian roots are cached; GPUENV_SANDBOX_ROOTS picks another (a test builds a
    new root there without touching the cached ones)."""
    return Path(os.environ.get("GPUENV_SANDBOX_ROOTS", str(cache_dir() / "roots")))


def downloads_dir() -> Path:
    """Where the download cache keeps its files; GPUENV_SANDBOX_DOWNLOADS picks another (the
    benchmarks start from an empty one to count what a cold fleet fetches)."""
    return Path(os.environ.get("GPUENV_SANDBOX_DOWNLOADS", str(cache_dir() / "downloads")))


@dataclass
class Host:
    name: str
    os: str
    index: int
    ip: str
    base: str
    disks: list[dict[str, str]] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)

    @property
    def netns(self) -> str:
        return f"{NETNS_PREFIX}{self.name}"

    @property
    def veth(self) -> str:
        return f"{VETH_PREFIX}{self.index}"

    def dir(self) -> Path:
        return sandbox_dir() / "hosts" / self.name

    def root(self) -> Path:
        return self.dir() / "root"


@dataclass
class State:
    hosts: dict[str, Host] = field(default_factory=dict)
    inventory: str | None = None

    @staticmethod
    def path() -> Path:
        return sandbox_dir() / "state.json"

    @classmethod
    def load(cls) -> State:
        path = cls.path()
        if not path.exists():
            return cls()
        raw = json.loads(path.read_text())
        return cls(
            hosts={name: Host(**h) for name, h in raw.get("hosts", {}).items()},
            inventory=raw.get("inventory"),
        )

    @classmethod
    @contextlib.contextmanager
    def edit(cls) -> Iterator[State]:
        """The state loaded, changed by the caller and saved, under an exclusive lock: fault commands
        for different hosts run at once (the fleet tests inject faults on four hosts side by side),
        and two load-change-save passes without it lose one of the changes (a fault whose mark is
        lost is never restored). Nothing is saved when the caller raises."""
        path = cls.path()
        path.parent.mkdir(parents=True, exist_ok=True)
        with (path.parent / "state.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = cls.load()
            yield state
            state.save()

    def save(self) -> None:
        path = self.path()
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "hosts": {n: asdict(h) for n, h in self.hosts.items()},
            "inventory": self.inventory,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(path)


def require_root_and_tools() -> None:
    if os.geteuid() != 0:
        raise SandboxError("the sandbox needs root (network namespaces, mounts, systemd-nspawn): run it as root")
    missing = [
        t
        for t in ("debootstrap", "systemd-nspawn", "ip", "iptables", "ssh", "ssh-keygen", "mount")
        if shutil.which(t) is None
    ]
    if missing:
        raise SandboxError(f"missing {', '.join(missing)}: run ./scripts/setup, which installs the sandbox's packages")
