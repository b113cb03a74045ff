"""scripts/cold: a run as on a fresh machine starts with no fleet of ours up. The demo leaves its
fleet running, and the command's `scripts/sandbox up` would take those hosts over: the cold demo
of 66087b4 ran site.yml on hosts a warm demo had provisioned (0 changed in 21 s)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Stands in for the checkout's controller: records what it was asked to run.
FAKE_PYTHON = """#!/bin/sh
echo "python $*" >> "$GPUENV_TEST_CALLS"
exit "${GPUENV_TEST_DOWN_RC:-0}"
"""


def _checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(REPO / "scripts" / "cold", root / "scripts" / "cold")
    (root / ".gitignore").write_text(".venv/\n")
    for argv in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"]):
        subprocess.run(["git", *argv], cwd=root, check=True)  # noqa: S607
    python = root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return root


def _cold(root: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    calls = tmp_path / "calls"
    command = f'echo "command in $(basename "$PWD")" >> {calls}'
    return subprocess.run(
        [str(root / "scripts" / "cold"), "sh", "-c", command],
        env={**os.environ, "GPUENV_TEST_CALLS": str(calls), "GPUENV_COLD_NEED_GB": "0", "TMPDIR": str(tmp_path), **env},
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def test_the_fleet_that_is_up_goes_down_before_the_command_runs(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    out = _cold(root, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    # The down comes first, from the checkout's own controller; the command runs in the fresh clone.
    assert (tmp_path / "calls").read_text().splitlines() == ["python -m testbed.sandbox down", "command in src"]


def test_a_fleet_that_will_not_go_down_stops_the_run_with_what_to_do(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    out = _cold(root, tmp_path, GPUENV_TEST_DOWN_RC="1")
    assert out.returncode == 1
    assert "run scripts/sandbox down" in out.stderr
    assert (tmp_path / "calls").read_text().splitlines() == ["python -m testbed.sandbox down"]
