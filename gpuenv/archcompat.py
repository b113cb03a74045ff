"""NVIDIA's binary-compatibility rule: which GPUs a build's kernels run on.

The one statement of the rule, for the controller's rules (gpuenv.rules, on the data's arch lists)
and for gpuenv verify on a host (on torch.cuda.get_arch_list()). Standard library only, and
Python 3.8 syntax: verify ships this file to hosts inside its zipapp.

- SASS `sm_XY` runs on compute capability X.m for m >= Y (same major, same or later minor);
- PTX `compute_XY` is JIT-compiled by the driver for any compute capability >= X.Y;
- the architecture-specific targets (`sm_XYa`, `compute_XYa`, from Hopper) run on X.Y only;
- the family-specific targets (`sm_XYf`, `compute_XYf`, from Blackwell and CUDA 12.9) run on the
  family, X.m for m >= Y, and never on another major.
Sources: the CUDA C++ Programming Guide (compute capabilities, feature set compiler targets) and
NVIDIA's "Blackwell and CUDA 12.9 introduce family-specific architecture features" (sm_100f runs on
10.0 and 10.3; sm_103f on 10.3 only).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_ARCH = re.compile(r"(?P<kind>sm|compute)_(?P<major>[0-9]+?)(?P<minor>[0-9])(?P<suffix>[af]?)")


def _runs(cc: tuple[int, int], built: tuple[int, int], suffix: str, *, ptx: bool) -> bool:
    if suffix == "a":
        return built == cc
    if suffix == "f" or not ptx:
        return built[0] == cc[0] and built[1] <= cc[1]
    return built <= cc


def runs_on(cc: str, arch_list: Iterable[str]) -> tuple[bool, str]:
    """Whether a GPU of compute capability `cc` ("8.6") runs a build with `arch_list`
    (torch.cuda.get_arch_list()'s names: "sm_80", "compute_90", "sm_100a"), and why: the SASS
    that runs there, else the PTX the driver JIT-compiles. Names of another form are ignored."""
    major, minor = (int(p) for p in cc.split(".")[:2])
    sass: list[str] = []
    ptx: list[str] = []
    for arch in arch_list:
        m = _ARCH.fullmatch(arch)
        if m is None:
            continue
        is_ptx = m["kind"] == "compute"
        if _runs((major, minor), (int(m["major"]), int(m["minor"])), m["suffix"], ptx=is_ptx):
            (ptx if is_ptx else sass).append(arch)
    if sass:
        return True, f"SASS {', '.join(sass)}"
    if ptx:
        return True, f"PTX {', '.join(ptx)} (JIT-compiled at first use)"
    return False, "no SASS for this major and no PTX at or below it"
