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
the start and the end: GPUENV_PROGRESS_LOG, or ${TMPDIR:-/tmp}/gpuenv-progress-<time>-<pid>.log.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from ansible import constants as C
from ansible import context
from ansible.playbook.block import Block
from ansible.playbook.handler import Handler
from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import callback_loader
from ansible.utils.color import stringc

try:
    from gpuenv.stages import stage_of
except ImportError:
    # ansible-playbook from a Python without gpuenv installed: the package sits two levels up.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
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
      - The log file for the default callback's full output; overwritten when it exists.
      - Unset, ${TMPDIR:-/tmp}/gpuenv-progress-YYYYmmdd-HHMMSS-PID.log.
    type: path
    env:
      - name: GPUENV_PROGRESS_LOG
    ini:
      - section: callback_gpuenv_progress
        key: log_path
requirements:
  - set as the stdout callback, ANSIBLE_STDOUT_CALLBACK=gpuenv_progress
"""

# Seconds between redraws on a terminal: the running time of a long task moves while nothing else does.
REFRESH_S = 0.5
# A task's running time shows from here on; below it would flicker past on every quick task.
LONG_TASK_S = 5.0
# Without a terminal: how often a task still running says so (CI systems kill jobs silent for minutes).
HEARTBEAT_S = 60.0
# Lines of stdout/stderr a failure shows; a DKMS or pip failure says why at its end, the rest is in the log.
TAIL_LINES = 25
# Keys of a failed result that explain it, in the order a person reads them.
_STREAMS = ("stderr", "stdout", "module_stderr", "module_stdout")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def duration(seconds: float) -> str:
    whole = max(int(seconds), 0)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


@dataclass(frozen=True)
class Play:
    index: int  # 1-based, in the playbook's order of plays (a serial play's batches share one)
    total: int
    name: str
    stage: str | None  # gpuenv.stages; None in a playbook other than site.yml

    @property
    def short(self) -> str:
        return f"{self.index}/{self.total} {self.stage or self.name}"

    @property
    def full(self) -> str:
        where = f"{self.index}/{self.total}"
        return f"{where} {self.stage}: {self.name}" if self.stage else f"{where} {self.name}"


@dataclass
class Host:
    name: str
    play: Play | None = None
    task: str = ""
    task_start: float | None = None  # None while the host waits for the others, or has stopped
    changed: int = 0
    last_seen: float = 0.0
    state: str = "running"  # running, failed, unreachable, done
    next_heartbeat: float = 0.0


class Progress:
    """Where each host stands, from the events the callback passes on with the time they came.

    No output and no Ansible objects: the callback decides where the lines go, and the tests drive
    this with made-up times.
    """

    def __init__(self, start: float) -> None:
        self.start = start
        self.play: Play | None = None
        self.hosts: dict[str, Host] = {}

    def _host(self, name: str, now: float) -> Host:
        host = self.hosts.setdefault(name, Host(name))
        host.last_seen = now
        return host

    def play_started(self, play: Play) -> None:
        self.play = play

    def task_started(self, name: str, task: str, now: float) -> str | None:
        """The host started a task; the plain line to print when it also entered a new play."""
        host = self._host(name, now)
        entered = host.play != self.play
        host.play = self.play
        host.task = task
        host.task_start = now
        host.next_heartbeat = now + HEARTBEAT_S
        # A host that failed and runs again was rescued (block/rescue): it is not stopped.
        host.state = "running"
        if not entered or self.play is None:
            return None
        return f"[{duration(now - self.start):>6}] {name}: {self.play.full} ({host.changed} changed so far)"

    def task_done(self, name: str, now: float, *, changed: bool = False, state: str = "running") -> None:
        host = self._host(name, now)
        host.task_start = None
        if changed:
            host.changed += 1
        host.state = state

    def running_for(self, name: str, now: float) -> float | None:
        host = self.hosts.get(name)
        return None if host is None or host.task_start is None else now - host.task_start

    def _activity(self, host: Host, now: float) -> str:
        if host.state == "failed":
            return f"FAILED: {host.task}"
        if host.state == "unreachable":
            return f"UNREACHABLE: {host.task}"
        if host.state == "done":
            return "done"
        if host.task_start is not None and now - host.task_start >= LONG_TASK_S:
            return f"{host.task} ({duration(now - host.task_start)})"
        return host.task

    def _elapsed(self, host: Host, now: float) -> float:
        # A host that stopped keeps the time it stopped at.
        return (now if host.state == "running" else host.last_seen) - self.start

    def lines(self, now: float, width: int, height: int) -> list[str]:
        """The live lines: one per host, cut to the terminal's width and, with more hosts than rows,
        the running hosts first and one line that counts the rest."""
        hosts = list(self.hosts.values())
        room = max(height - 1, 1)
        shown = hosts
        if len(hosts) > room:
            running = [h for h in hosts if h.state == "running"]
            shown = (running + [h for h in hosts if h.state != "running"])[: room - 1]
        name_w = max((len(h.name) for h in shown), default=0)
        where_w = min(max((len(h.play.short) for h in shown if h.play), default=0), 32)
        out = []
        for h in shown:
            where = (h.play.short if h.play else "")[:where_w]
            line = (
                f"{h.name:<{name_w}}  {where:<{where_w}}  {duration(self._elapsed(h, now)):>6}"
                f"  {h.changed:>3} changed  {self._activity(h, now)}"
            )
            out.append(line[: max(width - 1, 10)])
        if len(shown) < len(hosts):
            rest = [h for h in hosts if h not in shown]
            counts = {s: sum(h.state == s for h in rest) for s in ("running", "failed", "unreachable", "done")}
            what = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
            out.append(f"... and {len(rest)} more hosts: {what}"[: max(width - 1, 10)])
        return out

    def still_running(self, now: float) -> list[str]:
        """Plain lines for tasks running past their next heartbeat, one per task with its hosts."""
        due: dict[str, list[Host]] = {}
        for host in self.hosts.values():
            if host.task_start is not None and now >= host.next_heartbeat:
                due.setdefault(host.task, []).append(host)
                host.next_heartbeat = now + HEARTBEAT_S
        lines = []
        for task, hosts in due.items():
            names = [h.name for h in hosts]
            on = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
            longest = max(now - h.task_start for h in hosts if h.task_start is not None)
            lines.append(f"[{duration(now - self.start):>6}] still running after {duration(longest)}: {task} on {on}")
        return lines

    def finish(self, counts: Mapping[str, Mapping[str, int]]) -> list[str]:
        """The recap: a line per host with Ansible's counts; hosts that did not stop become done."""
        for name, c in counts.items():
            host = self.hosts.setdefault(name, Host(name, last_seen=self.start))
            if c.get("unreachable"):
                host.state = "unreachable"
            elif c.get("failures"):
                host.state = "failed"
            else:
                host.state = "done"
        name_w = max((len(n) for n in counts), default=0)
        lines = []
        for name in sorted(counts):
            c, host = counts[name], self.hosts[name]
            status = {"done": "ok", "failed": "FAILED", "unreachable": "UNREACHABLE"}[host.state]
            numbers = " ".join(
                f"{key}={c.get(field, 0)}"
                for key, field in (
                    ("ok", "ok"),
                    ("changed", "changed"),
                    ("failed", "failures"),
                    ("unreachable", "unreachable"),
                    ("skipped", "skipped"),
                    ("rescued", "rescued"),
                    ("ignored", "ignored"),
                )
            )
            lines.append(f"{name:<{name_w}}  {status:<11}  {duration(host.last_seen - self.start):>6}  {numbers}")
        return lines


def _block(key: str, value: str, indent: str) -> list[str]:
    text = value.rstrip("\n")
    if "\n" not in text:
        return [f"{indent}{key}: {text}"]
    lines = text.splitlines()
    cut = f" (last {TAIL_LINES} of {len(lines)} lines)" if len(lines) > TAIL_LINES else ""
    head = f"{indent}{key}{cut}:"
    return [head] + [f"{indent}  {line}" for line in lines[-TAIL_LINES:]]


def _explain(result: Mapping[str, Any], indent: str) -> list[str]:
    lines: list[str] = []
    msg = result.get("msg")
    if msg is not None:
        # The message in full, also a preflight report of forty lines: it is what the person must read.
        text = msg if isinstance(msg, str) else json.dumps(msg, indent=2, default=str, ensure_ascii=False)
        text = text.rstrip()
        if "\n" in text:
            lines.append(f"{indent}msg:")
            lines.extend(f"{indent}  {line}" for line in text.splitlines())
        else:
            lines.append(f"{indent}msg: {text}")
    if result.get("assertion"):
        lines.append(f"{indent}assertion: {result['assertion']}")
    cmd = result.get("cmd")
    if cmd:
        lines.append(f"{indent}cmd: {shlex.join(str(a) for a in cmd) if isinstance(cmd, list) else cmd}")
    if result.get("rc") is not None:
        lines.append(f"{indent}rc: {result['rc']}")
    for key in _STREAMS:
        value = result.get(key)
        if isinstance(value, str) and value.strip():
            lines.extend(_block(key, value, indent))
    if not lines:
        # A module that failed without msg or output: its whole result, less Ansible's bookkeeping.
        rest = {k: v for k, v in result.items() if not k.startswith("_ansible") and k not in ("invocation", "failed")}
        lines.extend(f"{indent}{line}" for line in json.dumps(rest, indent=2, default=str).splitlines())
    return lines


def failure_text(
    host: str,
    task: str,
    where: str,
    result: Mapping[str, Any],
    *,
    unreachable: bool = False,
    ran_for: float | None = None,
) -> str:
    """What a failed task says, for a person: host, task, where in the run, the message and the
    ends of its output; each failed item of a loop with its own."""
    after = f", after {duration(ran_for)}" if ran_for is not None and ran_for >= LONG_TASK_S else ""
    lines = [f"{'UNREACHABLE' if unreachable else 'FAILED'}: {host}, task {task!r} ({where}{after})"]
    lines.extend(_explain(result, "  "))
    for item in result.get("results") or []:
        if isinstance(item, Mapping) and item.get("failed"):
            label = item.get("_ansible_item_label", item.get("item"))
            lines.append(f"  item {json.dumps(label, default=str, ensure_ascii=False)}:")
            lines.extend(_explain(item, "    "))
    return "\n".join(lines)


def default_log_path(now: float) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return Path(tempfile.gettempdir()) / f"gpuenv-progress-{stamp}-{os.getpid()}.log"


class Screen:
    """The terminal and the log for the run.

    It stands in for sys.stdout and sys.stderr (as rich's Live display does), because Ansible and
    the other callbacks (gpuenv_rollout's summary, warnings) write there: their text goes above the
    live lines instead of through them, and into the log too. While the default callback is handed
    an event (`to_log`), what it writes goes to the log only.
    """

    def __init__(self, out: TextIO, log: TextIO, *, tty: bool, lock: Any) -> None:
        self.out, self.log, self.tty, self.lock = out, log, tty, lock
        self.to_log = False
        self.warnings = 0
        self._drawn = 0
        self._mid_line = False

    def clear_live(self) -> None:
        with self.lock:
            if self._drawn:
                # Up to the first live line, then clear to the end of the screen.
                self.out.write(f"\r\x1b[{self._drawn}A\x1b[J")
                self._drawn = 0

    def draw(self, lines: list[str]) -> None:
        with self.lock:
            # Someone else's half-written line would end up inside the live lines: wait for its end.
            if not self.tty or self._mid_line:
                return
            self.clear_live()
            self.out.write("".join(f"{line}\n" for line in lines))
            self.out.flush()
            self._drawn = len(lines)

    def show(self, text: str) -> None:
        """This callback's own text, kept on screen above the live lines (not in the log)."""
        with self.lock:
            self.clear_live()
            self.out.write(text.rstrip("\n") + "\n")
            self.out.flush()

    def write(self, stream: TextIO, text: str) -> int:
        with self.lock:
            plain = _ANSI.sub("", text)
            self.log.write(plain)
            if self.to_log:
                if plain.lstrip().startswith(("[WARNING]", "[DEPRECATION WARNING]")):
                    self.warnings += 1
                return len(text)
            self.clear_live()
            stream.write(text)
            stream.flush()
            self._mid_line = not text.endswith("\n")
            return len(text)


class _Stream:
    """sys.stdout or sys.stderr while the callback runs: writes go through the Screen."""

    def __init__(self, screen: Screen, real: TextIO) -> None:
        self._screen = screen
        self._real = real
        self._pid = os.getpid()

    def write(self, text: str) -> int:
        if os.getpid() != self._pid:
            # A forked worker inherits this object but neither the redraw thread nor the log's use.
            return self._real.write(text)
        return self._screen.write(self._real, text)

    def flush(self) -> None:
        self._real.flush()

    def __getattr__(self, name: str) -> Any:
        # isatty, fileno, buffer, encoding: prompts (pause, vars_prompt) read them from the real stream.
        return getattr(self._real, name)


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
        path = Path(wanted).expanduser() if wanted else default_log_path(time.time())
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            log = path.open("w", encoding="utf-8", errors="replace")
        except OSError as exc:
            fallback = default_log_path(time.time())
            self._real[1].write(f"gpuenv_progress: cannot write {path} ({exc}); the log goes to {fallback}\n")
            path, log = fallback, fallback.open("w", encoding="utf-8", errors="replace")
        self._log_path = path.resolve()
        return log

    def _begin(self) -> None:
        self._screen = Screen(self._real[0], self._open_log(), tty=self._tty, lock=self._lock)
        sys.stdout = _Stream(self._screen, self._real[0])
        sys.stderr = _Stream(self._screen, self._real[1])
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
            self._progress.play_started(Play(index, max(self._total, index), name, stage_of(name)))

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
