"""The gpuenv_package callback: a Python that cannot import the gpuenv package is told how to fix
that at the start of the run, instead of meeting "No filter named ..." at the first task."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import pytest

from tests.conftest import REPO, load_plugin


def test_a_python_with_the_package_is_told_nothing() -> None:
    plugin = load_plugin("plugins/callback/gpuenv_package.py")
    assert plugin.missing_package_message(sys.executable) is None


def test_a_python_without_the_package_is_told_the_ways_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = load_plugin("plugins/callback/gpuenv_package.py")
    real = importlib.util.find_spec

    def without_gpuenv(name: str, *args: Any) -> Any:
        return None if name == "gpuenv" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_gpuenv)
    message = plugin.missing_package_message("/usr/bin/python3")
    assert message is not None
    assert "(/usr/bin/python3) cannot import it" in message
    assert "./scripts/setup" in message
    assert "PYTHONPATH" in message


def test_the_callback_is_enabled_beside_the_rollout_summary() -> None:
    enabled = next(line for line in (REPO / "ansible.cfg").read_text().splitlines() if line.startswith("callbacks_"))
    assert "gpuenv_package" in enabled
