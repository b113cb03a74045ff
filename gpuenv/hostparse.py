"""Parsers of what a host prints or holds, with the standard library alone.

One parser per output: the controller's filters (gpuenv.redist), gpuenv's own Ansible modules on
the hosts (through plugins/module_utils/gpuenv_hostparse.py, a link to this file) and the tests all
read these outputs here, so that a format change is mended in one place. Nothing here may import
anything outside the standard library: Ansible ships this file to hosts that have only Python.
"""

from __future__ import annotations

import re

_PTXAS = re.compile(r"release (?P<release>\d+\.\d+), V(?P<version>\d+\.\d+\.\d+)")


def tool_version(text: str) -> dict[str, str] | None:
    """`ptxas --version` / `nvcc --version` -> {"release": "12.4", "version": "12.4.131"}."""
    match = _PTXAS.search(text)
    return match.groupdict() if match else None


_CUDNN_DEFINE = re.compile(r"^#define\s+CUDNN_(MAJOR|MINOR|PATCHLEVEL)\s+(\d+)", re.MULTILINE)


def cudnn_header_version(text: str) -> str | None:
    """ "9.1.0" from cudnn_version.h (cuDNN 8 and 9) or cudnn.h (cuDNN 7 and before): the
    CUDNN_MAJOR, CUDNN_MINOR and CUDNN_PATCHLEVEL defines."""
    values = dict(_CUDNN_DEFINE.findall(text))
    if not {"MAJOR", "MINOR", "PATCHLEVEL"} <= set(values):
        return None
    return f"{values['MAJOR']}.{values['MINOR']}.{values['PATCHLEVEL']}"


def parse_ldconfig(text: str) -> dict[str, list[str]]:
    """`ldconfig -p` as {soname: [paths, in the loader's order]}."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        name, sep, path = line.strip().partition(" => ")
        if sep:
            found.setdefault(name.split(" (", 1)[0], []).append(path.strip())
    return found
