"""The conda way to pin a stack's torch: conda specs per channel style, from
gpuenv/data/conda.yaml, and the old `conda install ... -c pytorch` command read back into a stack.

Styles:
- conda-forge: `pytorch ==X.Y.Z cuda*` (or `cpu*`) with `cuda-version >=X.Y,<X+1` for the CUDA
  runtime; the solver picks the newest build of that major the channel has, whose driver need is
  `__cuda >= X` (conda-forge's cuda-version), and gpuenv's rules already judged the driver.
- pytorch: PyTorch's own channel, up to 2.5.1: `cudatoolkit ==X.Y` up to 1.12, `pytorch-cuda ==X.Y`
  (with -c nvidia) from 1.13, `cpuonly` for the CPU build.
- wheels: Python (and pip) from the channel, torch from PyTorch's wheels as the venv backend gets it,
  for releases no channel carries.
Specs are written as rattler parses them strictly ("pytorch ==2.5.1 cuda*").
"""

from __future__ import annotations

import re
import shlex
from functools import cache
from importlib import resources
from typing import Any

import yaml

from gpuenv import versions

STYLES = ("auto", "conda-forge", "pytorch", "wheels")


class CondaPlanError(ValueError):
    """A stack the chosen channel style cannot serve; the message says what would."""


@cache
def data() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(resources.files("gpuenv").joinpath("data/conda.yaml").read_text())
    return loaded


def _ver(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def conda_forge_serves(torch: str, variant: str, python: str) -> str | None:
    """Why conda-forge cannot serve the stack, or None when it can."""
    entry = data()["conda_forge"]["releases"].get(torch)
    if entry is None:
        return f"conda-forge has no pytorch {torch} (it built {', '.join(data()['conda_forge']['releases'])})"
    low, high = entry["python"]
    if not _ver(low) <= _ver(python) <= _ver(high):
        return f"conda-forge built pytorch {torch} for Python {low} to {high}, not {python}"
    cuda = versions.cuda_from_variant(variant)
    if cuda is not None and not any(c.split(".")[0] == cuda.split(".")[0] for c in entry["cuda"]):
        return (
            f"conda-forge built pytorch {torch} for CUDA {', '.join(entry['cuda'])}, none of them CUDA {cuda}'s major"
        )
    return None


def pytorch_channel_serves(torch: str, variant: str) -> str | None:
    table = data()["pytorch_channel"]
    entry = table["releases"].get(torch)
    if entry is None:
        return (
            f"PyTorch's channel has no pytorch {torch} (its last release there is {table['last']}; "
            "use conda-forge or wheels)"
        )
    cuda = versions.cuda_from_variant(variant)
    offered = sorted(entry.get("cudatoolkit") or entry.get("pytorch_cuda") or [], key=_ver)
    if cuda is not None and cuda not in offered:
        return f"PyTorch's channel built pytorch {torch} for CUDA {', '.join(offered)}, not {cuda}"
    return None


def plan(
    *,
    torch: str,
    variant: str,
    python: str,
    style: str = "auto",
    companions: list[str] | str = "auto",
    packages: list[str] | None = None,
) -> dict[str, Any]:
    """{style, channels (names), specs (conda), companions ({name: version} among the specs), notes}."""
    if style not in STYLES:
        raise CondaPlanError(f"conda style {style!r}: one of {', '.join(STYLES)}")
    if style == "auto":
        style = "conda-forge" if conda_forge_serves(torch, variant, python) is None else "wheels"
    conda_extra = [_conda_spec(p) for p in packages or [] if p.startswith("conda:")]
    specs = [f"python {python}.*"]
    notes: list[str] = []
    pinned: dict[str, str] = {}  # the wheels style's companions are pip's (envplan)
    if style == "conda-forge":
        why = conda_forge_serves(torch, variant, python)
        if why:
            raise CondaPlanError(f"{why}; set pytorch_env_conda_style: wheels (torch from PyTorch's wheels)")
        cuda = versions.cuda_from_variant(variant)
        if cuda is None:
            specs.append(f"pytorch =={torch} cpu*")
        else:
            major = int(cuda.split(".")[0])
            specs += [f"pytorch =={torch} cuda*", f"cuda-version >={cuda},<{major + 1}"]
            built = data()["conda_forge"]["releases"][torch]["cuda"]
            if cuda not in built:
                notes.append(
                    f"conda-forge built pytorch {torch} for CUDA {', '.join(built)}: the solver takes the newest build "
                    f"of CUDA {major} with a runtime of at least {cuda}"
                )
        pinned = _companions(data()["conda_forge"]["releases"][torch], torch, companions, "conda-forge")
        specs += [f"{name} =={version}" for name, version in pinned.items()]
        channels = ["conda-forge"]
    elif style == "pytorch":
        why = pytorch_channel_serves(torch, variant)
        if why:
            raise CondaPlanError(why)
        entry = data()["pytorch_channel"]["releases"][torch]
        cuda = versions.cuda_from_variant(variant)
        specs.append(f"pytorch =={torch}")
        pinned = _companions(entry, torch, companions, "PyTorch's channel")
        specs += [f"{name} =={version}" for name, version in pinned.items()]
        if cuda is None:
            specs.append("cpuonly")
            channels = ["pytorch"]
        elif "cudatoolkit" in entry:
            specs.append(f"cudatoolkit =={cuda}")
            channels = list(entry["cudatoolkit"][cuda])
        else:
            specs.append(f"pytorch-cuda =={cuda}")
            channels = ["pytorch", "nvidia"]
    else:
        specs.append("pip")
        channels = ["conda-forge"]
        notes.append("torch from PyTorch's wheels into the conda prefix (no conda channel carries this build)")
    return {"style": style, "channels": channels, "specs": specs + conda_extra, "companions": pinned, "notes": notes}


def _companions(entry: dict[str, Any], torch: str, companions: list[str] | str, where: str) -> dict[str, str]:
    """Each companion asked for ("auto": each the channel built for this torch) and its version."""
    names = [n for n in ("torchvision", "torchaudio") if entry.get(n)] if companions == "auto" else list(companions)
    out = {}
    for name in names:
        version = entry.get(name)
        if not version:
            raise CondaPlanError(
                f"{where} has no {name} built for pytorch {torch}; drop it from pytorch_env_companions"
            )
        out[name] = str(version)
    return out


def _conda_spec(package: str) -> str:
    """ "conda:einops==0.8.1" -> "einops ==0.8.1" (a stack's packages may name conda packages)."""
    name, _, version = package.removeprefix("conda:").partition("==")
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name) or (
        version and not re.fullmatch(r"[A-Za-z0-9.*+_!-]+", version)
    ):
        raise CondaPlanError(f"{package!r}: write conda packages as conda:name==version")
    return f"{name} =={version}" if version else name


def read_conda_command(command: str) -> dict[str, Any]:
    """The stack a `conda install pytorch==1.12.1 ... cudatoolkit=11.3 -c pytorch` line asks for:
    {torch, variant, companions, channels, style}, the way people copy it from PyTorch's page."""
    words = shlex.split(command)
    channels = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-c", "--channel")]
    pins: dict[str, str] = {}
    flags = set()
    for word in words:
        match = re.fullmatch(r"([a-z][a-z0-9_-]*)==?([0-9][0-9.]*)", word)
        if match:
            pins[match.group(1)] = match.group(2)
        elif re.fullmatch(r"[a-z][a-z0-9_-]*", word):
            flags.add(word)
    torch = pins.get("pytorch") or pins.get("torch")
    if not torch:
        raise CondaPlanError(f"no pytorch==X.Y.Z in {command!r}")
    cuda = pins.get("cudatoolkit") or pins.get("pytorch-cuda")
    if cuda is None and "cpuonly" not in flags:
        raise CondaPlanError(f"{command!r} names neither cudatoolkit=X.Y, pytorch-cuda=X.Y nor cpuonly")
    variant = "cpu" if cuda is None else "cu" + cuda.replace(".", "")
    return {
        "torch": torch,
        "variant": variant,
        "companions": {k: v for k, v in pins.items() if k in ("torchvision", "torchaudio")},
        "channels": channels,
        "style": "pytorch" if "pytorch" in channels else "conda-forge",
    }


def channel_urls(channels: list[str], named: dict[str, str]) -> dict[str, list[str]]:
    """{urls, unknown}: each channel's URL, from `named` (pytorch_env_conda_channel_urls) for a
    channel given by name, itself for one given as a URL (an environment file's); the names
    `named` lacks, which the role refuses."""
    urls, unknown = [], []
    for channel in channels:
        if re.match(r"^[a-z][a-z0-9+.-]*://", channel):
            urls.append(channel)
        elif channel in named:
            urls.append(named[channel])
        else:
            unknown.append(channel)
    return {"urls": urls, "unknown": unknown}
