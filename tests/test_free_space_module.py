"""The gpuenv_free_space module (plugins/modules): a build that will not fit is refused before it
starts, naming both figures."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import load_plugin

REPO = Path(__file__).resolve().parents[1]
mod = load_plugin("plugins/modules/gpuenv_free_space.py")


class Vfs:
    def __init__(self, free_mb: int) -> None:
        self.f_frsize = 4096
        self.f_bavail = free_mb * 1024 * 1024 // 4096


def test_a_build_that_fits_passes_and_reports_the_room(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mod.os, "statvfs", lambda path: Vfs(5000))
    out = mod.judge(str(tmp_path / "cuda"), 900, "the CUDA 12.4.1 toolkit tree", "free space there")
    assert out == {"changed": False, "free_mb": 5000, "measured": str(tmp_path)}


def test_a_build_that_does_not_fit_names_both_figures_and_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []

    def statvfs(path: str) -> Any:
        seen.append(path)
        return Vfs(64)

    monkeypatch.setattr(mod.os, "statvfs", statvfs)
    (tmp_path / "opt").mkdir()
    out = mod.judge(
        str(tmp_path / "opt/gpuenv/envs/.store/default-abc"),
        9000,
        "the environment default (torch 2.5.1+cu124)",
        "free space there, or set pytorch_env_root to a directory on a bigger disk",
    )
    assert out["failed"] is True
    assert out["msg"] == (
        f"the environment default (torch 2.5.1+cu124) needs about 9000 MiB at {tmp_path}/opt/gpuenv/envs/.store/"
        f"default-abc, and its filesystem has 64 MiB free (measured at {tmp_path}/opt); nothing was changed. "
        "Free space there, or set pytorch_env_root to a directory on a bigger disk."
    )
    assert seen == [str(tmp_path / "opt")]  # the nearest directory that exists


def test_the_real_filesystem_is_measured(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    assert mod.free_mb(str(tmp_path)) == st.f_bavail * st.f_frsize // (1024 * 1024)
