#!/usr/bin/python
"""Ansible module gpuenv_cuda_tree: point a CUDA tree's link at a toolkit with (or without) a cuDNN,
switching in one step. The cuDNN goes into a new tree beside the toolkit's, never into the tree a
running process uses."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tarfile
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuenv_hostparse import cudnn_header_version

DOCUMENTATION = r"""
module: gpuenv_cuda_tree
short_description: Switch a CUDA tree link to a toolkit tree with the declared cuDNN, atomically
description:
  - NVIDIA's guide installs cuDNN by copying its headers and libraries into the live CUDA tree,
    so an interrupted copy leaves a tree with half a cuDNN, and nothing can give the previous one
    back. Here a toolkit tree with a cuDNN is a tree of its own, C(<base>+cudnn-<build>-<sha>),
    made beside the toolkit's C(<base>) tree (its toolkit files hard-linked, the cuDNN files
    added), complete before the link I(link) (C(/usr/local/cuda-X.Y)) is switched to it with one
    rename. The previous tree stays, so putting the link back puts the previous cuDNN back.
  - The cuDNN tarball is unpacked once into I(unpack_dir)/<sha256> (kept, so another tree or a
    later run needs no tarball), from either layout NVIDIA has shipped, told apart by the
    archive's members and not by a version guess - C(cuda/include) and C(cuda/lib64) (the
    C(.tgz) files up to 8.3.0) or C(<name>/include) and C(<name>/lib) (the C(-archive.tar.xz)
    files from 8.3.1). Members that are not plain files, directories or links within their own
    directory are refused.
  - Every file placed is readable by all and writable by root only (NVIDIA's C(chmod a+r)),
    each library's links are kept, C(ldconfig) runs after a switch, and the tree records its
    cuDNN in C(.gpuenv-cudnn.json).
  - When I(link) is a real directory (NVIDIA's packages make C(/usr/local/cuda-X.Y) one), there is
    nothing to switch; the files go into it in place, each by rename, with the record written
    last and an interrupted change redone by the next run.
options:
  link:
    description: The switch point, C(/usr/local/cuda-X.Y). It must exist.
    type: path
    required: true
  base:
    description:
      - The toolkit tree the link ends on. Default, the toolkit the link serves now (the base of
        the cuDNN tree it points at, or the tree itself).
    type: path
  cudnn_archive:
    description: The cuDNN tarball on the host; needed only when I(unpack_dir) lacks it unpacked.
    type: path
  cudnn_sha256:
    description: The tarball's sha256 (hex). With it, the tree gets that cuDNN; without it, none.
    type: str
  cudnn_version:
    description: The cuDNN build it must hold (C(8.6.0.163)); its header is checked against it.
    type: str
  unpack_dir:
    description: Where unpacked cuDNN tarballs are kept, one directory per sha256.
    type: path
    default: /var/cache/gpuenv/downloads/cudnn
  carry_cudnn:
    description:
      - Without I(cudnn_sha256), keep the cuDNN the link's tree has now on the new I(base) (a toolkit
        update does not drop the cuDNN in the meantime) instead of switching to the bare toolkit.
    type: bool
    default: false
  prune_versions:
    description:
      - Also remove the other toolkit trees beside I(base) whose name starts with the same
        C(<version>-), except the one the link led to before this run (the way back).
    type: bool
    default: false
  remove_archive:
    description: Remove I(cudnn_archive) once it is unpacked.
    type: bool
    default: true
  ldconfig:
    description: Run C(ldconfig) when the tree behind the link changed.
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Give CUDA 11.8 the declared cuDNN
  gpuenv_cuda_tree:
    link: /usr/local/cuda-11.8
    cudnn_archive: /var/cache/gpuenv/downloads/cudnn/cudnn-11.8-linux-x64-v8.6.0.163.tgz
    cudnn_sha256: "{{ cudnn_archive.sha256 }}"
    cudnn_version: 8.6.0.163
"""

RETURN = r"""
tree:
  description: The tree the link points at now.
  type: str
previous:
  description: The tree it pointed at before (the way back).
  type: str
base:
  description: The toolkit tree under the cuDNN.
  type: str
mode:
  description:
    - C(link) (a tree switched by the link), C(in_place) (a real directory), or C(absent) (no
      tree, and none wanted).
  type: str
cudnn:
  description: The cuDNN in the tree (version, sha256, layout, files), or null.
  type: dict
removed:
  description: Trees removed beside it.
  type: list
needed:
  description: Whether the tree behind the link has to change (also in check mode).
  type: bool
"""

MARKER = ".gpuenv-cudnn.json"
UNPACKED = ".gpuenv-unpacked.json"
LEGACY = "cuda/include + cuda/lib64 (.tgz, up to 8.3.0)"
REDIST = "<name>/include + <name>/lib (redist, 8.3.1 on)"


class TreeError(Exception):
    """What is wrong, and how to fix it: the module's failure message."""


# --- the archive -------------------------------------------------------------------------------
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


def unpacked_info(unpack_dir: str, sha256: str) -> dict[str, Any] | None:
    """The record of a complete unpack of that tarball, or None."""
    info = read_json(os.path.join(unpack_dir, sha256, UNPACKED))
    return info if info and info.get("sha256") == sha256 else None


def unpack(archive: str, sha256: str, version: str, unpack_dir: str) -> dict[str, Any]:
    """Unpack the tarball into unpack_dir/<sha256>/{include,lib}, checked; returns its record. What
    a failure (a full disk, a bad member) leaves half-done is removed."""
    partial = os.path.join(unpack_dir, sha256) + ".partial"
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
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        problems = [p for m in members if (p := member_problem(member_name(m.name), _kind(m), m.linkname))]
        if problems:
            raise TreeError(f"{os.path.basename(archive)} is refused: {'; '.join(problems[:3])}")
        layout = detect_layout([m.name for m in members])
        files = []
        for m in members:
            rel = member_name(m.name).split("/")[1:]
            if len(rel) < 2 or rel[0] not in (layout["include"], layout["lib"]):
                continue  # the license and notes stay in the tarball
            where = ["include" if rel[0] == layout["include"] else "lib", *rel[1:]]
            path = os.path.join(partial, *where)
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
            files.append("/".join(where))
    found = header_version(partial)
    want = ".".join(version.split(".")[:3])
    if found != want:
        raise TreeError(
            f"{os.path.basename(archive)} holds cuDNN {found or 'of no readable version (no cudnn_version.h)'}, "
            f"not {version}: check the tarball's URL or path and the declared cuDNN"
        )
    info = {
        "sha256": sha256,
        "version": version,
        "layout": layout["layout"],
        "archive": os.path.basename(archive),
        "files": sorted(files),
    }
    write_json(os.path.join(partial, UNPACKED), info)
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(partial, dest)
    return info


# --- trees -------------------------------------------------------------------------------------
def read_json(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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
    return f"{base}+cudnn-{info['version']}-{info['sha256'][:12]}"


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
    shutil.rmtree(name, ignore_errors=True)  # an unfinished tree of that name: its record was not written
    os.rename(staging, name)


def _fill_staging(base: str, staging: str, unpacked: str, info: dict[str, Any]) -> None:
    hardlink_tree(base, staging, legacy_files(base))
    files = place_files(unpacked, info, staging)
    record = {k: info[k] for k in ("version", "sha256", "layout", "archive")}
    record.update(base=base, source=unpacked, files=sorted(files))
    write_json(os.path.join(staging, MARKER), record)


def switch(link: str, target: str) -> None:
    tmp = link + ".gpuenv-new"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def complete(tree: str, base: str, info: dict[str, Any] | None) -> bool:
    if info is None:
        return os.path.isdir(tree) and not legacy_files(tree)
    marker = read_json(os.path.join(tree, MARKER))
    return bool(marker and marker.get("sha256") == info["sha256"] and marker.get("base") == base)


_TOOLKIT_TREE = re.compile(r"^(\d+\.\d+\.\d+)-[0-9a-f]+$")


def prune(base: str, keep: set[str], versions: bool) -> list[str]:
    """Remove base's other cuDNN trees (and with versions, when base is a toolkit tree of the
    cuda_toolkit role, <X.Y.Z>-<id>, that version's other trees), all but keep."""
    parent, name = os.path.split(base)
    prefixes = [name + "+cudnn-", ".staging-" + name + "+cudnn-"]
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


# --- a real directory: in place ----------------------------------------------------------------
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


# --- the module --------------------------------------------------------------------------------
def plan(params: dict[str, Any]) -> dict[str, Any]:
    """What the link should lead to: {mode, base, current, tree, info}. Reads only."""
    link = params["link"]
    info: dict[str, Any] | None = None
    if params.get("cudnn_sha256"):
        info = {"sha256": params["cudnn_sha256"], "version": params["cudnn_version"]}
    if not os.path.lexists(link):
        base = params.get("base")
        if base:  # a toolkit's first link
            if not os.path.isdir(base):
                raise TreeError(f"the toolkit tree {base} does not exist: run the cuda_toolkit role")
            return {
                "mode": "link",
                "base": base,
                "current": "",
                "tree": composed_name(base, info) if info else base,
                "info": info,
            }
        if info is None:  # no tree, and no cuDNN wanted in it: nothing to do
            return {"mode": "absent", "base": link, "current": link, "tree": link, "info": None, "keep": True}
        raise TreeError(f"no CUDA tree at {link}: install the toolkit first (the cuda_toolkit role)")
    if not os.path.islink(link):
        if not os.path.isdir(link):
            raise TreeError(f"{link} is neither a link to a CUDA tree nor a directory")
        return {"mode": "in_place", "base": link, "current": link, "tree": link, "info": info}
    current = link_target(link)
    if not os.path.isdir(current):
        raise TreeError(f"{link} points at {current}, which does not exist: run the cuda_toolkit role")
    marker = read_json(os.path.join(current, MARKER)) or {}
    base = params.get("base") or marker.get("base") or current
    if not os.path.isdir(base):
        raise TreeError(f"the toolkit tree {base} does not exist: run the cuda_toolkit role")
    if (read_json(os.path.join(base, MARKER)) or {}).get("base") not in (None, base):
        raise TreeError(f"{base} is a tree with a cuDNN, not a toolkit tree: give the toolkit's own tree as base")
    if info is None and params["carry_cudnn"] and marker.get("sha256"):
        if "base" not in marker and base == current:
            # A cuDNN the earlier role copied into the toolkit tree: it stays where it is until
            # the cudnn role gives the tree its own.
            return {"mode": "link", "base": base, "current": current, "tree": current, "info": None, "keep": True}
        if unpacked_info(os.path.dirname(str(marker.get("source", ""))), str(marker["sha256"])):
            info = {"sha256": marker["sha256"], "version": marker.get("version")}
    tree = composed_name(base, info) if info else base
    return {"mode": "link", "base": base, "current": current, "tree": tree, "info": info}


def header_version(tree: str) -> str | None:
    for name in ("cudnn_version.h", "cudnn.h"):
        path = os.path.join(tree, "include", name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                version: str | None = cudnn_header_version(f.read())
                return version
    return None


def run(module: Any, p: dict[str, Any]) -> dict[str, Any]:
    if module.check_mode and p.get("cudnn_sha256") and not os.path.lexists(p["link"]) and not p.get("base"):
        # Check mode of a whole run: the toolkit role has not made the link, as it would have.
        return {
            "changed": True,
            "needed": True,
            "mode": "link",
            "tree": None,
            "previous": None,
            "removed": [],
            "msg": f"{p['link']} does not exist yet: the cuda_toolkit role makes it before the cuDNN goes in",
        }
    want = plan(p)
    info, mode, link = want["info"], want["mode"], p["link"]
    marker_now = read_json(os.path.join(want["current"], MARKER)) or {} if mode != "absent" and want["current"] else {}
    if want.get("keep"):
        changed = False
    elif mode == "in_place":
        pending = os.path.lexists(os.path.join(want["tree"], MARKER + ".partial"))
        changed = marker_now.get("sha256") != (info or {}).get("sha256") or pending
    else:
        changed = want["current"] != want["tree"] or not complete(want["tree"], want["base"], info)
    result: dict[str, Any] = {
        "changed": changed,
        "tree": want["tree"],
        "previous": want["current"],
        "base": want["base"],
        "mode": mode,
        "removed": [],
        "diff": {
            "before_header": link,
            "after_header": link,
            "before": f"{want['current']} (cuDNN {marker_now.get('version', 'none')})\n",
            "after": f"{want['tree']} (cuDNN {info['version'] if info else 'none'})\n",
        },
    }
    result["needed"] = changed
    if module.check_mode or want.get("keep"):
        result["cudnn"] = info
        return result
    full, unpacked = None, None
    if info is not None:
        unpacked = os.path.join(p["unpack_dir"], info["sha256"])
        full = unpacked_info(p["unpack_dir"], info["sha256"])
        if full is None:
            if not p.get("cudnn_archive"):
                raise TreeError(f"no unpacked cuDNN {info['version']} in {unpacked} and no cudnn_archive to unpack")
            full = unpack(p["cudnn_archive"], info["sha256"], str(info["version"]), p["unpack_dir"])
        if p["remove_archive"] and p.get("cudnn_archive") and os.path.isfile(p["cudnn_archive"]):
            os.unlink(p["cudnn_archive"])
    if mode == "in_place":
        changed = in_place(want["tree"], unpacked, full)
    else:
        if full is not None and not complete(want["tree"], want["base"], full):
            build_composed(want["base"], str(unpacked), full)
        if want["current"] != want["tree"]:
            switch(link, want["tree"])
        if legacy_files(want["base"]):
            # Nothing serves the toolkit tree with the copied-in cuDNN any more (or none is
            # wanted): take that cuDNN out, so that the tree is the toolkit alone again.
            in_place(want["base"], None, None)
        keep = {want["tree"], want["base"], want["current"], str(marker_now.get("base", want["current"]))}
        result["removed"] = prune(want["base"], keep, p["prune_versions"])
    if info is not None and header_version(want["tree"]) != ".".join(str(info["version"]).split(".")[:3]):
        raise TreeError(
            f"{want['tree']}/include says cuDNN {header_version(want['tree']) or 'nothing'}, not {info['version']}: "
            "another copy was put there by hand or by a package; remove it and run again"
        )
    result["cudnn"] = read_json(os.path.join(want["tree"], MARKER))
    if changed and p["ldconfig"]:
        rc, _, err = module.run_command(["ldconfig"])
        if rc != 0:
            raise TreeError(f"ldconfig failed (rc {rc}): {err.strip()}")
    result["changed"] = changed
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "link": {"type": "path", "required": True},
            "base": {"type": "path"},
            "cudnn_archive": {"type": "path"},
            "cudnn_sha256": {"type": "str"},
            "cudnn_version": {"type": "str"},
            "unpack_dir": {"type": "path", "default": "/var/cache/gpuenv/downloads/cudnn"},
            "carry_cudnn": {"type": "bool", "default": False},
            "prune_versions": {"type": "bool", "default": False},
            "remove_archive": {"type": "bool", "default": True},
            "ldconfig": {"type": "bool", "default": True},
        },
        required_together=[("cudnn_sha256", "cudnn_version")],
        supports_check_mode=True,
    )
    try:
        result = run(module, module.params)
    except (TreeError, OSError, tarfile.TarError) as exc:
        module.fail_json(msg=f"{module.params['link']}: {exc}")
        raise  # fail_json exits; this line is for the type checker
    module.exit_json(**result)


if __name__ == "__main__":
    main()
