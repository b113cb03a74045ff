"""What `gpuenv suggest` is asked: the GPUs and the constraints, checked before any search.

Every refusal here is bad input (exit 2) and says what is wrong and how to write it instead. A
constraint that is well formed but leaves no stack is not refused here: the search says why (exit 1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuenv import versions
from gpuenv.compat import CompatData
from gpuenv.rules import gpu_cc
from gpuenv.stack import FIELDS

BACKENDS = ("venv", "conda")


class InputError(Exception):
    """Bad input to suggest (exit 2): one sentence per problem, each with its fix."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class GpuSpec:
    label: str  # as given (a model, "8.6" or "sm_86"): the stack file's gpu list keeps it
    cc: str
    generation: str | None
    last_driver_branch: int | None
    hosts: tuple[str, ...] = ()  # --inventory: the hosts that have it

    @property
    def group(self) -> str:
        """The GPU group one stack per group is made for: the generation, else the compute capability."""
        return self.generation or f"cc {self.cc}"


@dataclass(frozen=True)
class TorchBound:
    op: str  # == != >= <= > <
    version: versions.Version
    prefix: bool  # "==2.5" and "==2.5.*" mean any 2.5.x release
    text: str

    def allows(self, release: str) -> bool:
        have = versions.parse(release)
        if self.op in ("==", "!=") and self.prefix:
            same = have[: len(self.version)] == self.version
            return same if self.op == "==" else not same
        want = _pad(self.version)
        return {
            "==": have == want,
            "!=": have != want,
            ">=": have >= want,
            "<=": have <= want,
            ">": have > want,
            "<": have < want,
        }[self.op]


@dataclass(frozen=True)
class Constraints:
    os: str | None = None
    driver: str | None = None  # a branch or an exact version, fixed
    max_driver_branch: int | None = None
    torch: tuple[TorchBound, ...] = ()
    python: str | None = None
    cuda: str | None = None  # X.Y (its newest update) or X.Y.Z
    backend: str = "venv"
    system_cudnn: bool = True
    # --no-toolkit: no system CUDA toolkit (cuda: none), only torch's own CUDA runtime and cuDNN.
    toolkit: bool = True

    def flags(self) -> dict[str, str]:
        """Each constraint as it is written on the command line, by the field it sets."""
        out = {}
        if self.os:
            out["os"] = f"--os {self.os}"
        if self.driver:
            out["driver"] = f"--driver {self.driver}"
        if self.max_driver_branch is not None:
            out["max_driver_branch"] = f"--max-driver-branch {self.max_driver_branch}"
        if self.torch:
            out["torch"] = f"--torch '{','.join(b.text for b in self.torch)}'"
        if self.python:
            out["python"] = f"--python {self.python}"
        if self.cuda:
            out["cuda"] = f"--cuda {self.cuda}"
        if self.backend != "venv":
            out["backend"] = f"--backend {self.backend}"
        if not self.system_cudnn and self.toolkit:  # --no-toolkit implies it
            out["system_cudnn"] = "--no-system-cudnn"
        if not self.toolkit:
            out["toolkit"] = "--no-toolkit"
        return out


def _pad(version: versions.Version) -> versions.Version:
    return (*version, *(0,) * (3 - len(version)))


_CLAUSE = re.compile(r"\s*(==|!=|>=|<=|>|<)?\s*([0-9]{1,3}(?:\.[0-9]{1,4}){0,2})(\.\*)?\s*")


def parse_torch(spec: str, data: CompatData) -> tuple[tuple[TorchBound, ...], list[str]]:
    """'==2.5.1', '>=2.3', '<2.6', '>=2.3,<2.6', '2.5.1' (==), '==2.5' or '==2.5.*' (any 2.5.x)."""
    bounds, problems = [], []
    for clause in spec.split(","):
        match = _CLAUSE.fullmatch(clause)
        if not match:
            problems.append(
                f"--torch {spec!r}: {clause.strip()!r} is not a version bound; write ==2.5.1, >=2.3, <2.6 "
                "or several joined by commas (>=2.3,<2.6)"
            )
            continue
        op, text, star = match.group(1) or "==", match.group(2), bool(match.group(3))
        version = versions.parse(text)
        prefix = star or (op in ("==", "!=") and len(version) < 3)
        if op == "==" and not prefix and text not in data.torch_releases():
            series = data.torch.get(versions.major_minor(text))
            known = (
                f"torch {series.series} has {', '.join(series.releases)}"
                if series
                else f"the data has torch {data.torch_releases()[0]} to {data.torch_releases()[-1]}"
            )
            problems.append(f"--torch {spec!r}: torch {text} is not in gpuenv's data ({known}); pick one of those")
            continue
        bounds.append(TorchBound(op, version, prefix, f"{op}{text}{'.*' if star else ''}"))
    return tuple(bounds), problems


def parse_gpus(labels: list[str], data: CompatData) -> tuple[list[GpuSpec], list[str]]:
    """Each GPU as the rules read it (rules.gpu_cc); an unknown model is bad input."""
    gpus: list[GpuSpec] = []
    problems = []
    for label in dict.fromkeys(label.strip() for label in labels):
        cc = gpu_cc(label, data)
        if cc is None:
            problems.append(
                f"GPU {label!r} is not a model gpuenv knows; give its compute capability instead, e.g. --gpu 8.9 "
                "(nvidia-smi --query-gpu=name,compute_cap --format=csv prints it; NVIDIA lists them at "
                "https://developer.nvidia.com/cuda-gpus)"
            )
            continue
        if data.generation_for_cc(cc) is None:
            known = ", ".join(f"{g.cc_min}-{g.cc_max} {g.name}" for g in data.generations)
            problems.append(
                f"GPU {label!r}: compute capability {cc} belongs to no GPU generation gpuenv knows ({known}); "
                "check the number (nvidia-smi --query-gpu=name,compute_cap --format=csv prints it)"
            )
            continue
        gpus.append(gpu_spec(label, cc, data))
    return gpus, problems


def gpu_spec(label: str, cc: str, data: CompatData, hosts: tuple[str, ...] = ()) -> GpuSpec:
    cc = versions.fmt(versions.parse(cc))
    gen = data.generation_for_cc(cc)
    return GpuSpec(label, cc, gen.name if gen else None, gen.last_driver_branch if gen else None, hosts)


def parse_constraints(
    data: CompatData,
    *,
    os: str | None = None,
    driver: str | None = None,
    max_driver_branch: str | None = None,
    torch: str | None = None,
    python: str | None = None,
    cuda: str | None = None,
    backend: str = "venv",
    system_cudnn: bool = True,
    toolkit: bool = True,
) -> Constraints:
    """The constraints, or InputError naming every malformed or unknown one."""
    problems = []
    if os is not None and os not in data.os:
        problems.append(f"--os {os!r} is not an OS gpuenv knows; use one of {', '.join(data.os)}")
    if driver is not None and not re.fullmatch(FIELDS["driver"].pattern, driver):
        problems.append(f"--driver {driver!r} is not a driver branch (535) or version (535.247.01)")
    cap = None
    if max_driver_branch is not None:
        if re.fullmatch(r"[0-9]{3}", max_driver_branch):
            cap = int(max_driver_branch)
        else:
            problems.append(f"--max-driver-branch {max_driver_branch!r} is not a driver branch such as 535")
    fixed = driver is not None and re.fullmatch(FIELDS["driver"].pattern, driver)
    if cap is not None and fixed and versions.driver_branch(str(driver)) > cap:
        problems.append(
            f"--driver {driver} is above --max-driver-branch {cap}; give one of them, or a driver within the cap"
        )
    bounds: tuple[TorchBound, ...] = ()
    if torch is not None:
        bounds, torch_problems = parse_torch(torch, data)
        problems.extend(torch_problems)
    if python is not None and not re.fullmatch(FIELDS["python"].pattern, python):
        problems.append(f"--python {python!r} is not a Python version such as 3.11 (major.minor)")
    if cuda is not None:
        if not re.fullmatch(r"[0-9]{1,3}\.[0-9]{1,3}(\.[0-9]{1,4})?", cuda):
            problems.append(f"--cuda {cuda!r} is not a CUDA release such as 12.4 or 12.4.1")
        elif data.resolve_toolkit(cuda) is None:
            known = data.known_toolkits()
            problems.append(
                f"--cuda {cuda} is not in gpuenv's data; use a CUDA release from {known[0]} to {known[-1]} "
                "(12.4 means its newest update)"
            )
    if backend not in BACKENDS:
        problems.append(f"--backend {backend!r}: use venv or conda")
    if not toolkit and cuda is not None:
        problems.append(f"--no-toolkit and --cuda {cuda} contradict each other: give one of them")
    if problems:
        raise InputError(problems)
    return Constraints(
        os=os,
        driver=driver,
        max_driver_branch=cap,
        torch=bounds,
        python=python,
        cuda=cuda,
        backend=backend,
        system_cudnn=system_cudnn and toolkit,
        toolkit=toolkit,
    )
