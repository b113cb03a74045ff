#!/usr/bin/python
"""Ansible module gpuenv_cuda_tree: point a CUDA tree's link at a toolkit with (or without) a cuDNN,
switching in one step. The cuDNN goes into a new tree beside the toolkit's, never into the tree a
running process uses."""

from __future__ import annotations

import contextlib
import os
import tarfile
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuenv_cudnn_files import (
    MARKER,
    TreeError,
    build_composed,
    checked_sha256,
    complete,
    composed_name,
    header_version,
    host_lock,
    in_place,
    legacy_files,
    link_target,
    prune,
    read_json,
    restore_modes,
    switch,
    tree_damage,
    unpack,
    unpacked_info,
)
from ansible.module_utils.gpuenv_cudnn_version import CudnnVersion

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
    cuDNN in C(.gpuenv-cudnn.json), each file with its size or link target.
  - A tree whose cuDNN is no longer as placed is built again from the unpacked copy and switched
    to, its I(damage) returned - a file deleted, written over or set to another mode (the recipe's
    C(chmod a+r) undone), or a cuDNN file put in by hand. An unpacked copy whose files are no
    longer as unpacked is not used (I(unpacked) is false, and the tarball is needed again).
  - When I(link) is a real directory (NVIDIA's packages make C(/usr/local/cuda-X.Y) one), there is
    nothing to switch; the files go into it in place, each by rename, with the record written
    last and an interrupted change redone by the next run.
  - One placement at a time per host - a lock file in I(unpack_dir) - so that a module left running
    by a run killed on the controller, or a pull timer's run during a push, finishes before a
    second run unpacks into the same directory or switches the same links.
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
link:
  description: The link the result is about (its I(link)), so that a result fetched later by
    async_status still names its tree.
  type: str
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
damage:
  description: What differed in the tree from its record, each as its file, a colon and why; empty when nothing did.
  type: list
unpacked:
  description: Whether a complete unpacked copy of the wanted cuDNN is there (null when none is wanted).
  type: bool
"""


# --- the module ------------------------------------------------------------------------------
def plan(params: dict[str, Any]) -> dict[str, Any]:
    """What the link should lead to: {mode, base, current, tree, info}. Reads only."""
    link = params["link"]
    info: dict[str, Any] | None = None
    if params.get("cudnn_sha256"):
        info = {"sha256": checked_sha256(params["cudnn_sha256"], "cudnn_sha256"), "version": params["cudnn_version"]}
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
        elif marker.get("base") == base:
            # No usable unpacked copy to build from (cleaned away, or written over through the hard
            # links): the tree stays as it is, rather than lose its cuDNN, until the cudnn role,
            # which fetches the tarball again, gives it a whole one.
            return {"mode": "link", "base": base, "current": current, "tree": current, "info": None, "keep": True}
    tree = composed_name(base, info) if info else base
    return {"mode": "link", "base": base, "current": current, "tree": tree, "info": info}


def run(module: Any, p: dict[str, Any]) -> dict[str, Any]:
    if module.check_mode and p.get("cudnn_sha256") and not os.path.lexists(p["link"]) and not p.get("base"):
        # Check mode of a whole run: the toolkit role has not made the link, as it would have.
        return {
            "changed": True,
            "needed": True,
            "link": p["link"],
            "mode": "link",
            "tree": None,
            "previous": None,
            "removed": [],
            "damage": [],
            "unpacked": unpacked_info(p["unpack_dir"], checked_sha256(p["cudnn_sha256"], "cudnn_sha256")) is not None,
            "msg": f"{p['link']} does not exist yet: the cuda_toolkit role makes it before the cuDNN goes in",
        }
    want = plan(p)
    info, mode, link = want["info"], want["mode"], p["link"]
    marker_now = read_json(os.path.join(want["current"], MARKER)) or {} if mode != "absent" and want["current"] else {}
    # Each read once: the tree's damage (what complete() judges too) and the unpacked copy.
    damage = (
        tree_damage(want["tree"]) if info is not None and os.path.isfile(os.path.join(want["tree"], MARKER)) else []
    )
    unpacked_now = None if info is None else unpacked_info(p["unpack_dir"], info["sha256"])
    if want.get("keep"):
        changed = False
    elif mode == "in_place":
        pending = os.path.lexists(os.path.join(want["tree"], MARKER + ".partial"))
        changed = marker_now.get("sha256") != (info or {}).get("sha256") or pending
    else:
        changed = want["current"] != want["tree"] or not complete(want["tree"], want["base"], info, damage)
    result: dict[str, Any] = {
        "changed": changed,
        "link": link,
        "tree": want["tree"],
        "previous": want["current"],
        "base": want["base"],
        "mode": mode,
        "removed": [],
        "damage": damage,
        "unpacked": None if info is None else unpacked_now is not None,
        "diff": {
            "before_header": link,
            "after_header": link,
            "before": f"{want['current']} (cuDNN {marker_now.get('version', 'none')})\n"
            + "".join(f"  {line}\n" for line in damage),
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
        full = unpacked_now
        if full is None:
            if not p.get("cudnn_archive"):
                raise TreeError(f"no unpacked cuDNN {info['version']} in {unpacked} and no cudnn_archive to unpack")
            full = unpack(p["cudnn_archive"], info["sha256"], str(info["version"]), p["unpack_dir"])
        restore_modes(unpacked, full)
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
    if info is not None and header_version(want["tree"]) != CudnnVersion(info["version"]).release:
        raise TreeError(
            f"{want['tree']}/include says cuDNN {header_version(want['tree']) or 'nothing'}, not {info['version']}: "
            "another copy was put there by hand or by a package; remove it and run again"
        )
    result["cudnn"] = read_json(os.path.join(want["tree"], MARKER))
    if changed and p["ldconfig"]:
        run_ldconfig(module)
    result["changed"] = changed
    return result


# ldconfig writes the whole cache to /etc/ld.so.cache~ and renames it into place: a run beside
# another (dpkg's trigger in the driver's install, which site.yml runs in the background, or the
# placement of a second host on the same machine) can find its file renamed away ("Renaming of
# /etc/ld.so.cache~ to /etc/ld.so.cache failed"). Each run rebuilds the cache whole, so again is safe.
LDCONFIG_TRIES = 5
LDCONFIG_RACE = "Renaming of"


def run_ldconfig(module: AnsibleModule, pause_s: float = 0.5) -> None:
    """ldconfig, again after a pause where it lost the race for its cache file."""
    for attempt in range(1, LDCONFIG_TRIES + 1):
        rc, _, err = module.run_command(["ldconfig"])
        if rc == 0:
            return
        if LDCONFIG_RACE not in err or attempt == LDCONFIG_TRIES:
            tries = f" ({attempt} tries, another ldconfig ran beside each)" if attempt > 1 else ""
            raise TreeError(f"ldconfig failed (rc {rc}){tries}: {err.strip()}")
        time.sleep(pause_s * attempt)


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
    # A cuDNN to place: one such run at a time on the host (host_lock says why). Check mode writes
    # nothing and takes no lock.
    placing = bool(module.params.get("cudnn_sha256")) and not module.check_mode
    try:
        with host_lock(module.params["unpack_dir"]) if placing else contextlib.nullcontext():
            result = run(module, module.params)
    except (TreeError, OSError, tarfile.TarError) as exc:
        module.fail_json(msg=f"{module.params['link']}: {exc}")
        raise  # fail_json exits; this line is for the type checker
    module.exit_json(**result)


if __name__ == "__main__":
    main()
