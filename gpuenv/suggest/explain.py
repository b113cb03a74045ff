"""What bound each choice of a suggested stack, in the rules' own words.

A choice is bound by the next better value that lost: the next newer torch release, a newer CUDA
build of the same release, a newer Python, a driver branch outside the range. Each bound is the
finding rules.check gives for that value (rule id, message, source keys), or, where the choice is a
policy or the user's constraint, says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuenv import versions
from gpuenv.rules import ERROR, Finding
from gpuenv.suggest.search import DRIVER_RULES, PYTHON_RULES, Candidate, Search

# Per lost value, the finding that explains it best: errors before warnings, and the rules a user
# cannot choose around (the torch build, Python, torch's runtime) before those of a toolkit or cuDNN
# the search would have picked differently. The rest repeat the story for other GPUs or keys.
_PER_VALUE = 1
_RANK = (
    "gpu-torch-arch",
    "gpu-cudnn-sm75",
    "torch-python",
    "os-python",
    "driver-torch-cuda",
    "gpu-driver-eol",
    "gpu-driver-too-old",
    "gpu-cuda-toolkit",
    "driver-cuda",
)


@dataclass
class Bound:
    choice: str  # the gpu_stack key
    value: str
    reason: str
    rule: str | None = None
    sources: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "choice": self.choice,
            "value": self.value,
            "reason": self.reason,
            "rule": self.rule,
            "sources": self.sources,
        }


def rank(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (f.severity != ERROR, _RANK.index(f.rule) if f.rule in _RANK else len(_RANK)))


def phrase(prefix: str, f: Finding) -> str:
    """ "torch 2.8.0+cu129: " and a finding -> one sentence; an error whose message names the subject
    already drops the prefix ("torch 2.8.0+cu129: torch 2.8.0+cu129 has no kernels ..." says it twice)."""
    subject = prefix.rstrip(": ")
    if f.severity != ERROR:
        return f"{subject + ' ' if subject else ''}passes only with a warning: {f.message}"
    return f.message if subject and subject in f.message else f"{prefix}{f.message}"


def _from(choice: str, value: str, prefix: str, findings: list[Finding]) -> list[Bound]:
    out = []
    for f in rank(findings)[:_PER_VALUE]:
        out.append(Bound(choice, value, phrase(prefix, f), f.rule, list(f.sources)))
    return out


def explain(search: Search, cand: Candidate) -> list[Bound]:
    return [
        *_torch(search, cand),
        *_variant(search, cand),
        *_toolkit(search, cand),
        *_driver(search, cand),
        *_cudnn(search, cand),
        *_python(search, cand),
    ]


def _torch(search: Search, cand: Candidate) -> list[Bound]:
    data, release = search.data, cand.release
    newer = [r for r in data.torch_releases() if versions.parse(r) > versions.parse(release)]
    if not newer:
        return [Bound("torch", release, "the newest release in gpuenv's data", None, ["pypi_torch"])]
    out = []
    excluded = [r for r in newer if not all(b.allows(r) for b in search.c.torch)]
    if excluded:
        listed = ", ".join(excluded[:3]) + (f" and {len(excluded) - 3} more" if len(excluded) > 3 else "")
        out.append(Bound("torch", release, f"{search.c.flags()['torch']} excludes torch {listed}"))
    allowed = search.releases()
    index = allowed.index(release) if release in allowed else 0
    if index > 0:
        nxt = allowed[index - 1]  # the newest release of the next newer series
        series = data.torch_series(nxt)
        assert series is not None  # noqa: S101 - releases() lists the data's own releases
        for variant in search.variants(series):
            out.extend(_from("torch", release, f"torch {nxt}+{variant.name}: ", search.why_not(nxt, variant)))
    return out


def _variant(search: Search, cand: Candidate) -> list[Bound]:
    series = search.data.torch_series(cand.release)
    assert series is not None  # noqa: S101 - a candidate's release is in the data
    name = cand.variant.name
    newer = [v for v in search.variants(series) if versions.parse(v.cuda) > versions.parse(cand.variant.cuda)]
    if not newer:
        return [
            Bound("torch_variant", name, f"the newest CUDA build of torch {cand.release}", None, list(series.sources))
        ]
    out = []
    for variant in newer:
        prefix = f"torch {cand.release}+{variant.name}: "
        out.extend(_from("torch_variant", name, prefix, search.why_not(cand.release, variant)))
    return out


def _toolkit(search: Search, cand: Candidate) -> list[Bound]:
    toolkit, variant = cand.stack["cuda"], cand.variant
    if not search.c.toolkit:
        return [Bound("cuda", toolkit, f"--no-toolkit: torch's wheels bring their own CUDA {variant.cuda} runtime")]
    if search.c.cuda:
        newest = " (its newest update in the data)" if search.c.cuda != toolkit else ""
        return [Bound("cuda", toolkit, f"{search.c.flags()['cuda']}{newest}", None, ["nv_rn_table3"])]
    if "cuda" in cand.lost:
        first = search.toolkits(variant)[0]
        return _from("cuda", toolkit, f"CUDA {first} (torch's own CUDA) ", cand.lost["cuda"])
    own = versions.major_minor(toolkit) == variant.cuda
    what = f"torch's own CUDA {variant.cuda}" if own else f"gpuenv has no CUDA {variant.cuda}; the nearest toolkit"
    return [
        Bound(
            "cuda",
            toolkit,
            f"{what}, its newest update in the data: CUDA extensions need a toolkit of torch's CUDA major, and "
            "torch's own X.Y needs no newer driver than torch does",
            "toolkit-torch-major",
            ["pt_cpp_extension", "nv_rn_table3"],
        )
    ]


def _driver(search: Search, cand: Candidate) -> list[Bound]:
    stack, driver = cand.stack, cand.stack["driver"]
    flags = search.c.flags()
    if search.c.driver:
        out = [Bound("driver", driver, flags["driver"])]
    elif search.c.max_driver_branch is not None and search.cap == search.c.max_driver_branch:
        out = [Bound("driver", driver, f"the newest branch {flags['max_driver_branch']} allows")]
    elif search.cap is not None:
        above = [b for b in search.branches if b > search.cap][:1]
        findings = [f for f in search.judge({**stack, "driver": str(above[0])}).errors if f.rule in DRIVER_RULES]
        out = _from("driver", driver, "the newest branch these GPUs allow; ", findings) if above else []
    else:
        out = [
            Bound(
                "driver",
                driver,
                "the newest branch in gpuenv's data: a newer driver runs every older CUDA",
                None,
                ["nv_rn_table3"],
            )
        ]
    warned = [f for f in cand.warnings if f.rule in DRIVER_RULES]
    if warned:
        return out + _from("driver", driver, "", warned)
    floor = search.driver_floor(stack["cuda"], cand.variant)
    below = [b for b in search.branches if b < floor][-1:]
    if below and versions.driver_branch(driver) > floor and not search.c.driver:
        findings = [f for f in search.judge({**stack, "driver": str(below[0])}).findings if f.rule in DRIVER_RULES]
        out += _from("driver", driver, f"branches down to {floor} also pass; driver {below[0]}: ", findings)
    return out


def _cudnn(search: Search, cand: Candidate) -> list[Bound]:
    data, chosen, variant = search.data, cand.stack["cudnn"], cand.variant
    if not search.c.system_cudnn:
        flag = "--no-system-cudnn" if search.c.toolkit else "--no-toolkit"
        return [Bound("cudnn", chosen, f"{flag}: torch's wheels bring their own cuDNN {variant.cudnn}")]
    major = str(versions.major(cand.stack["cuda"]))
    support = data.cudnn_support(chosen, major) if chosen != "none" else None
    matrix = f"; NVIDIA lists CUDA {support['cuda'][0]} to {support['cuda'][1]} for it" if support else ""
    sources = ["pypi_cudnn", *([support["source"]] if support else [])]
    if chosen == variant.cudnn:
        return [
            Bound(
                "cudnn",
                chosen,
                f"the cuDNN torch {cand.release}+{variant.name}'s wheels ship: torch and "
                f"extensions built against the system copy load one cuDNN{matrix}",
                None,
                sources,
            )
        ]
    out = _from("cudnn", chosen, f"torch's own cuDNN {variant.cudnn}: ", cand.lost.get("cudnn", []))
    if chosen != "none":
        out.append(
            Bound(
                "cudnn",
                chosen,
                f"the newest build of cuDNN {chosen.partition('.')[0]} for CUDA "
                f"{versions.major_minor(cand.stack['cuda'])}{matrix}",
                None,
                sources,
            )
        )
    return out


def _python(search: Search, cand: Candidate) -> list[Bound]:
    python = cand.stack["python"]
    if search.c.python:
        warned = [f for f in cand.warnings if f.rule in PYTHON_RULES]
        return [Bound("python", python, search.c.flags()["python"]), *_from("python", python, "", warned)]
    newer = f"3.{versions.parse(python)[1] + 1}"
    findings = [f for f in search.judge({**cand.stack, "python": newer}).findings if f.rule in PYTHON_RULES]
    if not findings:  # the OS ships no newer one that torch supports, or the data's ranges end here
        return [Bound("python", python, f"the newest Python torch {cand.release} supports")]
    return _from("python", python, f"Python {newer}: ", findings)
