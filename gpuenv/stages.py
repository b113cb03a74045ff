"""site.yml's stages, named by its plays.

site.yml imports one playbook per step, and each brings one play (verify.yml two); a stage is what a
person or a chart calls a group of them: the services beside the driver (persistence daemon, Fabric
Manager, container toolkit) count with the driver, the record of the stack with the preflight. The
benchmarks (bench/) sum play times per stage, the timing callback records each play's stage, and
the progress callback (gpuenv_progress) shows a host's stage; all read this table, so a play
renamed in playbooks/ is renamed here once (gpuenv/tests/test_progress_callback.py checks that
every play of site.yml has its stage).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("preflight", ("Preflight of the declared GPU stack", "Record the checked stack on each host")),
    ("driver", ("Install the NVIDIA driver", "Install the GPU services")),
    ("cuda", ("Install the CUDA toolkit and cuDNN",)),
    ("env", ("Build the PyTorch environment",)),
    ("verify", ("Verify each host", "Write the fleet report")),
)

_BY_PLAY = {play: stage for stage, plays in STAGES for play in plays}


def stage_of(play_name: str) -> str | None:
    """The stage a play of site.yml belongs to; None for a play of another playbook."""
    return _BY_PLAY.get(play_name.strip())


def stage_times(record: Mapping[str, Any]) -> dict[str, float]:
    """Seconds per stage, every stage present, from a timing callback record (GPUENV_TIMING_FILE).

    By play name rather than the record's own "stage": records written before it had one (the
    saved benchmark results) sum the same way.
    """
    totals = dict.fromkeys((stage for stage, _ in STAGES), 0.0)
    for play in record["plays"]:
        stage = stage_of(play["name"])
        if stage is not None:
            totals[stage] += play["wall_s"]
    return {stage: round(total, 1) for stage, total in totals.items()}
