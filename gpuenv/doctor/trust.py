"""Who doctor may run an environment's Python as.

Doctor runs as root to look in every home. Running an environment's `bin/python` executes whatever
that environment holds: the interpreter, every `.pth` file and `sitecustomize` in its site-packages,
torch's modules and the libraries the loader maps from LD_LIBRARY_PATH and from its cache. Whoever
can write any one of those runs code as whoever runs the Python. So, as root:

- an environment that no account but root can write, anywhere on those paths, is run as root, with
  the library path that root's own files and the system's set;
- one that belongs to an account (the prefix is that account's) is run as that account: its uid,
  its groups, no capabilities, a scrubbed environment, the library path that account's own files and
  the system's set, and the same timeout;
- any other is not run: its versions are read from its files (torch/version.py, the dist-info
  directories, conda-meta), and the report says who can write what.

A doctor that is not root runs every environment as itself, as before: it has nothing to lose that
the environment's owner could take.
"""

from __future__ import annotations

import posixpath
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuenv.doctor.envs import SESSION_SHELL, Env, LibPath
from gpuenv.doctor.host import Host

ROOT = "root"
OWNER = "owner"
READ = "read"
SELF = "self"  # doctor runs without root: every environment as doctor's own user
# The most entries one environment's check reads: a CUDA torch venv holds about 20,000; a tree past
# this bound is not run as root rather than half checked.
MAX_ENTRIES = 400_000
# The libraries torch maps by name through the loader's cache (libcudnn and CUDA's own), whose
# directories a root run trusts as much as the environment.
_CACHED_LIBS = ("libcudnn", "libcuda", "libcublas", "libcufft", "libcurand", "libcusolver", "libcusparse",
                "libnccl", "libnvrtc", "libnvJitLink", "libnvToolsExt", "libcupti")  # fmt: skip
# What a run as another account keeps of doctor's own environment; everything else goes.
_KEPT = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_VISIBLE_DEVICES")
_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass
class Plan:
    """How verify runs in one environment, and why."""

    how: str  # ROOT, OWNER or READ
    why: str
    uid: int = 0
    gid: int = 0
    account: str = "root"
    home: str | None = None  # the account's home (its shell files name its library path)

    def describe(self) -> str:
        """The report's words for it."""
        if self.how == ROOT:
            return f"ran as root: {self.why}"
        if self.how == OWNER:
            return f"ran as {self.account} (uid {self.uid}), its owner, without capabilities: {self.why}"
        if self.how == SELF:
            return f"ran as {self.account}: {self.why}"
        return f"not run (read from its files only): {self.why}"


class _Budget:
    def __init__(self, limit: int) -> None:
        self.left = limit

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0


def _who(host: Host, uid: int) -> str:
    return host.account_name(uid) or f"uid {uid}"


def _writer(host: Host, path: str, st: object, *, tree: bool) -> str | None:
    """Why a non-root account can change what this entry is (None: only root can). In a tree every
    directory counts whole (a new .pth file is enough); above one, a sticky directory (/tmp) lets
    others add names but not replace the root-owned one below it."""
    mode, uid, gid = st.st_mode, st.st_uid, st.st_gid  # type: ignore[attr-defined]
    if uid != 0:
        return f"{path} is owned by {_who(host, uid)}"
    sticky_above = not tree and stat.S_ISDIR(mode) and mode & stat.S_ISVTX
    if stat.S_ISLNK(mode):
        return None  # a root's link is changed only through its directory, which is checked
    if mode & stat.S_IWOTH and not sticky_above:
        return f"{path} is writable by every account"
    if mode & stat.S_IWGRP and gid != 0 and not sticky_above:
        return f"{path} is writable by group {host.group_name(gid) or gid}"
    return None


def _ancestors(path: str) -> list[str]:
    out: list[str] = []
    current = path
    while True:
        parent = posixpath.dirname(current)
        if parent == current:
            return out
        out.append(parent)
        current = parent


def _path_writer(host: Host, path: str, budget: _Budget, seen: set[str]) -> str | None:
    """The first reason a non-root account can change PATH itself or any directory above it: each
    step of the path as written (a link there is replaced through its directory), and each step of
    where its links lead."""
    if host.real(path) is None:
        return None  # nothing there to run or load
    steps = [(path, True), *((a, False) for a in _ancestors(path))]
    for written, tree in steps:
        real = host.real(written)
        entries = [(written, tree)] + ([(real, tree), *((a, False) for a in _ancestors(real))] if real else [])
        for entry, in_tree in entries:
            key = f"{entry}\0{in_tree}"
            if key in seen:
                continue
            seen.add(key)
            if not budget.take():
                return f"more than {MAX_ENTRIES} files to check"
            st = host.lstat(entry)
            if st is not None and (why := _writer(host, entry, st, tree=in_tree)):
                return why
    return None


def _tree_writer(host: Host, top: str, budget: _Budget, seen: set[str], *, recurse: bool = True) -> str | None:
    """The first reason a non-root account can change anything in a tree: its entries, the
    directories above it, and what its links point at (a linked directory is checked whole)."""
    why = _path_writer(host, top, budget, seen)
    if why:
        return why
    real_top = host.real(top)
    if real_top is None or not host.is_dir(real_top):
        return None
    todo = [real_top]
    while todo:
        directory = todo.pop()
        for name in host.listdir(directory):
            path = f"{directory.rstrip('/')}/{name}"
            if not budget.take():
                return f"more than {MAX_ENTRIES} files to check"
            st = host.lstat(path)
            if st is None:
                continue
            if stat.S_ISLNK(st.st_mode):
                target = host.real(path)
                if target is None or f"{target}\0True" in seen:
                    continue
                if target == real_top or target.startswith(real_top.rstrip("/") + "/"):
                    continue  # inside the tree: checked as part of it
                why = (
                    _tree_writer(host, target, budget, seen)
                    if recurse and host.is_dir(target)
                    else _path_writer(host, target, budget, seen)
                )
            else:
                why = _writer(host, path, st, tree=True)
                if why is None and stat.S_ISDIR(st.st_mode) and recurse:
                    todo.append(path)
            if why:
                return why
    return None


def _interpreter_trees(host: Host, env: Env) -> list[str]:
    """The directories the environment's Python loads its standard library and any site-packages
    beyond the environment's own from: the base interpreter's prefix for a venv (pyvenv.cfg's
    home), and Debian's dist-packages for a system Python or a venv that includes them."""
    python = host.real(env.python) if env.python else None
    if python is None:
        return []
    lines = (host.read(f"{env.path}/pyvenv.cfg") or "").splitlines()
    cfg = {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in lines)}
    home = cfg.get("home", "").rstrip("/") or posixpath.dirname(python)
    base = posixpath.dirname(home)
    version = env.python_version or ""
    trees = [f"{base}/lib/python{version}"] if version else host.glob(f"{base}/lib", "python3*")
    system_site = env.kind == "system" or cfg.get("include-system-site-packages", "").lower() == "true"
    if system_site:
        trees += ["/usr/lib/python3/dist-packages", *host.glob("/usr/local/lib", "python3*")]
    return [t for t in trees if host.is_dir(t)]


def _library_dirs(cache: Mapping[str, list[str]]) -> list[str]:
    """The directories of the loader's cache entries that torch maps by name."""
    dirs = [posixpath.dirname(p) for name, paths in cache.items() if name.startswith(_CACHED_LIBS) for p in paths]
    return list(dict.fromkeys(dirs))


def root_writer(host: Host, env: Env, ld_dirs: Iterable[str], cache: Mapping[str, list[str]]) -> str | None:
    """Why running this environment's Python as root would run what another account can write
    (None: nothing on its paths is writable by anyone but root)."""
    budget, seen = _Budget(MAX_ENTRIES), set[str]()
    if env.python and (why := _path_writer(host, env.python, budget, seen)):
        return why
    for tree in [env.path, *_interpreter_trees(host, env)]:
        if why := _tree_writer(host, tree, budget, seen):
            return why
    for directory in [*ld_dirs, *_library_dirs(cache)]:
        # A library directory's own files, not its subdirectories: the loader looks in it alone.
        if why := _tree_writer(host, directory, budget, seen, recurse=False):
            return why
    return None


def plan(host: Host, env: Env, ld_dirs: Iterable[str], cache: Mapping[str, list[str]]) -> Plan:
    """How verify may run in this environment, for a doctor running as HOST's uid."""
    if host.uid != 0:
        return Plan(SELF, "doctor itself runs without root", uid=host.uid, account=_who(host, host.uid))
    why = root_writer(host, env, list(ld_dirs), cache)
    if why is None:
        return Plan(ROOT, "nothing it runs or loads is writable by another account")
    st = host.lstat(host.real(env.path) or env.path)
    owner = st.st_uid if st is not None else 0
    if owner != 0:
        gid = host.account_gid(owner)
        name = host.account_name(owner)
        if gid is not None and name is not None:
            return Plan(OWNER, why, uid=owner, gid=gid, account=name, home=host.account_home(owner))
        return Plan(READ, f"{why}, and uid {owner} has no account to run it as")
    return Plan(READ, why)


def session_for(plan: Plan, session: list[LibPath]) -> list[LibPath]:
    """The library path sources of the files a run's sessions read: the system's, and the shell
    files of the account it runs as. Another account's shell files never reach a run as root. (The
    value of doctor's own shell is the caller's to add, for a run as root or as doctor's user.)"""
    files = [lp for lp in session if lp.source != SESSION_SHELL]
    if plan.how == SELF:
        return files
    mine = plan.home.rstrip("/") + "/" if plan.home else None
    return [lp for lp in files if lp.source.startswith("/etc/") or (mine and lp.source.startswith(mine))]


def environ_for(plan: Plan, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a run gets: doctor's own for a run as root or as doctor's user (less
    LD_LIBRARY_PATH, set apart), a scrubbed one for a run as another account. No run writes
    bytecode caches: doctor only reads."""
    if plan.how in (ROOT, SELF):
        kept = {k: v for k, v in environ.items() if k != "LD_LIBRARY_PATH"}
    else:
        kept = {k: environ[k] for k in _KEPT if k in environ}
        kept |= {"PATH": _PATH, "HOME": plan.home or "/", "USER": plan.account, "LOGNAME": plan.account}
    return {**kept, "PYTHONDONTWRITEBYTECODE": "1"}


def command_for(plan: Plan, argv: list[str], ld_path: str) -> list[str]:
    """The command line of a run. As another account, setpriv drops to its uid and groups with no
    capabilities and no way back before anything of the environment's is executed, and env(1),
    already unprivileged, sets LD_LIBRARY_PATH: the root-run setpriv never sees it."""
    if plan.how != OWNER:
        return argv
    drop = [
        "setpriv",
        f"--reuid={plan.uid}",
        f"--regid={plan.gid}",
        "--init-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]
    return [*drop, "/usr/bin/env", *([f"LD_LIBRARY_PATH={ld_path}"] if ld_path else []), *argv]
