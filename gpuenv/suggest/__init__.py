"""`gpuenv suggest`: the newest stack that passes every rule for a set of GPUs, and the alternatives
that trade one thing for another.

The answer is one stack for all the GPUs, or, when none fits them all, one stack per GPU group
(generation). Alternatives: a newer torch build that passes only with warnings; a newer torch once a
constraint goes (the driver above all: newest torch against keeping the driver); keeping a driver
the hosts already have (the OS's own packages, or what the fleet runs); one stack per GPU group when
that gives some GPUs a newer torch. Each stack comes with what bound its choices
(gpuenv.suggest.explain). The result is a JSON-able dict; gpuenv.suggest.output prints it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from gpuenv.compat import CompatData, TorchRelease
from gpuenv.report import finding_dict
from gpuenv.rules import Finding
from gpuenv.suggest.explain import explain, phrase, rank
from gpuenv.suggest.inputs import Constraints, GpuSpec
from gpuenv.suggest.search import GPU_INHERENT, Candidate, Search

EXIT_FOUND = 0
EXIT_NONE = 1
EXIT_INVALID = 2

# The constraints an alternative may drop, as (what it is called, the fields it clears).
_RELAXABLE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("driver", ("driver", "max_driver_branch")),
    ("python", ("python",)),
    ("cuda", ("cuda",)),
    ("torch", ("torch",)),
)


@dataclass
class Request:
    gpus: list[GpuSpec]
    constraints: Constraints
    # A driver the hosts could keep: (branch, why, source keys), e.g. the OS's own packages.
    keep_driver: tuple[str, str, list[str]] | None = None
    notes: list[str] = field(default_factory=list)


def groups(gpus: list[GpuSpec]) -> dict[str, list[GpuSpec]]:
    """GPU groups by generation, oldest first: what one stack per group is made for."""
    out: dict[str, list[GpuSpec]] = {}
    for gpu in sorted(gpus, key=lambda g: tuple(int(p) for p in g.cc.split("."))):
        out.setdefault(gpu.group, []).append(gpu)
    return out


def summary(stack: dict[str, Any]) -> str:
    return (
        f"torch {stack['torch']}+{stack['torch_variant']}, Python {stack['python']}, CUDA {stack['cuda']}, "
        f"cuDNN {stack['cudnn']}, driver {stack['driver']}"
    )


def _entry(search: Search, cand: Candidate, group: str | None, gpus: list[GpuSpec]) -> dict[str, Any]:
    document: dict[str, Any] = {"gpu_stack": dict(cand.stack)}
    if search.c.backend != "venv":
        # check-spec reads the backend beside gpu_stack (os-python applies to venv only).
        document["pytorch_env_backend"] = search.c.backend
    return {
        "group": group,
        "gpus": [{"label": g.label, "cc": g.cc, "generation": g.generation, "hosts": list(g.hosts)} for g in gpus],
        "document": document,
        "summary": summary(cand.stack),
        "bounds": [b.as_dict() for b in explain(search, cand)],
        "warnings": [finding_dict(f) for f in cand.warnings],
    }


def _trade(old: dict[str, Any], new: dict[str, Any]) -> str:
    names = {"torch": "torch", "python": "Python", "cuda": "CUDA", "cudnn": "cuDNN", "driver": "driver"}
    parts = []
    for key, name in names.items():
        before, after = old[key], new[key]
        if key == "torch":
            before, after = f"{before}+{old['torch_variant']}", f"{after}+{new['torch_variant']}"
        if before != after:
            parts.append(f"{name} {after} instead of {before}")
    return "; ".join(parts) or "the same stack"


class Planner:
    def __init__(self, data: CompatData, request: Request) -> None:
        self.data, self.request = data, request
        self.checks = 0

    def search(self, gpus: list[GpuSpec], constraints: Constraints) -> tuple[Search, Candidate | None, Any]:
        search = Search(self.data, gpus, constraints)
        outcome = search.run()
        self.checks += search.checks
        return search, outcome.best, outcome

    def _series(self, release: str) -> TorchRelease:
        series = self.data.torch_series(release)
        assert series is not None  # noqa: S101 - called with the data's releases
        return series

    def relaxed(self, constraints: Constraints) -> Iterator[tuple[str, str, Constraints]]:
        """Each constraint the user set dropped in turn, and the conda backend where the OS's Python
        (venv) is one: (name, how it reads, the constraints)."""
        flags = constraints.flags()
        for name, fields in _RELAXABLE:
            given = [flags[f] for f in fields if f in flags]
            if given:
                cleared = replace(constraints, **{f: _default(f) for f in fields})
                yield name, f"without {' '.join(given)}", cleared
        if constraints.os and constraints.backend == "venv" and not constraints.python:
            yield (
                "backend",
                "with --backend conda (its own Python, not the OS's)",
                replace(constraints, backend="conda"),
            )

    def run(self) -> dict[str, Any]:
        started = time.perf_counter()
        req = self.request
        fleet, best, outcome = self.search(req.gpus, req.constraints)
        by_group = groups(req.gpus)
        result: dict[str, Any] = {
            "verdict": None,
            "exit_code": None,
            "gpus": [
                {"label": g.label, "cc": g.cc, "generation": g.generation, "hosts": list(g.hosts)} for g in req.gpus
            ],
            "constraints": req.constraints.flags(),
            "notes": list(req.notes),
            "stacks": [],
            "alternatives": [],
            "problems": [],
        }
        if best is not None:
            result.update(verdict="found", exit_code=EXIT_FOUND)
            result["stacks"].append(_entry(fleet, best, None, req.gpus))
            if outcome.exhausted:
                result["notes"].append("the search stopped at its check budget; an older stack may exist")
            result["alternatives"] = self.alternatives(fleet, best, outcome.warned, by_group)
        elif len(by_group) > 1:
            self.per_group(fleet, by_group, result)
        else:
            result.update(verdict="none", exit_code=EXIT_NONE)
            result["problems"] = self.why_none(fleet, req.constraints, req.gpus)
        result["checks"] = self.checks
        result["seconds"] = round(time.perf_counter() - started, 3)
        return result

    # --- alternatives ------------------------------------------------------------------------------
    def alternatives(
        self, fleet: Search, best: Candidate, warned: Candidate | None, by_group: dict[str, list[GpuSpec]]
    ) -> list[dict[str, Any]]:
        req, out = self.request, []
        if warned is not None and warned.key > best.key:
            title = "newer torch that check-spec accepts with warnings (exit 0): read them before choosing it"
            out.append(self._alt("warnings", title, fleet, warned, best))
        for name, how, constraints in self.relaxed(req.constraints):
            search, found, _ = self.search(req.gpus, constraints)
            if found is not None and found.key > best.key:
                title = f"newest torch {how}" + (": upgrade the driver" if name == "driver" else "")
                out.append(self._alt(f"without-{name}", title, search, found, best))
        keep = req.keep_driver
        if keep and not req.constraints.driver and keep[0] != best.stack["driver"]:
            search, found, _ = self.search(req.gpus, replace(req.constraints, driver=keep[0], max_driver_branch=None))
            if found is not None:
                title = f"keep driver {keep[0]} ({keep[1]})"
                out.append(self._alt("keep-driver", title, search, found, best) | {"sources": keep[2]})
        if len(by_group) > 1:
            stacks, newer = [], False
            for name, gpus in by_group.items():
                search, found, _ = self.search(gpus, req.constraints)
                if found is not None:
                    newer = newer or found.key > best.key
                    stacks.append(_entry(search, found, name, gpus) | {"trade": _trade(best.stack, found.stack)})
            if newer:
                out.append(
                    {
                        "kind": "per-group",
                        "title": "one stack per GPU group: the newer GPUs get a newer torch",
                        "stacks": stacks,
                    }
                )
        return out

    def _alt(self, kind: str, title: str, search: Search, found: Candidate, best: Candidate) -> dict[str, Any]:
        entry = _entry(search, found, None, self.request.gpus) | {"trade": _trade(best.stack, found.stack)}
        return {"kind": kind, "title": title, "stacks": [entry]}

    # --- no single stack -----------------------------------------------------------------------
    def per_group(self, fleet: Search, by_group: dict[str, list[GpuSpec]], result: dict[str, Any]) -> None:
        """One stack per GPU group, and why no single one fits: each group's stack judged on the others."""
        found_all = True
        for name, gpus in by_group.items():
            search, found, _ = self.search(gpus, self.request.constraints)
            if found is None:
                found_all = False
                result["problems"] += [{"group": name, **p} for p in self.why_none(search, search.c, gpus)]
                continue
            result["stacks"].append(_entry(search, found, name, gpus))
        result.update(verdict="per-group" if found_all else "none", exit_code=EXIT_FOUND if found_all else EXIT_NONE)
        everyone = [g.label for g in self.request.gpus]
        for entry in result["stacks"]:
            stack = {**entry["document"]["gpu_stack"], "gpu": everyone}
            errors = [f for f in fleet.judge(stack).errors if f.rule not in GPU_INHERENT]
            build = f"torch {stack['torch']}+{stack['torch_variant']}, driver {stack['driver']}"
            name = f"the {entry['group']} stack ({build})"
            for f in rank(errors)[:2]:
                result["problems"].append(_problem(phrase(f"{name} on the other GPUs: ", f), f, entry["group"]))

    def why_none(self, search: Search, constraints: Constraints, gpus: list[GpuSpec]) -> list[dict[str, Any]]:
        """The reason per bound: what keeps out the newest torch allowed and the newest the Python pin
        or the OS allows, and what dropping each constraint would give."""
        problems: list[dict[str, Any]] = []
        releases = search.releases()
        if not releases:
            reason = f"{constraints.flags()['torch']} matches no torch release in gpuenv's data"
            problems.append(
                {
                    "reason": f"{reason} ({self.data.torch_releases()[-1]} is the newest)",
                    "rule": None,
                    "sources": ["pypi_torch"],
                }
            )
        fitting = [r for r in releases if search.pythons(self._series(r))][:1]
        for release in dict.fromkeys(releases[:1] + fitting):
            for variant in search.variants(self._series(release)):
                for f in rank(search.why_not(release, variant))[:2]:
                    problems.append(_problem(phrase(f"torch {release}+{variant.name}: ", f), f))
        for _name, how, relaxed in self.relaxed(constraints):
            _, found, _ = self.search(gpus, relaxed)
            gives = f"{summary(found.stack)} would fit" if found else "still no stack"
            problems.append({"reason": f"{how}: {gives}", "rule": None, "sources": []})
        return problems


def _problem(reason: str, f: Finding, group: str | None = None) -> dict[str, Any]:
    return {"reason": reason, "rule": f.rule, "sources": list(f.sources), **({"group": group} if group else {})}


def _default(name: str) -> Any:
    return {"torch": (), "backend": "venv", "system_cudnn": True}.get(name)


def suggest(data: CompatData, request: Request) -> dict[str, Any]:
    return Planner(data, request).run()
