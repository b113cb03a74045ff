"""gpuenv/stages.py: a play's stage by its file, the timing callback and the benchmarks grouping
play times by the same stages (the progress callback shows them), and site.yml's steps as a
rollout runs them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from gpuenv import stages
from gpuenv.stages import STAGES, StagesError, stage_of, stage_steps, stage_times
from tests.conftest import REPO, load_plugin


def test_a_play_s_stage_is_known_by_its_file_and_a_new_stage_playbook_is_a_stage_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert list(STAGES) == ["preflight", "driver", "cuda", "env", "verify"]
    assert stage_of(str(REPO / "playbooks/services.yml") + ":3") == "driver"
    assert stage_of("playbooks/verify.yml") == "verify"
    assert stage_of(str(REPO / "playbooks/upgrade.yml") + ":12") is None  # a rollout's play, no stage of site.yml
    assert stage_of("") is None
    # A playbook site.yml imports that the table does not name: its own stage, by its file.
    (tmp_path / "site.yml").write_text("- ansible.builtin.import_playbook: extra_tools.yml\n")
    (tmp_path / "extra_tools.yml").write_text("- name: Extra tools\n  hosts: gpu_hosts\n  roles: [extra]\n")
    monkeypatch.setattr(stages, "_PLAYBOOKS", tmp_path)
    stages._site_playbooks.cache_clear()
    try:
        assert stage_of(str(tmp_path / "extra_tools.yml") + ":1") == "extra_tools"
    finally:
        stages._site_playbooks.cache_clear()


class _Play:
    """What the callbacks read of a play: its name and where it is written."""

    def __init__(self, name: str, path: str = "") -> None:
        self.name = name
        self.path = path

    def get_name(self) -> str:
        return self.name

    def get_path(self) -> str:
        return self.path


def test_the_timing_record_names_each_plays_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ansible")
    timing = load_plugin("plugins/callback/gpuenv_timing.py").CallbackModule()
    timing.v2_playbook_on_play_start(_Play("Install the NVIDIA driver", f"{REPO}/playbooks/driver_start.yml:10"))
    timing.v2_playbook_on_play_start(_Play("A play of another playbook", f"{REPO}/playbooks/drift.yml:16"))

    class Stats:
        processed: ClassVar[dict[str, int]] = {}

    monkeypatch.setenv("GPUENV_TIMING_FILE", str(tmp_path / "t.json"))
    timing.v2_playbook_on_stats(Stats())
    plays = yaml.safe_load((tmp_path / "t.json").read_text())["plays"]
    assert [(p["name"], p["stage"]) for p in plays] == [
        ("Install the NVIDIA driver", "driver"),
        ("A play of another playbook", None),
    ]


def test_the_timing_record_gives_each_task_the_controller_s_cpu_across_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What ansible-playbook and its reaped workers used between a task's start and the next's: where
    # the controller's seconds per host go (the no-op target).
    pytest.importorskip("ansible")
    plugin = load_plugin("plugins/callback/gpuenv_timing.py")
    ticks = iter([1.0, 1.25, 1.25, 3.0])
    monkeypatch.setattr(plugin.CallbackModule, "_cpu", staticmethod(lambda: next(ticks)))
    timing = plugin.CallbackModule()
    timing.v2_playbook_on_play_start(_Play("Verify each host"))
    timing.v2_playbook_on_task_start(_Play("a"), False)
    timing.v2_playbook_on_task_start(_Play("b"), False)

    class Stats:
        processed: ClassVar[dict[str, int]] = {}

    monkeypatch.setenv("GPUENV_TIMING_FILE", str(tmp_path / "t.json"))
    timing.v2_playbook_on_stats(Stats())
    tasks = yaml.safe_load((tmp_path / "t.json").read_text())["tasks"]
    assert [(t["name"], t["cpu_s"]) for t in tasks] == [("a", 0.25), ("b", 1.75)]


def test_the_benchmarks_sum_play_times_by_the_same_stages() -> None:
    # A record as the timing callback writes it (bench/ charts these sums).
    record = {
        "plays": [
            {"name": "Preflight of the declared GPU stack", "stage": "preflight", "wall_s": 1.0},
            {"name": "Record the checked stack on each host", "stage": "preflight", "wall_s": 2.5},
            {"name": "Install the GPU services", "stage": "driver", "wall_s": 3.0},
            {"name": "Not a play of site.yml", "stage": None, "wall_s": 100.0},
        ]
    }
    assert stage_times(record) == {"preflight": 3.5, "driver": 3.0, "cuda": 0.0, "env": 0.0, "verify": 0.0}


SITE = """
- name: Preflight
  ansible.builtin.import_playbook: preflight.yml
- name: Stage
  ansible.builtin.import_playbook: stage.yml
"""
PREFLIGHT = """
- name: Preflight of the declared GPU stack
  hosts: gpu_hosts
  roles:
    - role: gpu_stack
"""
GUARD = """
  pre_tasks:
    - name: Start the stage
      ansible.builtin.import_tasks: tasks/stage_start.yml
      vars:
        stage_start_skip_converged: false
      tags: [always]
"""


def _steps(tmp_path: Path, stage: str) -> list[dict[str, object]]:
    (tmp_path / "site.yml").write_text(SITE)
    (tmp_path / "preflight.yml").write_text(PREFLIGHT)
    (tmp_path / "stage.yml").write_text(stage)
    return stage_steps(tmp_path)


def test_a_stage_s_roles_and_role_includes_are_steps_in_order_and_the_preflight_is_not(tmp_path: Path) -> None:
    stage = (
        "- name: A stage\n  hosts: gpu_hosts\n  gather_facts: false\n"
        + GUARD
        + "  roles:\n    - one\n    - role: two\n      tags: [two]\n      vars: {two_later: false}\n"
        + "  tasks:\n    - name: Two's last step\n      ansible.builtin.include_role:\n        name: two\n"
        + "        tasks_from: last.yml\n        apply: {tags: [two]}\n"
        + "- name: A report on the controller\n  hosts: localhost\n  tasks:\n    - ansible.builtin.command: 'true'\n"
    )
    steps = _steps(tmp_path, stage)
    assert [(s["role"], s["tasks_from"], s["vars"], s["play"], s["file"]) for s in steps] == [
        ("one", "main", {}, "A stage", "playbooks/stage.yml"),
        ("two", "main", {"two_later": False}, "A stage", "playbooks/stage.yml"),
        ("two", "last", {}, "A stage", "playbooks/stage.yml"),
    ]


@pytest.mark.parametrize(
    ("stage", "said"),
    [
        # A condition the rollout would not evaluate: the role would run where site.yml skips it.
        ("  roles:\n    - role: one\n      when: false\n", "gives role one ['when']"),
        (
            "  tasks:\n    - ansible.builtin.include_role: {name: one}\n      when: false\n",
            "includes role one with ['when']",
        ),
        ("  tasks:\n    - ansible.builtin.include_role: {name: one, public: true}\n", "with ['public']"),
        ("  roles: [one]\n  post_tasks:\n    - ansible.builtin.debug: {msg: hi}\n", "has ['post_tasks']"),
        ("  vars: {x: 1}\n  roles: [one]\n", "has ['vars']"),
        (
            "  tasks:\n    - name: A plain task\n      ansible.builtin.command: 'true'\n",
            "the task 'A plain task'",
        ),
        (
            "  pre_tasks:\n    - name: Something else\n      ansible.builtin.command: 'true'\n  roles: [one]\n",
            "a pre_task 'Something else'",
        ),
        # The preflight's role as a pre_task of its own: tasks/stage_start.yml is the one start of a stage.
        (
            "  pre_tasks:\n    - name: Own guard\n      ansible.builtin.include_role: {name: gpu_stack}\n"
            "  roles: [one]\n",
            "only the import of tasks/stage_start.yml",
        ),
        ("  roles: [gpu_stack, one]\n", "runs the preflight's role gpu_stack beside others"),
    ],
    ids=[
        "role-when",
        "include-when",
        "include-public",
        "post-tasks",
        "play-vars",
        "plain-task",
        "other-pre-task",
        "own-preflight-guard",
        "preflight-mixed",
    ],
)
def test_what_a_rollout_would_drop_is_refused_by_name(tmp_path: Path, stage: str, said: str) -> None:
    with pytest.raises(StagesError, match=re.escape(said)) as caught:
        _steps(tmp_path, "- name: A stage\n  hosts: gpu_hosts\n" + stage)
    assert "playbooks/stage.yml" in str(caught.value)


@pytest.mark.parametrize("hosts", ["all", "gpu_hosts:!sb2", "gpu_hosts,other", "'{{ target }}'"])
def test_a_stage_on_other_hosts_than_gpu_hosts_is_refused(tmp_path: Path, hosts: str) -> None:
    # The rollout runs each step on its batch's hosts: a play meant for another group would run there.
    with pytest.raises(StagesError, match="a stage runs on 'gpu_hosts'"):
        _steps(tmp_path, f"- name: A stage\n  hosts: {hosts}\n  roles: [one]\n")


def test_a_playbook_that_imports_itself_or_cannot_be_read_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StagesError, match="imports itself"):
        _steps(tmp_path, "- ansible.builtin.import_playbook: stage.yml\n")
    (tmp_path / "site.yml").write_text("- ansible.builtin.import_playbook: missing.yml\n")
    with pytest.raises(StagesError, match="cannot read the stage playbook"):
        stage_steps(tmp_path)


def test_a_new_stage_s_places_are_read_from_its_role_and_a_bad_places_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "playbooks/site.yml").write_text(
        "- ansible.builtin.import_playbook: pre.yml\n- ansible.builtin.import_playbook: new.yml\n"
    )
    (tmp_path / "playbooks/pre.yml").write_text("- name: Preflight\n  hosts: gpu_hosts\n  roles: [gpu_stack]\n")
    (tmp_path / "playbooks/new.yml").write_text("- name: New\n  hosts: gpu_hosts\n  roles: [new_stage, quiet]\n")
    (tmp_path / "roles/new_stage/meta").mkdir(parents=True)
    places = tmp_path / "roles/new_stage/meta/places.yml"
    places.write_text("walk: [/opt/new]\n")
    # Only the roles that have one; a role that writes nothing of its own has none.
    assert stages.stage_place_files(tmp_path / "playbooks") == [str(places)]
    # The playbooks are read once per state of their files: a playbook edited since is read again.
    (tmp_path / "roles/quiet/meta").mkdir(parents=True)
    (tmp_path / "roles/quiet/meta/places.yml").write_text("watch: [/etc/quiet]\n")
    (tmp_path / "playbooks/new.yml").write_text("- name: New\n  hosts: gpu_hosts\n  roles: [quiet]\n")
    assert stages.stage_place_files(tmp_path / "playbooks") == [str(tmp_path / "roles/quiet/meta/places.yml")]
    rendered = ["watch: [/etc/a, /etc/b]\nunits: [x]\n", "watch: [/etc/b]\nwalk: [/opt/new]\n"]
    merged = stages.merge_places(rendered, ["a", "b"])
    assert merged == {"watch": ["/etc/a", "/etc/b"], "walk": ["/opt/new"], "read": [], "units": ["x"], "pending": []}
    assert stages.merge_places([""], ["empty"])["watch"] == []
    for text, said in (
        ("wach: [/etc]\n", "names wach; its keys are watch, walk, read, units, pending"),
        ("watch: /etc\n", "watch must be a list"),
        ("- /etc\n", "not a mapping"),
        ("watch: [\n", "is not YAML"),
    ):
        with pytest.raises(StagesError, match=re.escape(said)) as info:
            stages.merge_places([text], [str(places)])
        assert str(places) in str(info.value)
