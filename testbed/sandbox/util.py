"""Small helpers shared by the sandbox modules."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence


class SandboxError(Exception):
    """Something the user must act on; the message says what and how."""


def log(message: str) -> None:
    print(f"sandbox: {message}", file=sys.stderr, flush=True)


def run(
    argv: Sequence[str],
    *,
    capture: bool = False,
    check: bool = True,
    timeout: float | None = 300,
    input_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command; with check, a failure raises SandboxError carrying the command's output."""
    try:
        proc = subprocess.run(  # noqa: S603 - argv built by the sandbox, never by a shell
            list(argv), capture_output=capture, text=True, check=False, timeout=timeout, input=input_text
        )
    except FileNotFoundError:
        raise SandboxError(f"{argv[0]} is not installed: run ./scripts/setup") from None
    except subprocess.TimeoutExpired:
        raise SandboxError(f"{' '.join(argv)} did not finish within {timeout} s") from None
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout or "").strip()[-2000:] if capture else "(see above)"
        raise SandboxError(f"{' '.join(argv)} exited {proc.returncode}: {detail}")
    return proc
