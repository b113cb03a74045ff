"""Fingerprints of the places gpuenv writes on a host, for the gpuenv_converged module: a digest of
each place that changes when anything the stages set there changes, read in one pass with the
standard library (and one `systemctl show` for the units)."""

from __future__ import annotations

import glob
import hashlib
import os
import stat
from collections.abc import Callable, Iterable
from typing import Any

SKIP_NAMES = frozenset({"__pycache__"})
# Watched files up to this size count by their content (dpkg's status file is a few MB).
CONTENT_LIMIT = 16 * 1024 * 1024


def patterns(patterns: Iterable[str]) -> list[str]:
    """Each pattern's matches, sorted; a plain path stands for itself whether it exists or not."""
    paths: list[str] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            paths += sorted(glob.glob(pattern))
        else:
            paths.append(pattern)
    return paths


def _sig(path: str, st: os.stat_result, *, times: bool = True) -> str:
    kind = stat.S_IFMT(st.st_mode)
    fields = [oct(st.st_mode), str(st.st_uid), str(st.st_gid)]
    if stat.S_ISLNK(st.st_mode):
        try:
            fields.append(os.readlink(path))
        except OSError:
            fields.append("?")
    elif kind != stat.S_IFDIR:
        fields.append(str(st.st_size))
        if times:
            fields.append(str(st.st_mtime_ns))
    return " ".join(fields)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _sha256(path: str) -> str:
    """The file's content digest (OSError when it cannot be read)."""
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def _content_sig(path: str, st: os.stat_result) -> str:
    """A watched file: its content where small (a file written again with the same bytes, as a boot
    or a tool does with its settings, is no change), its size and time where large (a kernel)."""
    if stat.S_ISREG(st.st_mode) and st.st_size <= CONTENT_LIMIT:
        try:
            return f"{oct(st.st_mode)} {st.st_uid} {st.st_gid} sha256:{_sha256(path)}"
        except OSError as exc:
            return f"unreadable {exc.errno}"
    return _sig(path, st)


def watch_fingerprint(path: str) -> str:
    """The path and its entries one level down (small files by their content, large ones by size and
    time, directories by their names)."""
    h = hashlib.sha256()
    st = _lstat(path)
    if st is None:
        return "absent"
    h.update(f". {_content_sig(path, st)}\n".encode())
    if stat.S_ISDIR(st.st_mode):
        try:
            names = sorted(os.listdir(path))
        except OSError as exc:
            return f"unreadable: {exc.strerror}"
        for name in names:
            child = os.path.join(path, name)
            cst = _lstat(child)
            h.update(f"{name} {_content_sig(child, cst) if cst else 'gone'}\n".encode())
    return h.hexdigest()


def walk_fingerprint(path: str) -> str:
    """Every entry below the directory: its name, type, mode, owner, size, time and link target;
    a directory by its entries (its own time changes with every file written and removed inside)."""
    st = _lstat(path)
    if st is None:
        return "absent"
    if not stat.S_ISDIR(st.st_mode):
        return watch_fingerprint(path)
    h = hashlib.sha256()
    h.update(f". {_sig(path, st, times=False)}\n".encode())
    stack = [path]
    while stack:
        top = stack.pop()
        rel = os.path.relpath(top, path)
        lines: list[str] = []
        try:
            with os.scandir(top) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            h.update(f"{rel} unreadable {exc.errno}\n".encode())
            continue
        for entry in entries:
            if entry.name in SKIP_NAMES:
                continue
            try:
                est = entry.stat(follow_symlinks=False)
            except OSError:
                lines.append(f"{entry.name} gone")
                continue
            mode = est.st_mode
            if stat.S_ISREG(mode):
                # The common case inline (an environment has tens of thousands of files).
                lines.append(f"{entry.name} {mode:o} {est.st_uid} {est.st_gid} {est.st_size} {est.st_mtime_ns}")
            else:
                lines.append(f"{entry.name} {_sig(entry.path, est)}")
                if stat.S_ISDIR(mode):
                    stack.append(entry.path)
        h.update(f"[{rel}]\n{chr(10).join(lines)}\n".encode())
    return h.hexdigest()


def read_fingerprint(path: str) -> str:
    """A small file by its content alone."""
    try:
        return _sha256(path)
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


Runner = Callable[[list[str]], tuple[int, str, str]]


def units_fingerprint(units: list[str], systemctl: str | None, run: Runner) -> str:
    """Each unit's ActiveState and UnitFileState, as `systemctl show` reports them: one block per
    unit, a unit that does not exist included (inactive, no file state). Not the symlinks under
    /etc/systemd/system: a clone's first boot applies the presets there, and the units' state is
    what the stages set."""
    if not units:
        return "none"
    if systemctl is None:
        return "no systemctl"
    _, out, _ = run([systemctl, "show", "--property=Id,ActiveState,UnitFileState", "--", *units])
    return hashlib.sha256(out.encode()).hexdigest()


def fingerprint(p: dict[str, Any], systemctl: str | None, run: Runner) -> dict[str, str]:
    """Each place of the parameters' watch, walk, read and units, with its fingerprint."""
    prints: dict[str, str] = {}
    for path in patterns(p["watch"]):
        prints[f"watch:{path}"] = watch_fingerprint(path)
    for path in patterns(p["walk"]):
        prints[f"walk:{path}"] = walk_fingerprint(path)
    for path in patterns(p["read"]):
        prints[f"read:{path}"] = read_fingerprint(path)
    prints["units"] = units_fingerprint(p["units"], systemctl, run)
    return prints
