"""Callback plugin: the summary of a rolling upgrade (playbooks/upgrade.yml), every host named.

When a batch fails beyond max_fail_percentage, Ansible ends the whole run before the plays after
it, so no play can print the summary; a callback sees the end of every run. It follows the
`fleet_upgrade_outcome` fact that upgrade.yml and the fleet_upgrade role set on each host
(waiting, in progress, upgraded, unchanged, refused, rolled back), counts the batches of the
rollout play, and at the end prints one line per host and writes the same to
reports/rollout/summary.md and summary.json. A run without that fact prints nothing.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: gpuenv_rollout
type: aggregate
short_description: the rollout summary of playbooks/upgrade.yml, every host named
description:
  - Follows the fleet_upgrade_outcome fact and prints where each host stands when the run ends,
    also when max_fail_percentage stopped it; writes reports/rollout/summary.md and summary.json.
requirements:
  - enabled in ansible.cfg (callbacks_enabled)
"""

ROLLOUT_PLAY = "Roll the stack out, a batch at a time"


def _stack(summary: dict[str, Any] | None) -> str:
    if not summary:
        return "-"
    parts = [f"driver {summary.get('driver')}", f"CUDA {summary.get('cuda')}", f"cuDNN {summary.get('cudnn')}"]
    parts.append(f"torch {summary.get('torch')}")
    if summary.get("packages"):
        parts.append(str(summary["packages"]))
    return ", ".join(parts)


def render(hosts: dict[str, dict[str, Any]], stopped: str | None) -> str:
    lines = ["| host | batch | where it stands | stack it runs | note |", "|---|---|---|---|---|"]
    for name in sorted(hosts):
        h = hosts[name]
        state = h.get("state", "waiting")
        if state == "waiting":
            state = "untouched: the rollout stopped before its batch" if stopped else "untouched"
        runs = h.get("now") or h.get("was")
        note = h.get("note", "")
        if h.get("changed"):
            note = "changed: " + ", ".join(h["changed"]) + (f"; {note}" if note else "")
        if h.get("verify"):
            note = f"verify {h['verify']}" + (f"; {note}" if note else "")
        lines.append(f"| {name} | {h.get('batch', '-')} | {state} | {_stack(runs)} | {note} |")
    head = f"Rollout stopped: {stopped}" if stopped else "Rollout complete: every batch ran."
    return head + "\n\n" + "\n".join(lines) + "\n"


class CallbackModule(CallbackBase):  # type: ignore[misc]  # Ansible's base class is untyped
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpuenv_rollout"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._hosts: dict[str, dict[str, Any]] = {}
        self._batch = 0
        self._in_rollout = False
        self._failed_in_batch: dict[int, list[str]] = {}
        self._report_dir: str | None = None

    def v2_playbook_on_play_start(self, play: Any) -> None:
        # A serial play starts once per batch.
        self._in_rollout = play.get_name().strip() == ROLLOUT_PLAY
        if self._in_rollout:
            self._batch += 1

    def v2_runner_on_ok(self, result: Any) -> None:
        outcome = (result._result.get("ansible_facts") or {}).get("fleet_upgrade_outcome")
        if not isinstance(outcome, dict):
            return
        host = result._host.get_name()
        entry = self._hosts.setdefault(host, {})
        entry.update(outcome)
        if self._in_rollout:
            entry["batch"] = self._batch
        self._report_dir = outcome.get("report") or self._report_dir

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        if self._in_rollout and not ignore_errors:
            host = result._host.get_name()
            failed = self._failed_in_batch.setdefault(self._batch, [])
            if host not in failed:
                failed.append(host)
            entry = self._hosts.setdefault(host, {})
            entry.setdefault("batch", self._batch)
            if entry.get("state") in (None, "waiting", "in progress"):
                entry["state"] = "failed"
                entry["note"] = str(result._result.get("msg", ""))[:300]

    def v2_runner_on_unreachable(self, result: Any) -> None:
        if self._in_rollout:
            entry = self._hosts.setdefault(result._host.get_name(), {})
            entry.update({"state": "unreachable", "batch": self._batch})
            self._failed_in_batch.setdefault(self._batch, []).append(result._host.get_name())

    def v2_playbook_on_stats(self, stats: Any) -> None:
        if not self._hosts:
            return
        waiting = [h for h, e in self._hosts.items() if e.get("state", "waiting") == "waiting"]
        stopped = None
        if waiting and self._failed_in_batch:
            last = max(self._failed_in_batch)
            stopped = (
                f"batch {last} failed ({', '.join(self._failed_in_batch[last])}); "
                f"{len(waiting)} host(s) were not touched ({', '.join(sorted(waiting))})"
            )
        text = render(self._hosts, stopped)
        self._display.banner("ROLLOUT SUMMARY")
        self._display.display(text)
        if self._report_dir:
            out = Path(self._report_dir)
            try:
                out.mkdir(parents=True, exist_ok=True)
                (out / "summary.md").write_text(f"# Rollout summary ({time.strftime('%Y-%m-%d %H:%M:%S')})\n\n{text}")
                (out / "summary.json").write_text(
                    json.dumps({"stopped": stopped, "hosts": self._hosts}, indent=1, sort_keys=True) + "\n"
                )
            except OSError as exc:
                self._display.warning(f"gpuenv_rollout: could not write {out}: {exc}")
