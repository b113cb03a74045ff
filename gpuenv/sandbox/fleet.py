"""The sandbox fleet: Debian hosts booted with systemd under systemd-nspawn, each in its own network
namespace on a private bridge, reached by Ansible over real SSH.

Everything the sandbox creates is named `gpuenv-*` / `gsb-*` or lives under its state directory, so
that `down` can find and remove it even after a crashed `up` that recorded nothing.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuenv.sandbox import cache, roots
from gpuenv.sandbox.util import SandboxError, run

BRIDGE = "gpuenv-br0"
NETNS_PREFIX = "gpuenv-"
VETH_PREFIX = "gsb-"
RULE_COMMENT = "gpuenv-sandbox"
SUBNET = ipaddress.ip_network(os.environ.get("GPUENV_SANDBOX_SUBNET", "10.199.0.0/24"))
MIRROR_PORT = 8000
# The download cache (gpuenv.sandbox.cache): apt's HTTP proxy and the hosts' Python package index.
CACHE_PORT = 3142
INOTIFY_INSTANCES = "/proc/sys/fs/inotify/max_user_instances"
SYSCTLS = {
    # The hosts reach Debian's archive and PyPI through the controller.
    "/proc/sys/net/ipv4/ip_forward": "1",
    # Every host's systemd takes several inotify instances, all counted against root; the kernel
    # default of 128 runs out at a few dozen hosts ("Failed to create inotify object").
    INOTIFY_INSTANCES: "8192",
}
# systemd-nspawn's exit status when the container asked for a reboot (systemd-nspawn(1)).
REBOOT_EXIT = 133


def sandbox_dir() -> Path:
    return Path(os.environ.get("GPUENV_SANDBOX_DIR", "/var/lib/gpuenv/sandbox"))


def cache_dir() -> Path:
    return Path(os.environ.get("GPUENV_CACHE", "/var/cache/gpuenv"))


def roots_dir() -> Path:
    """Where the built Debian roots are cached; GPUENV_SANDBOX_ROOTS picks another (a test builds a
    new root there without touching the cached ones)."""
    return Path(os.environ.get("GPUENV_SANDBOX_ROOTS", str(cache_dir() / "roots")))


def controller_ip() -> str:
    return str(SUBNET.network_address + 1)


def cache_url() -> str:
    return f"http://{controller_ip()}:{CACHE_PORT}"


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


# --- preconditions -------------------------------------------------------------------------------
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


# --- controller network --------------------------------------------------------------------------
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


def _link_exists(name: str) -> bool:
    return run(["ip", "link", "show", name], capture=True, check=False).returncode == 0


def ensure_network() -> None:
    if not _link_exists(BRIDGE):
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
    # a lost state.json) and restored by down.
    before = _sysctl_before_path()
    if not before.exists():
        before.write_text(json.dumps({key: Path(key).read_text().strip() for key in SYSCTLS}))
    for key, value in SYSCTLS.items():
        if key != INOTIFY_INSTANCES or int(Path(key).read_text()) < int(value):
            Path(key).write_text(value + "\n")
    for rule in _iptables_rules():
        if run(_rule("-C", rule), capture=True, check=False).returncode != 0:
            run(_rule("-I", rule), capture=True)


def _sysctl_before_path() -> Path:
    return sandbox_dir() / "sysctl-before.json"


def teardown_network() -> None:
    for rule in _iptables_rules():
        while run(_rule("-C", rule), capture=True, check=False).returncode == 0:
            run(_rule("-D", rule), capture=True)
    # Rules left by a sandbox with another subnet: any rule carrying our comment.
    for table, listed in _rules():
        run(["iptables", "-t", table, "-D", *listed.split()[1:]], capture=True, check=False)
    if _link_exists(BRIDGE):
        run(["ip", "link", "del", BRIDGE])
    before = _sysctl_before_path()
    if before.exists():
        for key, value in json.loads(before.read_text()).items():
            Path(key).write_text(value + "\n")
        before.unlink()


def _host_network(host: Host) -> None:
    if run(["ip", "netns", "list"], capture=True).stdout.split().count(host.netns) == 0:
        run(["ip", "netns", "add", host.netns])
    if not _link_exists(host.veth):
        peer = f"gsbc-{host.index}"
        run(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", peer])
        run(["ip", "link", "set", peer, "netns", host.netns])
        run(["ip", "-n", host.netns, "link", "set", peer, "name", "eth0"])
        run(["ip", "-n", host.netns, "addr", "add", f"{host.ip}/{SUBNET.prefixlen}", "dev", "eth0"])
        run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
        run(["ip", "-n", host.netns, "link", "set", "lo", "up"])
        run(["ip", "-n", host.netns, "route", "add", "default", "via", controller_ip()])
    run(["ip", "link", "set", host.veth, "master", BRIDGE])
    run(["ip", "link", "set", host.veth, "up"])


# --- host filesystem -----------------------------------------------------------------------------
def _mounted(path: Path) -> bool:
    return any(line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines())


def _mount_root(host: Host) -> None:
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


def _customize(host: Host, pubkey: str) -> None:
    root = host.root()
    marker = root / "etc/gpuenv-sandbox-host"
    (root / "etc/hostname").write_text(host.name + "\n")
    (root / "etc/hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {host.name}\n{controller_ip()} controller\n")
    resolv = Path("/etc/resolv.conf").read_text()
    (root / "etc/resolv.conf").unlink(missing_ok=True)
    (root / "etc/resolv.conf").write_text(resolv)
    # Every host fetches Debian's packages and PyPI's files through the controller's download
    # cache, as a site's hosts go through its apt and PyPI proxies: N hosts, one upstream fetch.
    (root / "etc/apt/apt.conf.d/00gpuenv-sandbox-cache").write_text(f'Acquire::http::Proxy "{cache_url()}/";\n')
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


# --- host processes ------------------------------------------------------------------------------
def _pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


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
    if _pid(host.dir() / "supervisor.pid"):
        return
    logfile = (host.dir() / "console.log").open("ab")
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "gpuenv.sandbox", "supervise", host.name],
        stdin=subprocess.DEVNULL,
        stdout=logfile,
        stderr=logfile,
        start_new_session=True,
    )
    (host.dir() / "supervisor.pid").write_text(str(proc.pid))


def stop_host(host: Host, timeout: float = 30) -> None:
    supervisor = _pid(host.dir() / "supervisor.pid")
    nspawn = _pid(host.dir() / "nspawn.pid")
    if nspawn:
        # SIGTERM asks nspawn for an orderly shutdown of the container's systemd.
        with contextlib.suppress(ProcessLookupError):
            os.kill(nspawn, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (_pid(host.dir() / "nspawn.pid") or _pid(host.dir() / "supervisor.pid")):
        time.sleep(0.3)
    for pid in (nspawn, supervisor):
        if pid and _pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for f in ("nspawn.pid", "supervisor.pid"):
        (host.dir() / f).unlink(missing_ok=True)


def is_running(host: Host) -> bool:
    return _pid(host.dir() / "supervisor.pid") is not None


def _pid_alive(pid: int) -> bool:
    """Alive and not a zombie: a supervisor started by this process stays a zombie until reaped."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


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


def _ensure_key() -> str:
    key = key_path()
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuenv-sandbox", "-f", str(key)])
    return key.with_suffix(".pub").read_text()


def _write_known_hosts(state: State) -> None:
    lines = []
    for host in state.hosts.values():
        for pub in sorted((host.root() / "etc/ssh").glob("ssh_host_*_key.pub")):
            kind, value = pub.read_text().split()[:2]
            lines.append(f"{host.ip} {kind} {value}")
    known_hosts_path().write_text("\n".join(lines) + "\n")


# --- inventory -----------------------------------------------------------------------------------
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


# --- public operations ---------------------------------------------------------------------------
def up(
    count: int,
    oses: list[str],
    inventory_path: Path,
    *,
    kernel: bool = False,
    snapshot: Path | None = None,
) -> State:
    """Boot hosts sb1..sbN (those already up stay as they are).

    kernel: the hosts' root also has Debian's kernel package installed, as a workstation's has, so
    that the driver role's full mode builds its module for it. snapshot: new hosts start from a
    provisioned host's saved changes (`snapshot`) over its root, each with its own identity."""
    require_root_and_tools()
    if count < 1 or count > 200:
        raise SandboxError("up takes a host count from 1 to 200")
    oses = oses or ["debian12"]
    for o in oses:
        roots.release(o)
    # Absolute: the path goes into the state and the overlays, which later commands read from
    # whatever directory they run in.
    snapshot = snapshot.resolve() if snapshot else None
    snap = _read_snapshot(snapshot) if snapshot else None
    state = State.load()
    pubkey = _ensure_key()
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
                packages = (*roots.PACKAGES, *roots.KERNEL_PACKAGES) if kernel else roots.PACKAGES
                base = str(roots.ensure_root(roots_dir(), roots.release(want_os), packages))
            host = Host(name=name, os=want_os, index=i, ip=str(SUBNET.network_address + 10 + i), base=base)
            state.hosts[name] = host
            state.save()
        _mount_root(host)
        _customize(host, pubkey)
        _host_network(host)
    _write_known_hosts(state)
    for host in state.hosts.values():
        start_host(host)
    for host in state.hosts.values():
        wait_ssh(host)
    serve_mirror()
    serve_cache()
    write_inventory(state, inventory_path)
    return state


# What makes a host itself rather than a copy: a snapshot drops these, and each host started from
# it gets its own (the marker makes _customize generate them).
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


def _read_snapshot(path: Path) -> dict[str, str]:
    try:
        meta: dict[str, str] = json.loads((path / "snapshot.json").read_text())
    except (OSError, ValueError) as exc:
        raise SandboxError(
            f"{path} is not a snapshot ({exc}): make one with scripts/sandbox snapshot HOST DIR"
        ) from None
    if not Path(meta["base"]).is_dir():
        raise SandboxError(f"the root under snapshot {path} ({meta['base']}) is gone: make the snapshot again")
    return meta


def restart(host: Host) -> None:
    stop_host(host)
    _mount_root(host)
    _host_network(host)
    start_host(host)
    wait_ssh(host)


# --- what of the sandbox exists, found by name alone (works after a crashed up) -----------------
def _processes() -> list[tuple[int, str]]:
    """nspawn, supervisors, the mirror's HTTP server and the download cache: (pid, command line)."""
    base = str(sandbox_dir())
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if (
            (base in cmdline and "systemd-nspawn" in cmdline)
            or "gpuenv.sandbox supervise" in cmdline
            or ("http.server" in cmdline and "gpuenv-mirror" in cmdline)
            or "gpuenv.sandbox.cache" in cmdline
        ):
            found.append((int(proc.name), cmdline))
    return found


def _container_pids() -> list[tuple[int, str]]:
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
    base = str(sandbox_dir())
    listing = run(["losetup", "-a"], capture=True, check=False).stdout.splitlines()
    return [line.split(":")[0] for line in listing if base in line]


def _namespaces() -> list[str]:
    return [ns for ns in run(["ip", "netns", "list"], capture=True).stdout.split() if ns.startswith(NETNS_PREFIX)]


def _links() -> list[str]:
    names = [
        line.split(":")[1].strip().split("@")[0]
        for line in run(["ip", "-o", "link", "show"], capture=True).stdout.splitlines()
    ]
    return [n for n in names if n == BRIDGE or n.startswith((VETH_PREFIX, "gsbc-"))]


def _rules() -> list[tuple[str, str]]:
    """iptables rules carrying the sandbox's comment: (table, rule as `iptables -S` prints it)."""
    return [
        (table, line)
        for table in ("nat", "filter")
        for line in run(["iptables", "-t", table, "-S"], capture=True).stdout.splitlines()
        if RULE_COMMENT in line and line.startswith("-A ")
    ]


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
        victims = [pid for pid, _ in _processes()] + [pid for pid, _ in _container_pids()]
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
    found += [f"process {pid} in network namespace {ns}" for pid, ns in _container_pids()]
    found += [f"mount {m}" for m in _mounts()]
    found += [f"loop {loop}" for loop in _loops()]
    found += [f"netns {ns}" for ns in _namespaces()]
    found += [f"link {link}" for link in _links()]
    found += [f"iptables -t {table} {rule}" for table, rule in _rules()]
    if (sandbox_dir() / "hosts").exists():
        found.append(f"directory {sandbox_dir() / 'hosts'}")
    return found


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


# --- the artifact mirror's HTTP server -----------------------------------------------------------
def mirror_root() -> Path:
    return cache_dir() / "mirror" / "site"


def serve_mirror() -> None:
    site = mirror_root()
    site.mkdir(parents=True, exist_ok=True)
    # argv[0] names the process gpuenv-mirror so that down's sweep can find a lost one.
    argv = [
        sys.executable,
        "-c",
        "import sys, runpy; sys.argv = ['gpuenv-mirror', *sys.argv[1:]]; runpy.run_module('http.server', "
        "run_name='__main__')",
        "--bind",
        controller_ip(),
        "--directory",
        str(site),
        str(MIRROR_PORT),
    ]
    _start_server("mirror", "the mirror's HTTP server", argv, MIRROR_PORT)


def stop_mirror() -> None:
    _stop_server("mirror")


def _start_server(name: str, what: str, argv: list[str], port: int) -> None:
    """Start one of the sandbox's servers on the bridge address, once; <name>.pid and <name>.log
    in the sandbox directory."""
    pidfile = sandbox_dir() / f"{name}.pid"
    if _pid(pidfile):
        return
    logfile = (sandbox_dir() / f"{name}.log").open("ab")
    proc = subprocess.Popen(  # noqa: S603
        argv, stdin=subprocess.DEVNULL, stdout=logfile, stderr=logfile, start_new_session=True
    )
    pidfile.write_text(str(proc.pid))
    if not cache.wait_listening(controller_ip(), port):
        raise SandboxError(f"{what} did not start; see {sandbox_dir() / (name + '.log')}")


def _stop_server(name: str) -> None:
    pidfile = sandbox_dir() / f"{name}.pid"
    pid = _pid(pidfile)
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _pid_alive(pid):
            time.sleep(0.1)
    pidfile.unlink(missing_ok=True)


# --- the download cache --------------------------------------------------------------------------
def serve_cache(directory: Path | None = None) -> None:
    """Start the download cache on the bridge address (gpuenv.sandbox.cache), once."""
    directory = directory or downloads_dir()
    argv = [sys.executable, "-m", "gpuenv.sandbox.cache", controller_ip(), str(CACHE_PORT), str(directory)]
    _start_server("cache", "the download cache", argv, CACHE_PORT)


def stop_cache() -> None:
    _stop_server("cache")
