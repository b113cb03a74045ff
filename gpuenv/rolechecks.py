"""The roles' refusals of their settings, one sentence per setting that is wrong, each naming the
variable, what it holds and what it must be (a role's first assert joins them). Written here rather
than in a task's Jinja so that each refusal is its own tested sentence. Standard library only."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_BUILD = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+")
_CHECKSUM = re.compile(r"sha256:[0-9a-f]{64}")


def _shown(value: Any, width: int) -> str:
    text = str(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def cudnn_problems(settings: Mapping[str, Any], host: str) -> list[str]:
    """The cudnn role's settings: version, cuda_major, source, cuda_trees, tarball_url,
    tarball_path, tarball_checksum, fetch (the role's variables without their cudnn_ prefix)."""
    version, major = str(settings["version"]), str(settings["cuda_major"])
    url, path = str(settings.get("tarball_url") or ""), str(settings.get("tarball_path") or "")
    checksum = str(settings.get("tarball_checksum") or "")
    found = []
    if not _BUILD.fullmatch(version):
        found.append(
            f'cudnn_version "{_shown(version, 30)}" must be a full cuDNN build such as "8.6.0.163" '
            '(the preflight resolves a declared "8.6.0" to it)'
        )
    if not re.fullmatch(r"[0-9]+", major):
        found.append(f'cudnn_cuda_major "{_shown(major, 10)}" must be the CUDA major, a number such as 12')
    if settings["source"] == "tarball" and not settings["cuda_trees"]:
        found.append(
            "cudnn_cuda_trees is empty: a stack without a CUDA toolkit has no tree for a cuDNN tarball "
            "(declare cudnn: none, or a cuda release)"
        )
    if url and path:
        found.append("cudnn_tarball_url and cudnn_tarball_path are both set: name the tarball once")
    if (url or path) and not checksum:
        found.append(
            'the tarball named by cudnn_tarball_url or cudnn_tarball_path needs cudnn_tarball_checksum "sha256:<hex>"'
        )
    if checksum and not (url or path):
        found.append(
            "cudnn_tarball_checksum is set without cudnn_tarball_url or cudnn_tarball_path, the tarball it checks"
        )
    if checksum and not _CHECKSUM.fullmatch(checksum):
        found.append(f'cudnn_tarball_checksum "{_shown(checksum, 30)}" must be "sha256:" and 64 lower-case hex digits')
    if path and not path.startswith("/"):
        found.append(f'cudnn_tarball_path "{_shown(path, 60)}" must be an absolute path on the controller')
    if settings["fetch"] != "controller" and (path or url.startswith("file://")):
        found.append("a tarball on the controller (cudnn_tarball_path, or a file:// URL) needs cudnn_fetch: controller")
    return [f"cudnn on {host}: {problem}; nothing was changed." for problem in found]
