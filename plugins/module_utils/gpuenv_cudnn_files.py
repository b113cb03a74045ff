"""The files behind gpuenv_cuda_tree (plugins/modules/gpuenv_cuda_tree.py), shipped beside it by Ansible
as module_utils: a cuDNN tarball read, checked and unpacked once (either layout NVIDIA has shipped),
and the toolkit trees a cuDNN goes into (hard-linked copies, records, the switch of a link, pruning,
the in-place change of a real directory). The module decides what the link should lead to; this
file only moves files. Standard library only (plus gpuenv_hostparse): it runs on the hosts."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import tarfile
from collections.abc import Iterator
from typing import Any

from ansible.module_utils.gpuenv_cudnn_version import CudnnVersion
from ansible.module_utils.gpuenv_hostparse import cudnn_header_version

MARKER = ".gpuenv-cudnn.json"
UNPACKED = ".gpuenv-unpacked.json"
LEGACY = "cuda/include + cuda/lib64 (.tgz, up to 8.3.0)"
REDIST = "<name>/include + <name>/lib (redist, 8.3.1 on)"


# --- the archive -----------------------------------------------------------------------------
class TreeError(Exception):
    """What is wrong, and how to fix it: the module's failure message."""


def member_problem(name: str, kind: str, linkname: str = "") -> str | None:
    """Why a tar member must not be unpacked, or None. kind: file, dir, symlink or other."""
    parts = name.split("/")
    if name.startswith("/") or ".." in parts or "" in parts[:-1]:
        return f"{name!r} is not a plain relative path"
    if kind == "other":
        return f"{name!r} is not a file, directory or symbolic link"
    if kind == "symlink" and (not linkname or "/" in linkname or linkname in (".", "..")):
        return f"{name!r} links to {linkname!r}, outside its own directory"
    return None


def member_name(name: str) -> str:
    """A member's name without the "./" some tar files put first, nor a trailing "/"."""
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/")


def detect_layout(names: list[str]) -> dict[str, str]:
    """The layout of a cuDNN tarball from its member names: {layout, top, include, lib}. A folder
    counts when something lies in it."""
    split = [n.split("/") for n in (member_name(n) for n in names) if n not in ("", ".")]
    tops = {parts[0] for parts in split}
    if len(tops) != 1:
        raise TreeError(f"the tarball has {len(tops)} top folders ({', '.join(sorted(tops)[:4])}), not one")
    top = tops.pop()
    dirs = {parts[1] for parts in split if len(parts) >= 3}
    if "include" in dirs and "lib64" in dirs and "lib" not in dirs:
        return {"layout": LEGACY, "top": top, "include": "include", "lib": "lib64"}
    if "include" in dirs and "lib" in dirs:
        return {"layout": REDIST, "top": top, "include": "include", "lib": "lib"}
    raise TreeError(
        f"the tarball's folder {top}/ holds {', '.join(sorted(dirs)) or 'no folder with files'}: neither cuDNN "
        f"layout ({LEGACY}; {REDIST})"
    )


def _kind(member: tarfile.TarInfo) -> str:
    if member.isreg():
        return "file"
    if member.isdir():
        return "dir"
    if member.issym():
        return "symlink"
    return "other"


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def host_lock(unpack_dir: str) -> Iterator[None]:
    """One cuDNN placement at a time on a host. A run whose controller was killed can leave its
    module running on the host (SSH does not always end it), and a run started beside it (the rerun,
    or a pull timer's run during a push) would unpack into the same directory and switch the same
    links: the second waits here for the first, which then has finished or died. The lock file is in
    root's own unpack directory (never a fixed name in a world-writable one), opened without
    following a link; the lock ends with its holder, however that ends."""
    os.makedirs(unpack_dir, mode=0o755, exist_ok=True)
    fd = os.open(os.path.join(unpack_dir, ".lock"), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def unpacked_info(unpack_dir: str, sha256: str) -> dict[str, Any] | None:
    """The record of a complete unpack of that tarball, or None: none, or one whose files are no
    longer as unpacked (one deleted, or written over in place by a copy of another cuDNN, which
    writes through every hard link of the file). A mode changed since is no reason to unpack
    again: restore_modes() puts it back."""
    where = os.path.join(unpack_dir, checked_sha256(sha256, "the tarball's sha256"))
    info = read_json(os.path.join(where, UNPACKED))
    if not info or info.get("sha256") != sha256:
        return None
    entries = _entries(info)
    for rel in info.get("files", []):
        if entry_problem(os.path.join(where, rel), entries.get(rel), modes=False):
            return None
    return info


# --- what a record says each file is ---------------------------------------------------------
def entry_of(path: str) -> str | int:
    """A file as a record keeps it: a link's target ("-> target") or a regular file's size."""
    return "-> " + os.readlink(path) if os.path.islink(path) else os.lstat(path).st_size


def _entries(record: dict[str, Any]) -> dict[str, Any]:
    entries = record.get("entries")
    return entries if isinstance(entries, dict) else {}


def entry_problem(path: str, entry: object, *, modes: bool = True) -> str | None:  # noqa: PLR0911 - one answer per way a file can differ
    """What is wrong with one of a record's files, or None. ENTRY is what the record says it is
    (entry_of), None for a record written before records kept it (then the kind is not judged).
    With modes, a regular file must be root's, a+r and go-w: NVIDIA's `chmod a+r`, which members of
    the environment's group need to load it, and nobody but root changes what the loader loads."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    if isinstance(entry, str):
        if not stat.S_ISLNK(st.st_mode):
            return "not a link"
        return None if "-> " + os.readlink(path) == entry else f"a link to {os.readlink(path)}, not {entry[3:]}"
    if stat.S_ISLNK(st.st_mode):
        return None if entry is None else "a link, not a file"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if isinstance(entry, int) and st.st_size != entry:
        return f"{st.st_size} bytes, not {entry} (written over)"
    if modes and st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}"
    if modes and (st.st_mode & 0o444 != 0o444 or st.st_mode & 0o022):
        return f"mode {oct(st.st_mode & 0o7777)[2:].zfill(4)}, not readable by all or writable by others than root"
    return None


def restore_modes(unpacked: str, info: dict[str, Any]) -> None:
    """The unpacked copy's regular files a+r, go-w again (and so every tree's hard link of them)."""
    for rel in info.get("files", []):
        path = os.path.join(unpacked, rel)
        st = os.lstat(path)
        want = (st.st_mode | 0o444) & 0o755
        if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) != want:
            os.chmod(path, want)


def tree_damage(tree: str) -> list[str]:
    """What differs in a tree with a cuDNN from what its record says was placed: each file of the
    record that is missing, another kind, written over or set to another mode, and each cuDNN file
    (cudnn*.h, libcudnn*) that is not the record's, such as a copy put in by hand as NVIDIA's
    install notes do."""
    marker = read_json(os.path.join(tree, MARKER)) or {}
    entries = _entries(marker)
    files = [str(rel) for rel in marker.get("files", [])]
    damage = [f"{rel}: {why}" for rel in files if (why := entry_problem(os.path.join(tree, rel), entries.get(rel)))]
    known = set(files)
    for folder in ("include", "lib64", "lib"):
        path = os.path.join(tree, folder)
        if os.path.islink(path) or not os.path.isdir(path):
            continue  # lib64 -> lib: listed once, under its real name
        for name in sorted(os.listdir(path)):
            rel = f"{folder}/{name}"
            ours = rel in known or f"{'lib' if folder == 'lib64' else 'lib64'}/{name}" in known
            if not ours and (name.startswith("libcudnn") or (folder == "include" and name.startswith("cudnn"))):
                damage.append(f"{rel}: a cuDNN file gpuenv did not place")
    return damage


def unpack(archive: str, sha256: str, version: str, unpack_dir: str) -> dict[str, Any]:
    """Unpack the tarball into unpack_dir/<sha256>/{include,lib}, checked; returns its record. What
    a failure (a full disk, a bad member) leaves half-done is removed."""
    partial = os.path.join(unpack_dir, checked_sha256(sha256, "the tarball's sha256")) + ".partial"
    try:
        return _unpack(archive, sha256, version, unpack_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _unpack(archive: str, sha256: str, version: str, unpack_dir: str) -> dict[str, Any]:
    if not os.path.isfile(archive):
        raise TreeError(f"no cuDNN tarball at {archive} and no unpacked copy of it in {unpack_dir}/{sha256}")
    actual = sha256_of(archive)
    if actual != sha256:
        raise TreeError(f"{archive}: sha256 is {actual}, expected {sha256}; the file was not used")
    dest = os.path.join(unpack_dir, sha256)
    partial = dest + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial, mode=0o755)
    # One pass over the archive, in stream mode: an xz tarball read at random (getmembers, then
    # extractfile) is decompressed twice, since a seek back in an xz stream starts again from the
    # top (about 20 s of a 600 MB cuDNN 9 tarball here). So each member is checked before it is
    # written, everything under the top folder goes into raw/ first, and the layout, which needs
    # every name, picks include/ and lib/ out of raw/ at the end. A refused member stops the unpack;
    # unpack() removes what was written, all of it inside .partial.
    raw = os.path.join(partial, "raw")
    names: list[str] = []
    kept: list[list[str]] = []
    top = ""
    with tarfile.open(archive, "r|*") as tar:
        for m in tar:
            name = member_name(m.name)
            if problem := member_problem(name, _kind(m), m.linkname):
                raise TreeError(f"{os.path.basename(archive)} is refused: {problem}")
            names.append(m.name)
            first, *rel = name.split("/")
            if first not in ("", "."):
                if top and first != top:
                    detect_layout(names)  # refuses a second top folder before its files mix with the first's
                top = first
            if len(rel) < 2:
                continue  # the license and notes beside include/ and lib/ stay in the tarball
            path = os.path.join(raw, *rel)
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            if m.isdir():
                os.makedirs(path, mode=0o755, exist_ok=True)
                continue
            if m.issym():
                os.symlink(m.linkname, path)
            else:
                src = tar.extractfile(m)
                if src is None:
                    raise TreeError(f"{archive}: {m.name} cannot be read")
                with src, open(path, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                # a+r, go-w: NVIDIA's chmod a+r, and nobody but root changes what the loader loads.
                os.chmod(path, (m.mode | 0o444) & 0o755)
            kept.append(rel)
    layout = detect_layout(names)
    for folder, name in ((layout["include"], "include"), (layout["lib"], "lib")):
        os.rename(os.path.join(raw, folder), os.path.join(partial, name))
    shutil.rmtree(raw)
    files = [
        "/".join(["include" if rel[0] == layout["include"] else "lib", *rel[1:]])
        for rel in kept
        if rel[0] in (layout["include"], layout["lib"])
    ]
    found = header_version(partial)
    want = CudnnVersion(version).release
    if found != want:
        raise TreeError(
            f"{os.path.basename(archive)} holds cuDNN {found or 'of no readable version (no cudnn_version.h)'}, "
            f"not {version}: check the tarball's URL or path and the declared cuDNN"
        )
    info: dict[str, Any] = {
        "sha256": sha256,
        "version": version,
        "layout": layout["layout"],
        "archive": os.path.basename(archive),
        "files": sorted(files),
        "entries": {rel: entry_of(os.path.join(partial, rel)) for rel in files},
    }
    write_json(os.path.join(partial, UNPACKED), info)
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(partial, dest)
    return info


def header_version(tree: str) -> str | None:
    for name in ("cudnn_version.h", "cudnn.h"):
        path = os.path.join(tree, "include", name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                version: str | None = cudnn_header_version(f.read())
                return version
    return None


# --- trees -----------------------------------------------------------------------------------
_SHA256 = re.compile(r"[0-9a-f]{64}")


def checked_sha256(value: object, what: str) -> str:
    """A sha256 as 64 lowercase hex digits, or TreeError: it names a directory (unpack_dir/<sha256>)
    and a tree (<base>+cudnn-<version>-<sha256[:12]>), so nothing else may pass."""
    if isinstance(value, str) and _SHA256.fullmatch(value):
        return value
    raise TreeError(
        f"{what} {str(value)[:80]!r} is not a sha256 (64 lowercase hex digits); it is refused, since it names "
        "a directory. Check the redist manifest or cudnn_tarball_checksum"
    )


def plain_relative(rel: object) -> bool:
    """A path that stays inside whatever it is joined to: relative, no empty, '.' or '..' part."""
    return (
        isinstance(rel, str)
        and bool(rel)
        and not rel.startswith("/")
        and all(part not in ("", ".", "..") for part in rel.split("/"))
    )


def _untrusted(path: str) -> str | None:
    """Why a record at PATH could have been written by another account than this one (root), or
    None: the file and its directory are this account's, neither writable by group or others."""
    me = os.geteuid()
    # The directory as it really is (a tree is often named through a link, /usr/local/cuda-X.Y);
    # the record itself is never a link.
    directory = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    for entry, kind in ((directory, "directory"), (path, "file")):
        st = os.lstat(entry)
        if (kind == "file") != os.path.isfile(entry) or os.path.islink(entry):
            return f"{entry} is not a plain {kind}"
        if st.st_uid != me:
            return f"{entry} is owned by uid {st.st_uid}"
        if st.st_mode & 0o022:
            return f"{entry} is writable by others than its owner (mode {oct(st.st_mode & 0o777)})"
    return None


def read_json(path: str) -> dict[str, Any] | None:
    """One of gpuenv's records (an unpacked tarball's, a tree's), or None where there is none. A
    record decides what is linked and removed as root, so one that another account could have
    written, or one whose sha256 or file list could lead out of its tree, is refused."""
    if not os.path.lexists(path):
        return None
    why = _untrusted(path)
    if why:
        raise TreeError(
            f"{path}: gpuenv trusts its records only where nobody but root can write, and {why}. "
            "Remove the record (or give it and its directory to root, mode 0644 and 0755) and run again"
        )
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if "sha256" in data:
        checked_sha256(data["sha256"], f"{path}: the record's sha256")
    files = data.get("files", [])
    if not isinstance(files, list) or not all(plain_relative(rel) for rel in files):
        raise TreeError(f"{path}: the record's files are not all plain relative paths; remove the record and run again")
    return data


def write_json(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def link_target(link: str) -> str:
    return os.path.normpath(os.path.join(os.path.dirname(link), os.readlink(link)))


def composed_name(base: str, info: dict[str, Any]) -> str:
    version = str(info["version"])
    if not re.fullmatch(r"[0-9]+(\.[0-9]+){0,3}", version):
        raise TreeError(f"the cuDNN version {version[:40]!r} is not a version (digits and dots); it names a tree")
    return f"{base}+cudnn-{version}-{checked_sha256(info['sha256'], 'the tarball sha256')[:12]}"


def _inside(root: str, rel: str) -> str:
    """root/rel with its links followed, refused unless it stays inside root."""
    path = os.path.realpath(os.path.join(root, rel))
    if os.path.commonpath([path, os.path.realpath(root)]) != os.path.realpath(root):
        raise TreeError(f"{root}/{rel} leads out of the tree, to {path}")
    return path


def _link_or_copy(src: str, dest: str) -> None:
    try:
        os.link(src, dest)
    except OSError:  # another filesystem: a copy costs space, nothing else
        shutil.copy2(src, dest)


def place_files(unpacked: str, info: dict[str, Any], tree: str) -> list[str]:
    """Put the unpacked cuDNN's files into tree's include/ and lib64/ (or lib/), never writing
    through a name that is there already (it may be a hard link to another tree's file)."""
    placed = []
    for rel in info["files"]:
        if not plain_relative(rel) or rel.split("/", 1)[0] not in ("include", "lib") or "/" not in rel:
            raise TreeError(f"the unpacked record lists {str(rel)[:80]!r}, not a file under include/ or lib/")
        top, rest = rel.split("/", 1)
        where = "include" if top == "include" else ("lib64" if os.path.lexists(os.path.join(tree, "lib64")) else "lib")
        folder = _inside(tree, where)
        dest = os.path.join(folder, rest)
        os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
        src = os.path.join(unpacked, rel)
        tmp = dest + ".gpuenv-new"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        if os.path.islink(src):
            os.symlink(os.readlink(src), tmp)
        else:
            _link_or_copy(src, tmp)
        os.replace(tmp, dest)
        placed.append(f"{where}/{rest}")
    return placed


def hardlink_tree(base: str, dest: str, skip: set[str]) -> None:
    """A copy of base whose files are hard links (instant, and no space but directory entries),
    without the files named in skip (relative paths, as a legacy record lists them)."""
    for root, dirs, files in os.walk(base):
        rel = os.path.relpath(root, base)
        target = os.path.normpath(os.path.join(dest, rel))
        os.makedirs(target, exist_ok=True)
        shutil.copystat(root, target)
        for name in dirs + files:
            src, out = os.path.join(root, name), os.path.join(target, name)
            if os.path.normpath(os.path.join(rel, name)) in skip:
                continue
            if os.path.islink(src):
                os.symlink(os.readlink(src), out)
            elif name in files:
                _link_or_copy(src, out)


def legacy_files(tree: str) -> set[str]:
    """The cuDNN files gpuenv's earlier cudnn role copied into a toolkit tree itself (its record
    has no base), as paths relative to the tree with its links followed."""
    marker = read_json(os.path.join(tree, MARKER))
    if not marker or "base" in marker:
        return set()
    real = os.path.realpath(tree)
    found = {MARKER}
    for rel in marker.get("files", []):
        path = os.path.realpath(os.path.join(tree, os.path.dirname(str(rel))))
        found.add(os.path.normpath(os.path.join(os.path.relpath(path, real), os.path.basename(str(rel)))))
    return found


def build_composed(base: str, unpacked: str, info: dict[str, Any]) -> None:
    """The tree <base>+cudnn-..., built in staging and renamed into place when complete; a failure
    (a full disk) removes the staging copy."""
    name = composed_name(base, info)
    staging = os.path.join(os.path.dirname(base), ".staging-" + os.path.basename(name))
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _fill_staging(base, staging, unpacked, info)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    # A tree of that name: unfinished (its record was not written), or damaged since and rebuilt now.
    # It is moved aside first and removed after, so that the name is missing only between two renames.
    old = os.path.join(os.path.dirname(base), ".old-" + os.path.basename(name))
    shutil.rmtree(old, ignore_errors=True)
    if os.path.lexists(name):
        os.rename(name, old)
    os.rename(staging, name)
    shutil.rmtree(old, ignore_errors=True)


def _fill_staging(base: str, staging: str, unpacked: str, info: dict[str, Any]) -> None:
    hardlink_tree(base, staging, legacy_files(base))
    files = place_files(unpacked, info, staging)
    record = {k: info[k] for k in ("version", "sha256", "layout", "archive")}
    record.update(base=base, source=unpacked, files=sorted(files))
    record["entries"] = {rel: entry_of(os.path.join(staging, rel)) for rel in files}
    write_json(os.path.join(staging, MARKER), record)


def switch(link: str, target: str) -> None:
    tmp = link + ".gpuenv-new"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def complete(tree: str, base: str, info: dict[str, Any] | None, damage: list[str] | None = None) -> bool:
    """Whether the tree is the one wanted, every file of its cuDNN as placed (tree_damage, or the
    damage the caller read already)."""
    if info is None:
        return os.path.isdir(tree) and not legacy_files(tree)
    marker = read_json(os.path.join(tree, MARKER))
    wanted = bool(marker and marker.get("sha256") == info["sha256"] and marker.get("base") == base)
    return wanted and not (tree_damage(tree) if damage is None else damage)


_TOOLKIT_TREE = re.compile(r"^([0-9]+\.[0-9]+\.[0-9]+)-[0-9a-f]+$")


def prune(base: str, keep: set[str], versions: bool) -> list[str]:
    """Remove base's other cuDNN trees (and with versions, when base is a toolkit tree of the
    cuda_toolkit role, <X.Y.Z>-<id>, that version's other trees), all but keep."""
    parent, name = os.path.split(base)
    prefixes = [name + "+cudnn-", ".staging-" + name + "+cudnn-", ".old-" + name + "+cudnn-"]
    toolkit = _TOOLKIT_TREE.match(name)
    if versions and toolkit:
        prefixes.append(toolkit.group(1) + "-")
    removed = []
    for entry in sorted(os.listdir(parent)):
        path = os.path.join(parent, entry)
        if path in keep or not any(entry.startswith(p) for p in prefixes):
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
            removed.append(path)
    return removed


# --- a real directory: in place --------------------------------------------------------------
def in_place(tree: str, unpacked: str | None, info: dict[str, Any] | None) -> bool:
    """Bring the cuDNN in a real directory to info (or none); True when files changed. The old
    files go first, each new one lands by rename, and the record comes last: a run interrupted
    before the record is redone, since the .partial record still names what to remove."""
    marker = read_json(os.path.join(tree, MARKER))
    pending = read_json(os.path.join(tree, MARKER + ".partial"))
    same = (info is None and marker is None) or bool(marker and info and marker.get("sha256") == info["sha256"])
    if pending is None and same:
        return False
    old = set((marker or {}).get("files", [])) | set((pending or {}).get("files", []))
    write_json(os.path.join(tree, MARKER + ".partial"), {"files": sorted(old)})
    if os.path.lexists(os.path.join(tree, MARKER)):
        os.unlink(os.path.join(tree, MARKER))
    for rel in sorted(old):
        path = os.path.join(_inside(tree, os.path.dirname(rel)), os.path.basename(rel))
        if os.path.lexists(path):
            os.unlink(path)
    if info is not None and unpacked is not None:
        files = place_files(unpacked, info, tree)
        record = {k: info[k] for k in ("version", "sha256", "layout", "archive")}
        record.update(base=tree, source=unpacked, files=sorted(files))
        write_json(os.path.join(tree, MARKER), record)
    os.unlink(os.path.join(tree, MARKER + ".partial"))
    return True
