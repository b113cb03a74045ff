"""The preflight's verdict (plugins/action/gpuenv_preflight.py): refuse with the check's report, or
publish the resolved stack, a CPU build's without CUDA; and the plugin as ansible-playbook runs it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import REPO, load_plugin, run_tool

action = load_plugin("plugins/action/gpuenv_preflight.py")

STACK = {"torch": "2.5.1", "torch_variant": "cu124", "torch_cuda": "12.4", "torch_cudnn": "9.1.0"}


def test_a_failed_check_is_refused_with_its_report_line_by_line() -> None:
    out = action.verdict(
        {"ok": False, "verdict": "incompatible", "text": "INCOMPATIBLE\n  - driver too old", "stack": None}
    )
    assert out == {"failed": True, "msg": ["INCOMPATIBLE", "  - driver too old"]}


def test_a_passed_check_prints_its_verdict_and_its_warnings_only_when_there_are_some() -> None:
    quiet = action.verdict({"ok": True, "verdict": "compatible", "text": "report", "warnings": [], "stack": STACK})
    assert quiet["msg"] == ["compatible: 2.5.1+cu124"]
    assert quiet["stack"] == STACK
    warned = action.verdict({"ok": True, "verdict": "compatible", "text": "a\nb", "warnings": ["w"], "stack": STACK})
    assert warned["msg"] == ["compatible: 2.5.1+cu124", "a", "b"]


def _play(tmp_path: Path, venv_env: dict[str, str], stack: dict[str, Any], cpu: bool) -> Any:
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {"gpuenv_preflight": {"stack": stack, "cpu_build": cpu}, "register": "out"},
                {
                    "ansible.builtin.copy": {
                        "content": "{{ out.resolved | to_json }}",
                        "dest": str(tmp_path / "r.json"),
                    }
                },
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = dict(venv_env, ANSIBLE_NOCOLOR="1", ANSIBLE_ACTION_PLUGINS=str(REPO / "plugins" / "action"))
    return run_tool(
        "ansible-playbook", "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml"),
        "-e", json.dumps({"ansible_python_interpreter": sys.executable}), env=env, timeout=120,
    )  # fmt: skip


def test_the_plugin_checks_publishes_the_stack_and_refuses_a_failed_check(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    good = {"profile": "torch-2.5-cu124", "gpu": "NVIDIA GeForce RTX 4090"}
    run = _play(tmp_path, venv_env, good, cpu=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "compatible: 2.5.1+cu124" in run.stdout
    resolved = json.loads((tmp_path / "r.json").read_text())
    assert resolved["torch"] == "2.5.1"
    # A CPU build's: no CUDA in torch to match.
    assert {k: resolved[k] for k in ("torch_variant", "torch_cuda", "torch_cudnn", "torch_min_driver")} == {
        "torch_variant": "cpu",
        "torch_cuda": None,
        "torch_cudnn": None,
        "torch_min_driver": None,
    }
    (tmp_path / "r.json").unlink()
    run = _play(tmp_path, venv_env, {**good, "driver": "470"}, cpu=False)
    assert run.returncode != 0
    assert "verdict: incompatible" in run.stdout, run.stdout
    assert "470" in run.stdout
    assert not (tmp_path / "r.json").exists()
