"""Every check of gpuenv verify, in the report's order, and how a run goes through them. A new check
is declared in its area's module (`@CHECKS.add(id, title)`); a new area is one more entry here."""

from __future__ import annotations

from typing import Any

from gpuenv.verify import compute, cuda_tree, distributed, driver, host, nvml, services, torchenv
from gpuenv.verify.base import Context, Spec
from gpuenv.verify.deadline import Watchdog
from gpuenv.verify.model import Check

CHECKS: list[Spec] = [
    *driver.CHECKS.specs,
    *torchenv.CHECKS.specs,
    *cuda_tree.CHECKS.specs,
    *host.CHECKS.specs,
    *compute.CHECKS.specs,
    *nvml.CHECKS.specs,
    *services.CHECKS.specs,
    *distributed.CHECKS.specs,
]
_DISTRIBUTED = distributed.CHECKS.specs


def run(specs: list[Spec], ctx: Context, watchdog: Watchdog | None = None) -> list[Check]:
    """The checks' results in the order given; the checks that fork run first (see Spec.forks).
    The watchdog, where there is one, is told which check runs and what each found."""
    found = {}
    for spec in sorted(specs, key=lambda s: not s.forks):
        if watchdog is not None:
            watchdog.begin(spec.id)
        found[spec.id] = spec.run(ctx)
        if watchdog is not None:
            watchdog.finish(found[spec.id])
    return [found[s.id] for s in specs]


def run_checks(ctx: Context, *, distributed: bool = True, watchdog: Watchdog | None = None) -> list[Check]:
    """A host's checks: all of them, or all but the all-reduce (--no-distributed)."""
    return run([s for s in CHECKS if distributed or s not in _DISTRIBUTED], ctx, watchdog)


def cpu_selftest(torch: Any) -> list[Check]:
    """The compute checks' bodies on the CPU device with this torch (--cpu-selftest)."""
    return run(compute.CHECKS.specs, Context(torch=torch, device=torch.device("cpu")))
