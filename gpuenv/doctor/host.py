"""The host gpuenv doctor reads: every file under a root directory ("/" on a real host), every command
through one runner. The tests give a fake host tree (tmp_path) and a runner that answers with saved
real output; nothing else in the doctor touches the file system or starts a process.

Paths are the host's own ("/usr/local/cuda/lib64"), whatever the root: the findings name them as a
user sees them, and symbolic links are followed inside the root (an absolute link target is a path
of the host, not of the machine doctor runs on).
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# A command's result (returncode, stdout, stderr), or None when the command does not exist.
Runner = Callable[[Sequence[str], float, "Mapping[str, str] | None"], "subprocess.CompletedProcess[str] | None"]

# Where tools are looked for besides PATH: ldconfig, modinfo and lspci live in sbin, which a user's
# PATH often lacks.
_SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_MAX_READ = 4 << 20


class DoctorError(Exception):
    """Doctor cannot run at all (exit 2): what is wrong and how to fix it, in one sentence each."""


def system_runner(
    argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str] | None:
    """Run a command of this machine's: its output, exit 124 when it ran past `timeout` seconds
    (whatever it printed so far is kept), None when there is no such command."""
    try:
        return subprocess.run(  # noqa: S603 - argv from doctor's own probes, never a shell
            list(argv),
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            env=None if env is None else dict(env),
            check=False,
        )
    except FileNotFoundError:
        return None
    except PermissionError as exc:
        return subprocess.CompletedProcess(list(argv), 126, "", str(exc))
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return subprocess.CompletedProcess(list(argv), 124, out, f"timed out after {timeout:g} s")


def root_runner(root: Path, base: Runner = system_runner) -> Runner:
    """The runner for a host tree that is not this machine's (--root DIR: a mounted disk, a container's
    root): only the readers that can be pointed at the tree run (this machine's ldconfig printing the
    tree's cache, dpkg-query and rpm reading its package databases). Every other command (nvidia-smi,
    modinfo, lspci, nvcc, the environments' Pythons) would describe this machine, not the tree, so it
    counts as missing."""

    def run(
        argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str] | None:
        name, rest = posixpath.basename(argv[0]), list(argv[1:])
        if name == "ldconfig" and rest == ["-p"]:  # -C: another cache file, printed, nothing rebuilt
            return base(["ldconfig", "-C", str(root / "etc/ld.so.cache"), "-p"], timeout, env)
        if name == "dpkg-query":
            return base(["dpkg-query", f"--admindir={root / 'var/lib/dpkg'}", *rest], timeout, env)
        if name == "rpm":
            return base(["rpm", "--root", str(root), *rest], timeout, env)
        return None

    return run


@dataclass
class Host:
    root: Path = Path("/")
    runner: Runner = system_runner
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    uid: int = field(default_factory=os.geteuid)

    def __post_init__(self) -> None:
        if not self.root.is_dir():
            raise DoctorError(f"the root {self.root} is not a directory: give the directory the host's files are under")

    # --- files ---------------------------------------------------------------------------------
    def path(self, path: str) -> Path:
        """Where a host path lies on this machine."""
        return self.root / path.lstrip("/")

    def exists(self, path: str) -> bool:
        return self.real(path) is not None

    def is_dir(self, path: str) -> bool:
        real = self.real(path)
        return real is not None and self.path(real).is_dir()

    def is_file(self, path: str) -> bool:
        real = self.real(path)
        return real is not None and self.path(real).is_file()

    def read(self, path: str) -> str | None:
        """A text file's contents (undecodable bytes replaced), None when it cannot be read."""
        data = self.read_bytes(path)
        return None if data is None else data.decode(errors="replace")

    def read_bytes(self, path: str) -> bytes | None:
        real = self.real(path)
        if real is None:
            return None
        try:
            with self.path(real).open("rb") as f:
                return f.read(_MAX_READ)
        except OSError:  # unreadable as this user (another user's home), or not a regular file
            return None

    def listdir(self, path: str) -> list[str]:
        """The names in a directory, sorted; [] when it is not one or cannot be read."""
        real = self.real(path)
        if real is None:
            return []
        try:
            return sorted(os.listdir(self.path(real)))
        except OSError:
            return []

    def glob(self, directory: str, pattern: str) -> list[str]:
        """Host paths of the entries of `directory` whose names match `pattern` (fnmatch), sorted."""
        return [posixpath.join(directory, n) for n in self.listdir(directory) if fnmatch.fnmatchcase(n, pattern)]

    def lstat(self, path: str) -> os.stat_result | None:
        """The entry itself (a link, not what it points at), or None when nothing is there."""
        try:
            return os.lstat(self.path(path))
        except OSError:
            return None

    # --- accounts (the host's own /etc/passwd and /etc/group) ------------------------------------
    def _table(self, path: str) -> dict[int, list[str]]:
        rows: dict[int, list[str]] = {}
        for line in (self.read(path) or "").splitlines():
            fields = line.split(":")
            if len(fields) >= 4 and fields[2].isdigit() and fields[2].isascii():
                rows.setdefault(int(fields[2]), fields)
        return rows

    def account_name(self, uid: int) -> str | None:
        row = self._table("/etc/passwd").get(uid)
        return row[0] if row else None

    def account_gid(self, uid: int) -> int | None:
        row = self._table("/etc/passwd").get(uid)
        return int(row[3]) if row and row[3].isdigit() and row[3].isascii() else None

    def account_home(self, uid: int) -> str | None:
        row = self._table("/etc/passwd").get(uid)
        return row[5] if row and len(row) > 5 and row[5].startswith("/") else None

    def group_name(self, gid: int) -> str | None:
        row = self._table("/etc/group").get(gid)
        return row[0] if row else None

    def readlink(self, path: str) -> str | None:
        try:
            return os.readlink(self.path(path))
        except OSError:
            return None

    def real(self, path: str) -> str | None:
        """The host path with every symbolic link followed inside the root (os.path.realpath's
        answer on the host itself), or None when nothing is there or the links loop."""
        todo = [p for p in path.split("/") if p]
        done, hops = "/", 0
        while todo:
            part = todo.pop(0)
            if part == ".":
                continue
            if part == "..":
                done = posixpath.dirname(done)
                continue
            step = posixpath.join(done, part)
            target = self.readlink(step)
            if target is None:
                done = step
                continue
            hops += 1
            if hops > 40:
                return None
            todo = [p for p in target.split("/") if p] + todo
            if target.startswith("/"):
                done = "/"
        return done if os.path.lexists(self.path(done)) else None

    # --- commands ------------------------------------------------------------------------------
    def which(self, name: str) -> str | None:
        """The host path of a command as a shell finds it on PATH (and in sbin), or None."""
        dirs = [*self.environ.get("PATH", _DEFAULT_PATH).split(":"), *_SBIN]
        for directory in dict.fromkeys(d for d in dirs if d.startswith("/")):
            candidate = posixpath.join(directory, name)
            real = self.real(candidate)
            if real is not None and self.path(real).is_file() and os.access(self.path(real), os.X_OK):
                return candidate
        return None

    def run(
        self, argv: Sequence[str], timeout: float = 60, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str] | None:
        """Run a host command (a name is looked up on PATH, a path must exist): None when it does not."""
        command = argv[0] if argv[0].startswith("/") and self.is_file(argv[0]) else self.which(argv[0])
        if command is None:
            return None
        return self.runner([command, *argv[1:]], timeout, env)

    def homes(self, extra: Sequence[str] = ()) -> list[str]:
        """The home directories to look for environments in: $HOME, and as root /root and every
        /home/<user> too; then any given."""
        found = [self.environ.get("HOME", "")]
        if self.uid == 0:
            found += ["/root", *self.glob("/home", "*")]
        found += list(extra)
        return [h for h in dict.fromkeys(p.rstrip("/") for p in found if p.startswith("/")) if self.is_dir(h)]
