"""Version strings as they appear in GPU stacks, compared numerically.

NVIDIA driver versions ("550.54.15", "570.26"), CUDA toolkits ("12.4.1"), cuDNN releases
("9.1.0.70") and compute capabilities ("8.9") are all dotted integers. String comparison gets
them wrong ("9.10" < "9.9"), so everything goes through :func:`parse`.
"""

from __future__ import annotations

import re
from functools import lru_cache

from gpuenv.module_utils import gpuenv_cudnn_version

# A cuDNN version's parts (major, release, build), parsed once: defined where gpuenv's modules on
# the hosts can import it too.
CudnnVersion = gpuenv_cudnn_version.CudnnVersion

_DOTTED = re.compile(r"^[0-9]+(\.[0-9]+)*$")

Version = tuple[int, ...]


# The rules parse the same few hundred strings over and over (every toolkit in the data, per check),
# and `gpuenv suggest` runs the rules on many candidate stacks: caching the parse makes a check
# about nine times faster. Tuples are immutable, so sharing them is safe; errors are not cached.
@lru_cache(maxsize=4096)
def parse(text: str) -> Version:
    """Turn "12.4.1" into (12, 4, 1); raise ValueError for anything that is not dotted digits."""
    if not _DOTTED.match(text):
        raise ValueError(f"not a dotted version: {text!r}")
    return tuple(int(part) for part in text.split("."))


def is_dotted(text: str) -> bool:
    return bool(_DOTTED.match(text))


def fmt(version: Version) -> str:
    return ".".join(str(part) for part in version)


def major(text: str) -> int:
    return parse(text)[0]


def major_minor(text: str) -> str:
    parts = parse(text)
    return f"{parts[0]}.{parts[1] if len(parts) > 1 else 0}"


def driver_branch(driver: str) -> int:
    """The branch of a driver version or branch: "550.54.15" and "550" are both branch 550."""
    return parse(driver)[0]


def driver_satisfies(driver: str, minimum: str) -> bool:
    """Whether a declared driver (an exact version or a branch) meets a minimum version.

    A branch ("550") stands for the newest driver of that branch, which is what the driver role
    installs; it meets any minimum of the same branch. An exact version is compared in full.
    """
    if "." not in driver:
        return driver_branch(driver) >= driver_branch(minimum)
    return parse(driver) >= parse(minimum)


def cuda_from_variant(variant: str) -> str | None:
    """The CUDA major.minor of a torch wheel variant: cu124 -> "12.4", cu118 -> "11.8"."""
    match = re.fullmatch(r"cu([0-9]+)([0-9])", variant)
    if not match:
        return None
    return f"{int(match.group(1))}.{match.group(2)}"


def variant_from_cuda(cuda: str) -> str:
    """The torch wheel variant named after a CUDA version: "12.4.1" -> "cu124"."""
    parts = parse(cuda)
    return f"cu{parts[0]}{parts[1] if len(parts) > 1 else 0}"
