"""The search behind `gpuenv suggest`: the newest stack that passes every rule, and what bound it.

Candidates come from the compatibility data: torch releases x their CUDA builds x CUDA toolkits x
driver branches x cuDNN builds (or none) x Python, newest torch first. Filters read from the same
data the rules read drop a torch build early (kernels for every GPU, torch's own cuDNN on GPUs
below 7.5, a Python it supports), and every stack that survives is judged by rules.check, the
function check-spec runs, so whatever suggest prints, check-spec accepts. Within a torch build the
toolkit is tried first, then the driver, cuDNN and Python one at a time: each rule reads only a few
of those, and the findings of the preferred value that lost are kept to say what bound each choice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from gpuenv import versions
from gpuenv.compat import CompatData, TorchRelease, TorchVariant
from gpuenv.rules import Finding, Report, check, covers
from gpuenv.stack import parse_stack
from gpuenv.suggest.inputs import Constraints, GpuSpec

# Warnings that come with the GPUs themselves, whatever the stack: they do not count against one.
GPU_INHERENT = frozenset({"gpu-unknown-cc", "gpu-jetson", "gpu-declared-vs-detected"})
DRIVER_RULES = frozenset({"driver-cuda", "driver-torch-cuda", "gpu-driver-eol", "gpu-driver-too-old"})
CUDNN_RULES = frozenset(
    {"cudnn-cuda", "cudnn-unknown", "cudnn-cuda-minor", "cudnn-archive", "gpu-cudnn-sm75", "gpu-cudnn-cc"}
)
PYTHON_RULES = frozenset({"torch-python", "os-python"})

# A search judges a few dozen stacks for a typical fleet; this caps a pathological one (every torch
# build passing only with warnings) at well under a second.
CHECK_BUDGET = 2500


@dataclass
class Candidate:
    """A stack that passed (no errors), with its warnings and what lost to each of its choices."""

    stack: dict[str, Any]
    release: str
    variant: TorchVariant
    warnings: list[Finding]
    lost: dict[str, list[Finding]] = field(default_factory=dict)

    @property
    def avoidable(self) -> int:
        return sum(1 for f in self.warnings if f.rule not in GPU_INHERENT)

    @property
    def key(self) -> tuple[versions.Version, versions.Version]:
        """Newer torch first, then the newer CUDA build of it."""
        return versions.parse(self.release), versions.parse(self.variant.cuda)


class Pick(NamedTuple):
    value: str | None
    report: Report | None
    loss: list[Finding]  # the preferred value's findings when it lost; the errors of all when none passed


@dataclass
class Outcome:
    best: Candidate | None  # the newest without warnings, else the newest with warnings
    warned: Candidate | None  # a newer torch build that passes only with warnings, when best is clean
    exhausted: bool  # the check budget ran out before the search ended


class Search:
    def __init__(self, data: CompatData, gpus: list[GpuSpec], constraints: Constraints) -> None:
        self.data, self.gpus, self.c = data, gpus, constraints
        self.checks = 0
        # Why a torch build (release, variant) found no stack: the errors of its best attempt.
        self.failed: dict[tuple[str, str], list[Finding]] = {}
        self.warned: dict[tuple[str, str], list[Finding]] = {}
        caps = [g.last_driver_branch for g in gpus if g.last_driver_branch is not None]
        if constraints.max_driver_branch is not None:
            caps.append(constraints.max_driver_branch)
        self.cap = min(caps) if caps else None
        branches = {versions.driver_branch(v) for v in data.toolkit_driver.values()}
        branches |= {g.last_driver_branch for g in data.generations if g.last_driver_branch is not None}
        self.branches = sorted(branches)
        self.old_gpu = any(versions.parse(g.cc) < versions.parse(data.cudnn_min_cc) for g in gpus)

    # --- judging ---------------------------------------------------------------------------------
    def judge(self, stack: dict[str, Any]) -> Report:
        """check-spec's own path: the mapping through the schema, then every rule."""
        self.checks += 1
        return check(parse_stack(dict(stack), self.data), self.data, backend=self.c.backend)

    def base(self, release: str, variant: TorchVariant, toolkit: str, driver: str, python: str) -> dict[str, Any]:
        stack: dict[str, Any] = {"gpu": [g.label for g in self.gpus]} if self.gpus else {}
        if self.c.os:
            stack["os"] = self.c.os
        stack.update(
            driver=driver, cuda=toolkit, cudnn="none", python=python, torch=release, torch_variant=variant.name
        )
        return stack

    # --- candidate values, best first ------------------------------------------------------------
    def releases(self) -> list[str]:
        """The newest release --torch allows of each series, newest first: the rules read a release's
        series (its Python range and CUDA builds), so an older release of the same series adds nothing."""
        out: dict[str, str] = {}
        for release in reversed(self.data.torch_releases()):
            if all(b.allows(release) for b in self.c.torch):
                out.setdefault(versions.major_minor(release), release)
        return list(out.values())

    @staticmethod
    def variants(series: TorchRelease) -> list[TorchVariant]:
        return sorted(series.variants.values(), key=lambda v: versions.parse(v.cuda), reverse=True)

    def pythons(self, series: TorchRelease) -> list[str]:
        """A pinned Python (if the release has wheels for it, experimental ones too), else the release's
        range newest first, narrowed to what the OS ships when the venv backend builds from it."""
        low, high = versions.parse(series.python_min)[1], versions.parse(series.python_max)[1]
        supported = [f"3.{minor}" for minor in range(high, low - 1, -1)]
        if self.c.python:
            fits = self.c.python in supported or self.c.python in series.python_experimental
            return [self.c.python] if fits else []
        if self.c.os and self.c.backend == "venv":
            shipped = self.data.os_pythons(self.c.os)[0]
            if shipped:
                return [p for p in supported if p in shipped]
        return supported

    def toolkits(self, variant: TorchVariant) -> list[str]:
        """--cuda's toolkit; else torch's own CUDA X.Y first (extensions build against the CUDA torch was
        built with, and it needs the lowest driver), then the older toolkits of the same major (for a
        driver that cannot go higher), newest update first."""
        if not self.c.toolkit:
            return ["none"]
        known = self.data.known_toolkits()
        if self.c.cuda:
            if self.c.cuda in self.data.toolkit_driver:
                return [self.c.cuda]
            return [t for t in reversed(known) if versions.major_minor(t) == self.c.cuda]
        own = versions.parse(variant.cuda)
        major = [t for t in known if versions.major(t) == own[0]]
        if not major:  # torch 1.12's cu102: gpuenv has no CUDA 10; the oldest 11.x builds extensions least badly
            major = [t for t in known if versions.major(t) == min(versions.major(k) for k in known)]
        same = [t for t in reversed(major) if versions.parse(versions.major_minor(t)) == own]
        older = [t for t in reversed(major) if versions.parse(versions.major_minor(t)) < own]
        return same + older if same or older else list(reversed(major))

    def drivers(self, toolkit: str, variant: TorchVariant) -> list[str]:
        """--driver; else the newest branch allowed: --max-driver-branch, the GPUs' last branch (R580 for
        Pascal and Volta) or the newest in the data. A newer driver runs every older CUDA, and the branch
        is what a host keeps longest. When it is below what the toolkit or torch's CUDA needs, the rules
        judge it (a warning through minor-version compatibility, or an error)."""
        if self.c.driver:
            return [self.c.driver]
        allowed = [b for b in self.branches if self.cap is None or b <= self.cap]
        return [str(b) for b in allowed[-1:]]

    def driver_floor(self, toolkit: str, variant: TorchVariant) -> int:
        """The lowest branch that fully supports the toolkit and torch's CUDA (what driver-cuda and
        driver-torch-cuda compare with); what the explanation names as the lower bound."""
        need = [versions.parse(self.data.toolkit_driver[toolkit])] if toolkit != "none" else []
        runtime = self.data.toolkit_minimum_driver(variant.cuda)
        if runtime:
            need.append(versions.parse(runtime))
        return max(need)[0] if need else min(self.branches)

    def cudnns(self, toolkit: str, variant: TorchVariant) -> list[str]:
        """The cuDNN torch's wheels ship (torch, and extensions built against the system copy, then load
        one cuDNN); else the newest build of that cuDNN major that NVIDIA's matrix lists for the toolkit
        (below 9.11 for GPUs under 7.5); else none, torch's wheels bring their own."""
        if not self.c.system_cudnn:
            return ["none"]
        major = str(versions.major(toolkit))
        out = [variant.cudnn]  # even without a build for this CUDA major: the rules then say so
        torch_cudnn_major = versions.CudnnVersion(variant.cudnn).major
        same = [
            b
            for b in reversed(self.data.cudnn_supporting(versions.major_minor(toolkit), major))
            if versions.CudnnVersion(b).major == torch_cudnn_major
            and not (self.old_gpu and versions.parse(b) >= versions.parse(self.data.cudnn_min_cc_release))
        ]
        official = [b for b in same if not (self.data.cudnn_support(b, major) or {}).get("packager")]
        pick = (official or same)[:1]
        return [*out, *(b for b in pick if b not in out), "none"]

    # --- the search ------------------------------------------------------------------------------
    def run(self) -> Outcome:
        warned: Candidate | None = None
        for release in self.releases():
            series = self.data.torch_series(release)
            assert series is not None  # noqa: S101 - releases() lists the data's own releases
            for variant in self.variants(series):
                if self.checks > CHECK_BUDGET:
                    return Outcome(warned, None, exhausted=True)
                if warned is not None and not self.can_be_clean(variant):
                    continue  # a newer build already passes with warnings; only a clean one can beat it
                found = self.build(release, series, variant)
                if found is None:
                    continue
                if found.avoidable == 0:
                    return Outcome(found, warned, exhausted=False)
                self.warned[(release, variant.name)] = [f for f in found.warnings if f.rule not in GPU_INHERENT]
                warned = warned or found
        return Outcome(warned, None, exhausted=False)

    def top_driver(self) -> str | None:
        """The newest driver the constraints and the GPUs allow, None when nothing caps it."""
        return self.c.driver or (str(self.cap) if self.cap is not None else None)

    def can_be_clean(self, variant: TorchVariant) -> bool:
        """Whether the driver can fully support torch's CUDA runtime (rule driver-torch-cuda, same data)."""
        top, need = self.top_driver(), self.data.toolkit_minimum_driver(variant.cuda)
        return top is None or need is None or versions.driver_satisfies(top, need)

    def prefilter(self, series: TorchRelease, variant: TorchVariant) -> bool:
        """What the data says without a check: kernels for every GPU (rules.covers), torch's own cuDNN
        on GPUs below 7.5, a driver at least at the runtime's minor-version-compatibility floor, a
        Python the release has wheels for, a toolkit to pair it with. why_not() has the rules say it."""
        if not all(covers(variant, g.cc) for g in self.gpus):
            return False
        old_cudnn = versions.parse(variant.cudnn) >= versions.parse(self.data.cudnn_min_cc_release)
        if self.old_gpu and old_cudnn:
            return False
        top, floor = self.top_driver(), self.data.minor_compat_floor.get(variant.cuda.partition(".")[0])
        if top is not None and floor is not None and not versions.driver_satisfies(top, floor):
            return False
        return bool(self.pythons(series)) and bool(self.toolkits(variant))

    def build(self, release: str, series: TorchRelease, variant: TorchVariant) -> Candidate | None:
        """The best stack for one torch build: the first toolkit whose stack has no warnings, else the
        one with the fewest."""
        if not self.prefilter(series, variant):
            return None
        best: Candidate | None = None
        first_loss: list[Finding] = []
        toolkits = self.toolkits(variant)
        for toolkit in toolkits:
            found, findings = self.fill(release, variant, toolkit, self.pythons(series))
            if toolkit == toolkits[0] and (found is None or found.avoidable):
                first_loss = findings
            if found is not None and (best is None or found.avoidable < best.avoidable):
                best = found
            if best is not None and best.avoidable == 0:
                break
            if self.checks > CHECK_BUDGET:
                break
        if best is None:
            self.failed[(release, variant.name)] = first_loss
            return None
        if best.stack["cuda"] != toolkits[0] and first_loss:
            best.lost["cuda"] = first_loss
        return best

    def fill(
        self, release: str, variant: TorchVariant, toolkit: str, pythons: list[str]
    ) -> tuple[Candidate | None, list[Finding]]:
        """Driver, then cuDNN, then Python for one toolkit; the findings that sank it, or its warnings."""
        drivers = self.drivers(toolkit, variant)
        stack = self.base(release, variant, toolkit, drivers[0], pythons[0])
        lost: dict[str, list[Finding]] = {}
        report: Report | None = None
        for key, values, rules in (
            ("driver", drivers, DRIVER_RULES),
            ("cudnn", self.cudnns(toolkit, variant), CUDNN_RULES),
            ("python", pythons, PYTHON_RULES),
        ):
            picked = self.pick(stack, key, values, rules)
            if picked.report is None:
                return None, picked.loss
            report = picked.report
            stack[key] = picked.value
            if picked.loss:
                lost[key] = picked.loss
            if report.errors:  # an error no value of this key mends: the toolkit's or the torch build's
                return None, report.errors
        assert report is not None  # noqa: S101 - the loop ran
        warnings = report.warnings
        return Candidate(stack, release, variant, warnings, lost), [f for f in warnings if f.rule not in GPU_INHERENT]

    def pick(self, stack: dict[str, Any], key: str, values: Iterable[str], rules: frozenset[str]) -> Pick:
        """The first value whose own rules find nothing, else the one they warn least about; with the
        findings of the first (preferred) value when it lost. No report when every value has errors."""
        fallback: tuple[str, Report, int] | None = None
        first: list[Finding] | None = None
        for value in values:
            report = self.judge({**stack, key: value})
            errors = [f for f in report.errors if f.rule in rules]
            warns = [f for f in report.warnings if f.rule in rules]
            if first is None:
                first = errors or warns
            if not errors and not warns:
                return Pick(value, report, first)
            if not errors and (fallback is None or len(warns) < fallback[2]):
                fallback = (value, report, len(warns))
        if fallback is None:
            return Pick(None, None, first or [])
        return Pick(fallback[0], fallback[1], first or [])

    # --- why a torch build lost -------------------------------------------------------------------
    def why_not(self, release: str, variant: TorchVariant) -> list[Finding]:
        """The errors that keep a torch build out (or the warnings that made it second choice): what the
        search recorded, else the check of a representative stack for a build the filters dropped."""
        key = (release, variant.name)
        if key in self.failed or key in self.warned:
            return self.failed.get(key) or self.warned.get(key) or []
        series = self.data.torch_series(release)
        assert series is not None  # noqa: S101 - called with the data's releases
        toolkits = self.toolkits(variant) or self.data.known_toolkits()[-1:]
        pythons = self.pythons(series)
        if not pythons:
            # The pin or the OS keeps this release out: let check name it, with the pin or the release's
            # newest Python (which the OS then refuses).
            pythons = (
                [self.c.python] if self.c.python else Search(self.data, [], replace(self.c, os=None)).pythons(series)
            )
        stack = self.base(release, variant, toolkits[0], self.drivers(toolkits[0], variant)[0], pythons[0])
        report = self.judge(stack)
        return report.errors or [f for f in report.warnings if f.rule not in GPU_INHERENT]
