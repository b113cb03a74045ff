"""The limits on a verify run: a deadline for the whole run and one for each check.

A wedged GPU or a stuck network filesystem hangs torch inside C (its import, CUDA's initialisation,
a kernel that never returns), where no Python exception reaches the main thread. So a watchdog
thread reads the clock, and when the run or the check in progress passes its limit it writes the
failing report itself (the checks done so far, and a failing verify.run check that names what
overran) and ends the process with exit 2. The playbooks' task has a timeout beyond both.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuenv.verify.model import FAIL, RUN_CHECK, Check

# The defaults, in seconds: a healthy host runs every check in under a minute (the import of a CUDA
# torch takes up to 20 s on a cold page cache); the all-reduce forks ranks that wait on each other.
RUN_DEADLINE = 600.0
CHECK_DEADLINE = 300.0
IMPORT = "importing torch"


@dataclass
class Watchdog:
    """What runs now, since when, and what has finished; `overrun` says whether a limit has passed."""

    total: float = RUN_DEADLINE
    per_check: float = CHECK_DEADLINE
    clock: Callable[[], float] = time.monotonic
    current: str = IMPORT
    done: list[Check] = field(default_factory=list)
    started: float = 0.0
    check_started: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _stopped: threading.Event = field(default_factory=threading.Event, repr=False)

    def __post_init__(self) -> None:
        self.started = self.check_started = self.clock()

    def begin(self, what: str) -> None:
        with self._lock:
            self.current, self.check_started = what, self.clock()

    def finish(self, check: Check) -> None:
        with self._lock:
            self.done.append(check)

    def overrun(self) -> Check | None:
        """The failing check that says what overran which limit, or None while both hold."""
        now = self.clock()
        with self._lock:
            current, done = self.current, len(self.done)
            whole = now - self.started > self.total
            one = now - self.check_started > self.per_check
        if not (whole or one):
            return None
        limit = (
            f"the whole run's limit of {self.total:g} s (--deadline)"
            if whole
            else f"the limit of {self.per_check:g} s for one check (--check-deadline)"
        )
        return Check(
            RUN_CHECK,
            FAIL,
            f"verify was stopped: {current} ran past {limit}",
            observed=f"{done} checks finished before; {current} was still running",
            expected="every check ends within its limit",
            hint="a hung GPU or a stuck file system holds torch: check nvidia-smi and dmesg (Xid errors) and the "
            "mounts the environment lives on; raise the limit only when the host is merely slow",
        )

    def stop(self) -> None:
        """The checks are done: the report is the main thread's to write."""
        self._stopped.set()

    def finished_checks(self) -> list[Check]:
        with self._lock:
            return list(self.done)

    def watch(self, on_overrun: Callable[[list[Check]], object], tick: float = 0.5) -> threading.Thread:
        """Start the thread: past a limit it calls on_overrun with the checks to report and ends the
        process with exit 2, whatever the main thread is stuck in."""

        def loop() -> None:
            while not self._stopped.wait(tick):
                found = self.overrun()
                if found is not None:
                    try:
                        on_overrun([*self.finished_checks(), found])
                    finally:
                        os._exit(2)

        thread = threading.Thread(target=loop, name="gpuenv-verify-deadline", daemon=True)
        thread.start()
        return thread
