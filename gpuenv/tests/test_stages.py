"""gpuenv/stages.py: every play of site.yml has its stage, and the timing callback and the
benchmarks group play times by the same stages (the progress callback shows them)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from gpuenv.stages import STAGES, stage_of, stage_times
from gpuenv.tests.conftest import REPO, load_plugin


def test_every_play_of_site_yml_has_a_stage() -> None:
    # A play renamed in playbooks/ without gpuenv/stages.py would show (and be benchmarked) as no stage.
    site = yaml.safe_load((REPO / "playbooks/site.yml").read_text())
    names = []
    for entry in site:
        for play in yaml.safe_load((REPO / "playbooks" / entry["ansible.builtin.import_playbook"]).read_text()):
            names.append(play["name"])
    assert len(names) >= 7
    assert {n: stage_of(n) for n in names if stage_of(n) is None} == {}
    assert [stage for stage, _ in STAGES] == ["preflight", "driver", "cuda", "env", "verify"]
    assert stage_of("Install the GPU services") == "driver"
    assert stage_of("Roll the stack out, a batch at a time") is None


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_name(self) -> str:
        return self.name


def test_the_timing_record_names_each_plays_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ansible")
    timing = load_plugin("plugins/callback/gpuenv_timing.py").CallbackModule()
    timing.v2_playbook_on_play_start(_Named("Install the NVIDIA driver"))
    timing.v2_playbook_on_play_start(_Named("A play of another playbook"))

    class Stats:
        processed: ClassVar[dict[str, int]] = {}

    monkeypatch.setenv("GPUENV_TIMING_FILE", str(tmp_path / "t.json"))
    timing.v2_playbook_on_stats(Stats())
    plays = yaml.safe_load((tmp_path / "t.json").read_text())["plays"]
    assert [(p["name"], p["stage"]) for p in plays] == [
        ("Install the NVIDIA driver", "driver"),
        ("A play of another playbook", None),
    ]


def test_the_benchmarks_sum_play_times_by_the_same_stages() -> None:
    # A record as the timing callback writes it (bench/ charts these sums); an older one has no "stage".
    record = {
        "plays": [
            {"name": "Preflight of the declared GPU stack", "wall_s": 1.0},
            {"name": "Record the checked stack on each host", "wall_s": 2.5},
            {"name": "Install the GPU services", "stage": "driver", "wall_s": 3.0},
            {"name": "Not a play of site.yml", "stage": None, "wall_s": 100.0},
        ]
    }
    assert stage_times(record) == {"preflight": 3.5, "driver": 3.0, "cuda": 0.0, "env": 0.0, "verify": 0.0}
