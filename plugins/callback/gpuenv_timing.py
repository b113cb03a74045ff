"""Callback plugin: what a playbook run cost, as JSON, for the benchmarks (bench/run).

Enabled only where asked for, so that ordinary runs print as always:

    ANSIBLE_CALLBACKS_ENABLED=gpuenv_timing GPUENV_TIMING_FILE=run.json ansible-playbook ...

It records the wall time of the run, of each play with the stage of site.yml it belongs to
(gpuenv.stages: the stages the progress callback shows) and of each task with the controller's CPU
seconds across it (cpu_s: where the controller's share per host goes), and per host the counts
Ansible's recap prints (ok, changed, failed, ...) with the names of the tasks that reported a
change: a no-op re-run must have none, and when it has one the file says which.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any

from ansible.plugins.callback import CallbackBase

from gpuenv.stages import stage_of

DOCUMENTATION = """
name: gpuenv_timing
type: aggregate
short_description: writes the run's play and task timings and change counts as JSON
description:
  - Writes GPUENV_TIMING_FILE at the end of the run; does nothing when it is not set.
requirements:
  - enabled with ANSIBLE_CALLBACKS_ENABLED=gpuenv_timing
"""


class CallbackModule(CallbackBase):  # type: ignore[misc]  # Ansible's base class is untyped
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpuenv_timing"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._start = time.monotonic()
        self._playbook = ""
        self._plays: list[dict[str, Any]] = []
        self._tasks: list[dict[str, Any]] = []
        self._changed: dict[str, list[str]] = {}

    def _now(self) -> float:
        return round(time.monotonic() - self._start, 3)

    @staticmethod
    def _cpu() -> float:
        """The controller's CPU seconds so far: ansible-playbook itself and the workers (with the ssh
        clients they ran) it has reaped; a task's share is the difference across it, give or take a
        worker reaped after the next task began."""
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    def _close_task(self) -> None:
        if self._tasks and "wall_s" not in self._tasks[-1]:
            task = self._tasks[-1]
            task["wall_s"] = round(self._now() - task["start_s"], 3)
            task["cpu_s"] = round(self._cpu() - task.pop("_cpu0"), 3)

    def _close_play(self) -> None:
        self._close_task()
        if self._plays and "wall_s" not in self._plays[-1]:
            self._plays[-1]["wall_s"] = round(self._now() - self._plays[-1]["start_s"], 3)

    def v2_playbook_on_start(self, playbook: Any) -> None:
        self._playbook = str(playbook._file_name)

    def v2_playbook_on_play_start(self, play: Any) -> None:
        self._close_play()
        name = play.get_name().strip()
        self._plays.append({"name": name, "stage": stage_of(play.get_path()), "start_s": self._now()})

    def _task_start(self, task: Any, handler: bool = False) -> None:
        self._close_task()
        self._tasks.append(
            {
                "play": self._plays[-1]["name"] if self._plays else "",
                "name": task.get_name().strip(),
                "handler": handler,
                "start_s": self._now(),
                "changed": [],
                "_cpu0": self._cpu(),
            }
        )

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        self._task_start(task)

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        self._task_start(task, handler=True)

    def v2_runner_on_ok(self, result: Any) -> None:
        if result._result.get("changed", False):
            host = result._host.get_name()
            name = result._task.get_name().strip()
            self._changed.setdefault(host, []).append(name)
            if self._tasks:
                self._tasks[-1]["changed"].append(host)

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._close_play()
        target = os.environ.get("GPUENV_TIMING_FILE")
        if not target:
            return
        hosts = {
            host: {**stats.summarize(host), "changed_tasks": self._changed.get(host, [])}
            for host in sorted(stats.processed)
        }
        report = {
            "playbook": self._playbook,
            "wall_s": self._now(),
            "plays": self._plays,
            "tasks": self._tasks,
            "hosts": hosts,
        }
        Path(target).write_text(json.dumps(report, indent=1) + "\n")
