"""Callback plugin: one line per host that says where the run is, instead of a thousand lines of tasks.

    ANSIBLE_STDOUT_CALLBACK=gpuenv_progress ansible-playbook -i inventory/<site> playbooks/site.yml

site.yml on fresh hosts prints about a thousand lines in eight minutes, and a person cannot tell
from them how far it has come. With this callback each host has one line: its stage of site.yml
(gpuenv.stages, the stages the timing callback records), the time since the run began, the tasks
that changed something so far, and the task it runs now, with how long it has run once that is
more than a few seconds (a DKMS build, the torch download). On a terminal the lines are redrawn in
place twice a second; anywhere else (CI logs, a pipe) no escape codes are written: one line when a
host enters a play, and one line a minute for a task that is still running. A failure (a failed
task neither ignored nor caught by a block's rescue, an unreachable host) prints the task, the host
and the message in full, with the last lines of stdout and stderr; the end prints a recap per host.

Everything the default callback would print goes to a log file instead, whose path is printed at
the start and the end: GPUENV_PROGRESS_LOG, or a new ${TMPDIR:-/tmp}/gpuenv-progress-<time>-<pid>-<random>.log
(mode 0600).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from ansible import constants as C
from ansible import context
from ansible.playbook.block import Block
from ansible.playbook.handler import Handler
from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import callback_loader
from ansible.utils.color import stringc

from gpuenv.progress import REFRESH_S, Play, Progress, Screen, Stream, failure_text, open_default_log, open_log
from gpuenv.stages import stage_of

DOCUMENTATION = """
name: gpuenv_progress
type: stdout
short_description: one live line per host (stage, elapsed time, changes, the running task); the full output in a log
description:
  - One line per host with its stage of site.yml, the time since the run began, how many tasks
    changed something, and the task it runs now (with its running time once past a few seconds).
  - On a terminal the lines are redrawn in place; elsewhere it prints a plain line when a host
    enters a play and one a minute for a task still running.
  - A failed or unreachable host prints the task, the message, and the tails of stdout and stderr;
    a failure that a block's rescue catches is not one (the recap counts it rescued).
  - What the default callback would print goes to a log file; its path is printed at the start and the end.
options:
  log_path:
    description:
      - The log file for the default callback's full output; overwritten when it exists, never through a link.
      - Unset, a new file ${TMPDIR:-/tmp}/gpuenv-progress-YYYYmmdd-HHMMSS-PID-RANDOM.log, mode 0600.
    type: path
    env:
      - name: GPUENV_PROGRESS_LOG
    ini:
      - section: callback_gpuenv_progress
        key: log_path
requirements:
  - set as the stdout callback, ANSIBLE_STDOUT_CALLBACK=gpuenv_progress
"""


def _result_of(result: Any) -> Mapping[str, Any]:
    # ansible-core 2.19 made result, host and task public; the underscore names are the older ones.
    value = getattr(result, "result", None)
    return value if isinstance(value, Mapping) else result._result


def _host_of(result: Any) -> str:
    return str((getattr(result, "host", None) or result._host).get_name())


def _task_of(result: Any) -> Any:
    return getattr(result, "task", None) or result._task


def rescued(task: Any) -> bool:
    """Whether a failure of `task` is caught by the rescue of a block around it.

    Ansible then runs the rescue and counts the host as rescued, not failed, but the failed event
    does not say which it is: the task's place does. A task is rescued when some block above it
    has a rescue and the task sits in that block's own tasks (not in its rescue or always). Ansible
    copies tasks and blocks as it runs them (tags, includes), keeping their ids: hence the ids.
    """
    child, parent = task, getattr(task, "_parent", None)
    while parent is not None:
        if isinstance(parent, Block) and parent.rescue and any(t._uuid == child._uuid for t in parent.block):
            return True
        child, parent = parent, getattr(parent, "_parent", None)
    return False


def _log_only(event: str) -> Callable[..., None]:
    """A callback method that hands `event` to the default callback, whose output goes to the log only."""

    def forward(self: CallbackModule, *args: Any, **kwargs: Any) -> None:
        self._forward(event, *args, **kwargs)

    forward.__name__ = forward.__qualname__ = event
    return forward


class CallbackModule(CallbackBase):  # type: ignore[misc]  # Ansible's base class is untyped
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "gpuenv_progress"

    def __init__(self) -> None:
        super().__init__()
        self._clock = time.monotonic
        self._progress = Progress(self._clock())
        self._plays: dict[str, int] = {}
        self._total = 0
        self._tty = sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
        self._real: tuple[TextIO, TextIO] = (sys.stdout, sys.stderr)
        # Display's own lock, for the state and the screen alike: Ansible holds it while it writes
        # and while it forks a worker, so the redraw thread never writes into a fork, and no two
        # locks can be taken in opposite orders (Display writes to us while it holds it).
        self._lock: Any = getattr(self._display, "_lock", None) or threading.RLock()
        # The default callback, handed every event, writes what Ansible normally prints: the log.
        self._full = callback_loader.get("ansible.builtin.default")
        self._full.set_options()
        self._screen: Screen | None = None
        self._log_path: Path | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._stopped_live = False
        self._finished = False

    # --- the run's start and end ---------------------------------------------------------------

    def _open_log(self) -> TextIO:
        wanted = self.get_option("log_path")
        if not wanted:
            path, log = open_default_log(time.time())
        else:
            path = Path(wanted).expanduser()
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                log = open_log(path)
            except OSError as exc:
                fallback, log = open_default_log(time.time())
                self._real[1].write(f"gpuenv_progress: cannot write {path} ({exc}); the log goes to {fallback}\n")
                path = fallback
        self._log_path = path.resolve()
        return log

    def _begin(self) -> None:
        self._screen = Screen(self._real[0], self._open_log(), tty=self._tty, lock=self._lock)
        sys.stdout = Stream(self._screen, self._real[0])
        sys.stderr = Stream(self._screen, self._real[1])
        # The streams go back and the log's path is printed at exit, also for a run Ansible ends
        # without the stats event (an interrupt).
        atexit.register(self._end)
        self._screen.show(f"gpuenv_progress: the full output goes to {self._log_path}")
        if context.CLIARGS.get("check"):
            # Ansible's banners say CHECK MODE, and they are in the log only.
            self._screen.show("gpuenv_progress: check mode: nothing changes; 'changed' counts what would change")
        self._ticker = threading.Thread(target=self._tick_loop, name="gpuenv_progress", daemon=True)
        self._ticker.start()

    def _stop_live(self, text: list[str]) -> None:
        if self._stopped_live or self._screen is None:
            return
        self._stopped_live = True
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
        with self._lock:
            self._screen.clear_live()
            self._screen.show("\n".join(text))

    def _end(self) -> None:
        """At exit: after the other callbacks' end of the run (gpuenv_rollout prints its summary
        after the stdout callback's recap), which the log must have too."""
        screen = self._screen
        if self._finished or screen is None:
            return
        self._finished = True
        self._stop_live(["", "gpuenv_progress: the run ended before its recap"])
        with self._lock:
            sys.stdout, sys.stderr = self._real
            text = []
            if screen.warnings:
                text.append(f"{screen.warnings} warning(s) from the tasks: see the log")
            text.append(f"gpuenv_progress: the full output is in {self._log_path}")
            screen.show("\n".join(text))
            screen.log.close()

    def _tick_loop(self) -> None:
        while not self._stop.wait(REFRESH_S):
            self._tick()

    def _tick(self) -> None:
        screen = self._screen
        if screen is None:
            return
        with self._lock:
            now = self._clock()
            if screen.tty:
                size = shutil.get_terminal_size()
                screen.draw(self._progress.lines(now, size.columns, size.lines))
            else:
                for line in self._progress.still_running(now):
                    screen.show(line)

    def _forward(self, method: str, *args: Any, **kwargs: Any) -> None:
        """Hand the event to the default callback, whose output goes to the log only."""
        screen = self._screen
        if screen is None:
            return
        with self._lock:
            # TQM sets the result it hands to each callback here; the default callback reads its
            # warnings and exception from it.
            self._full._current_task_result = self._current_task_result
            screen.to_log = True
            try:
                getattr(self._full, method)(*args, **kwargs)
            finally:
                screen.to_log = False
                self._full._current_task_result = None

    # --- Ansible's events ------------------------------------------------------------------------

    def v2_playbook_on_start(self, playbook: Any) -> None:
        plays = playbook.get_plays()
        self._total = len(plays)
        # A play's copy that Ansible runs keeps its _uuid: it finds the play's place in the book.
        self._plays = {str(getattr(p, "_uuid", i)): i + 1 for i, p in enumerate(plays)}
        # ansible-playbook a.yml b.yml starts each book but ends the run (stats) once.
        if self._screen is None:
            self._begin()
        self._forward("v2_playbook_on_start", playbook)

    def v2_playbook_on_play_start(self, play: Any) -> None:
        self._forward("v2_playbook_on_play_start", play)
        name = play.get_name().strip()
        with self._lock:
            last = self._progress.play
            # A serial play starts once per batch, as the same play.
            index = self._plays.get(str(getattr(play, "_uuid", "")), last.index + 1 if last else 1)
            self._progress.play_started(Play(index, max(self._total, index), name, stage_of(play.get_path())))

    def v2_runner_on_start(self, host: Any, task: Any) -> None:
        self._forward("v2_runner_on_start", host, task)
        name = task.get_name().strip()
        if isinstance(task, Handler):
            name = f"handler: {name}"
        with self._lock:
            line = self._progress.task_started(host.get_name(), name, self._clock())
            if line and self._screen is not None and not self._screen.tty:
                self._screen.show(line)

    def v2_runner_on_ok(self, result: Any) -> None:
        changed = bool(_result_of(result).get("changed", False))
        with self._lock:
            self._progress.task_done(_host_of(result), self._clock(), changed=changed)
        self._forward("v2_runner_on_ok", result)

    def v2_runner_on_skipped(self, result: Any) -> None:
        with self._lock:
            self._progress.task_done(_host_of(result), self._clock())
        self._forward("v2_runner_on_skipped", result)

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        self._stopped(result, unreachable=False, ignored=ignore_errors)
        self._forward("v2_runner_on_failed", result, ignore_errors=ignore_errors)

    def v2_runner_on_unreachable(self, result: Any) -> None:
        ignored = bool(getattr(_task_of(result), "ignore_unreachable", False))
        self._stopped(result, unreachable=True, ignored=ignored)
        self._forward("v2_runner_on_unreachable", result)

    def _stopped(self, result: Any, *, unreachable: bool, ignored: bool) -> None:
        # Read before the default callback sees the result: it deletes a loop's results as it prints.
        data = _result_of(result)
        host = _host_of(result)
        with self._lock:
            now = self._clock()
            if ignored:
                # Ansible's recap counts the change of an ignored failure, and only of that.
                self._progress.task_done(host, now, changed=bool(data.get("changed")))
                return
            if not unreachable and rescued(_task_of(result)):
                # The host goes on with the rescue and the recap counts it rescued: no failure to show
                # (the log has it, as the default callback prints it).
                self._progress.task_done(host, now)
                return
            ran_for = self._progress.running_for(host, now)
            self._progress.task_done(host, now, state="unreachable" if unreachable else "failed")
            play = self._progress.hosts[host].play or self._progress.play
            task = _task_of(result).get_name().strip()
            text = failure_text(host, task, play.full if play else "", data, unreachable=unreachable, ran_for=ran_for)
            if self._screen is not None:
                head, _, body = text.partition("\n")
                head = stringc(head, C.COLOR_ERROR) if self._screen.tty else head
                self._screen.show(f"\n{head}\n{body}\n  (the full output: {self._log_path})")

    def v2_playbook_on_stats(self, stats: Any) -> None:
        self._forward("v2_playbook_on_stats", stats)
        with self._lock:
            recap = self._progress.finish({h: stats.summarize(h) for h in sorted(stats.processed)})
        self._stop_live(["", "RECAP", *recap])

    # Events the screen does not show: the log has them as the default callback prints them. Each
    # is a method of its own, as Ansible calls only the events a callback class defines.
    v2_playbook_on_task_start = _log_only("v2_playbook_on_task_start")
    v2_playbook_on_handler_task_start = _log_only("v2_playbook_on_handler_task_start")
    v2_runner_item_on_ok = _log_only("v2_runner_item_on_ok")
    v2_runner_item_on_failed = _log_only("v2_runner_item_on_failed")
    v2_runner_item_on_skipped = _log_only("v2_runner_item_on_skipped")
    v2_runner_retry = _log_only("v2_runner_retry")
    v2_runner_on_async_poll = _log_only("v2_runner_on_async_poll")
    v2_runner_on_async_ok = _log_only("v2_runner_on_async_ok")
    v2_runner_on_async_failed = _log_only("v2_runner_on_async_failed")
    v2_on_file_diff = _log_only("v2_on_file_diff")
    v2_playbook_on_include = _log_only("v2_playbook_on_include")
    v2_playbook_on_notify = _log_only("v2_playbook_on_notify")
    v2_playbook_on_no_hosts_matched = _log_only("v2_playbook_on_no_hosts_matched")
    v2_playbook_on_no_hosts_remaining = _log_only("v2_playbook_on_no_hosts_remaining")
