"""What the progress callback (plugins/callback/gpuenv_progress.py) shows, without Ansible: where
each host stands (Progress), the lines drawn for it, a failure's text for a person, and the screen
that keeps the live lines below everything else written. The callback feeds it Ansible's events;
the tests feed it made-up ones. Standard library only."""

from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

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


def open_default_log(now: float) -> tuple[Path, TextIO]:
    """A new log in the temporary directory, gpuenv-progress-<time>-<pid>-<random>.log, created
    with O_EXCL and mode 0600 (mkstemp): /tmp is shared, so a name another account could guess is
    never opened through a link it planted, nor one it made first."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    fd, name = tempfile.mkstemp(prefix=f"gpuenv-progress-{stamp}-{os.getpid()}-", suffix=".log")
    return Path(name), os.fdopen(fd, "w", encoding="utf-8", errors="replace")


def open_log(path: Path) -> TextIO:
    """The log the user named (GPUENV_PROGRESS_LOG): truncated and rewritten, mode 0600 where it is
    created, and never through a symbolic link."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    return os.fdopen(fd, "w", encoding="utf-8", errors="replace")


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


class Stream:
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
