"""scripts/test's lanes: who may fill the disk now, and what a failed run says at its end.

Three lanes boot sandbox hosts side by side, and each scenario's hosts take gigabytes (a CUDA tree,
a cuDNN, torch and its NVIDIA wheels). Where the disk has room, they all run at once; where it has
less (CI's machines differ), a scenario waits until the others' growth leaves room for its own,
instead of all of them failing with "No space left on device" at once. Each sandbox step reserves
its measured peak (scripts/test names the figures); what counts against the disk's free space is
the part of the others' reservations they have not written yet.

CI shows only the end of a run's output, and the lanes print theirs as blocks, so the end of a
failed run repeats, for each failed step, what failed and why (`digest`).
"""

from __future__ import annotations

import argparse
import fcntl
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

MB = 1024 * 1024
# What stays free whatever the reservations say: apt's and pip's temporary files, logs, the caches'
# own growth that no reservation names.
MARGIN_MB = 3 * 1024
POLL_S = 10.0


@dataclass(frozen=True)
class Reservation:
    name: str
    mb: int
    watch: tuple[Path, ...]  # the directories whose growth it covers (a sandbox instance's, a basetemp)


def _read(state: Path) -> list[Reservation]:
    out = []
    for path in sorted((state / "held").glob("*")):
        mb, _, watch = path.read_text().partition(" ")
        out.append(Reservation(path.name, int(mb), tuple(Path(w) for w in watch.strip().split(":") if w)))
    return out


def used_mb(path: Path) -> int:
    """Disk used under path on its own filesystem (a host's merged root is a mount: not counted)."""
    if not path.exists():
        return 0
    du = shutil.which("du") or "/usr/bin/du"
    proc = subprocess.run([du, "-sxm", str(path)], capture_output=True, text=True, check=False)  # noqa: S603 - our own path
    try:
        return int(proc.stdout.split()[0])
    except (IndexError, ValueError):
        return 0


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_mb(path: Path) -> int:
    return shutil.disk_usage(path).free // MB


@dataclass(frozen=True)
class Decision:
    grant: bool
    room_mb: int  # free space less what the others are still to write, less the margin
    pending_mb: int
    holders: tuple[str, ...]


def decide(
    want_mb: int, free: int, others: list[Reservation], used: Callable[[Path], int], margin: int = MARGIN_MB
) -> Decision:
    """Grant when the disk's free space, less the others' unwritten growth and the margin, holds
    want_mb; or when nobody else holds anything (waiting would then wait for nothing)."""
    pending = sum(max(0, r.mb - sum(used(w) for w in r.watch)) for r in others)
    room = free - pending - margin
    return Decision(not others or room >= want_mb, room, pending, tuple(r.name for r in others))


@contextmanager
def _locked(state: Path) -> Iterator[None]:
    (state / "held").mkdir(parents=True, exist_ok=True)
    with (state / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def reserve(
    state: Path,
    name: str,
    want_mb: int,
    watch: tuple[Path, ...],
    *,
    timeout_s: float = 3600.0,
    say: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
    free: Callable[[Path], int] = free_mb,
    used: Callable[[Path], int] = used_mb,
) -> Decision:
    """Block until want_mb fits beside the others' reservations, then hold it under name."""
    waited = 0.0
    said = False
    while True:
        with _locked(state):
            others = [r for r in _read(state) if r.name != name]
            d = decide(want_mb, free(_existing(watch[0])), others, used)
            late = waited >= timeout_s
            if d.grant or late:
                (state / "held" / name).write_text(f"{want_mb} {':'.join(map(str, watch))}\n")
                if late and not d.grant:
                    say(
                        f"disk: {name} starts after waiting {waited:.0f} s although it needs about "
                        f"{want_mb // 1024} GB and {max(d.room_mb, 0) // 1024} GB are to spare "
                        f"({', '.join(d.holders)} still to write {d.pending_mb // 1024} GB); it may run out of space"
                    )
                elif said:
                    say(f"disk: {name} starts after waiting {waited:.0f} s for room")
                return d
        if not said:
            say(
                f"disk: {name} waits for room: it needs about {want_mb // 1024} GB, and the disk has "
                f"{max(d.room_mb, 0) // 1024} GB to spare while {', '.join(d.holders)} are still to write "
                f"{d.pending_mb // 1024} GB"
            )
            said = True
        sleep(POLL_S)
        waited += POLL_S


def release(state: Path, name: str) -> None:
    with _locked(state):
        (state / "held" / name).unlink(missing_ok=True)


# --- the digest of a failed run ------------------------------------------------------------------

_STEP = re.compile(r"^=== (\S+)$")
_STEP_END = re.compile(r"^--- (\S+) (ok|FAILED) \([0-9]+ s\)$")
_SCENARIO = re.compile(r"^--- molecule scenario (\S+)$")
_SCENARIO_END = re.compile(r"^--- molecule scenario (\S+) (ok|FAILED) \([0-9]+ s\)$")
# Ansible's failed task: its result line, unless the task ignored it.
_FATAL = re.compile(r"^(fatal|failed): \[")
_TASK = re.compile(r"^(TASK|RUNNING HANDLER) \[")
_RESULT_END = re.compile(r"^(TASK|RUNNING HANDLER|PLAY) \[|^PLAY RECAP |^\[ *[0-9]+ s\] |^--- ")
EXCERPT_LINES = 40


def _blocks(lines: list[str], start: re.Pattern[str], end: re.Pattern[str]) -> Iterator[tuple[str, list[str]]]:
    """(name, lines) of each block that ended FAILED; a block cut off (a killed run) counts too."""
    name: str | None = None
    body: list[str] = []
    for line in lines:
        m_end = end.match(line)
        if name is not None and m_end and m_end.group(1) == name:
            if m_end.group(2) == "FAILED":
                yield name, body
            name = None
            continue
        m = start.match(line)  # an end line is never a start: the start patterns end at the name
        if m:
            if name is not None:  # a new block before the last one ended: the last was cut off
                yield name, body
            name, body = m.group(1), []
            continue
        if name is not None:
            body.append(line)
    if name is not None:
        yield name, body


def _last_fatal(body: list[str]) -> list[str]:
    """The last failure Ansible printed that was not ignored, with its task's header and result."""
    for i in range(len(body) - 1, -1, -1):
        if not _FATAL.match(body[i]):
            continue
        j = i + 1
        while j < len(body) and not _RESULT_END.match(body[j]):
            j += 1
        if any(line.startswith("...ignoring") for line in body[i + 1 : j]):
            continue
        head = next((body[k] for k in range(i, -1, -1) if _TASK.match(body[k])), None)
        return ([head] if head else []) + body[i:j][:EXCERPT_LINES]
    return []


def _pytest_summary(body: list[str]) -> list[str]:
    for i, line in enumerate(body):
        if "short test summary info" in line:
            return body[i : i + EXCERPT_LINES]
    return []


def digest(text: str) -> list[str]:
    """For each failed step (and molecule scenario) in a lane's log, the lines that say why."""
    lines = text.splitlines()
    out: list[str] = []
    for scenario, body in _blocks(lines, _SCENARIO, _SCENARIO_END):
        # Molecule's own verdict (CRITICAL: which phase, an idempotence failure's tasks) after the
        # task that failed; a rescued refusal the scenario expects prints "fatal:" too, but the
        # failure that ended the scenario is the last one.
        why = (
            _last_fatal(body)
            + [line for line in body if line.startswith("CRITICAL") and "glob failed" not in line][-10:]
        )
        out.append(f"--- why molecule scenario {scenario} failed:")
        out += why or body[-EXCERPT_LINES:]
    for step, body in _blocks(lines, _STEP, _STEP_END):
        if any(_SCENARIO_END.match(line) for line in body):
            continue  # its scenarios said why above
        out.append(f"--- why {step} failed:")
        out += _pytest_summary(body) or body[-EXCERPT_LINES // 2 :]
    return out


def disk_summary(samples: str) -> str | None:
    """'SECONDS FREE_MB' lines (scripts/test's sampler) as one line: the least free and when."""
    points = [tuple(int(x) for x in line.split()[:2]) for line in samples.splitlines() if len(line.split()) >= 2]
    if not points:
        return None
    at, least = min(points, key=lambda p: p[1])
    first = points[0][1]
    return f"disk: {first / 1024:.1f} GB free when the lanes started, {least / 1024:.1f} GB at the least ({at} s in)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed.lanes", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reserve", help="wait until NAME's peak fits on the disk, then hold it")
    r.add_argument("state", type=Path)
    r.add_argument("name")
    r.add_argument("gb", type=float)
    r.add_argument("watch", type=Path, nargs="+", help="the directories it fills (a sandbox instance's, a basetemp)")
    rel = sub.add_parser("release")
    rel.add_argument("state", type=Path)
    rel.add_argument("name")
    d = sub.add_parser("digest", help="why each failed step of these lane logs failed")
    d.add_argument("logs", type=Path, nargs="+")
    s = sub.add_parser("disk", help="the least free space the sampler saw")
    s.add_argument("samples", type=Path)
    a = p.parse_args(argv)
    if a.cmd == "reserve":
        reserve(a.state, a.name, int(a.gb * 1024), tuple(a.watch), say=lambda m: print(m, flush=True))
    elif a.cmd == "release":
        release(a.state, a.name)
    elif a.cmd == "digest":
        for log in a.logs:
            if log.exists():
                print("\n".join(digest(log.read_text(errors="replace"))))
    elif a.cmd == "disk" and a.samples.exists():
        line = disk_summary(a.samples.read_text())
        if line:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
