"""The one report model (gpuenv.verify.model) as verify, drift and the playbooks use it: a check's
result, the exit-code rule, merging drift's checks, and the report of a command that printed none;
the playbooks' side through their filters, and drift.yml's own expression run on localhost."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuenv import drift
from gpuenv.verify import model
from gpuenv.verify.model import Check
from tests.conftest import run_tool

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "plugins" / "filter"))
from gpuenv_fleet import FilterModule  # noqa: E402 - the plugin lives outside the package

FILTERS = FilterModule().filters()
STACK = {"torch": "2.5.1", "cuda": "12.4.1"}


def test_a_judged_check_carries_its_hint_only_when_it_fails() -> None:
    assert Check.judged("drift.cudnn", True, "ok", "9.1", "9.1", "fix").hint is None
    failed = Check.judged("drift.cudnn", False, "not ok", "9.2", "9.1", "fix")
    assert (failed.status, failed.hint) == ("fail", "fix")


def test_the_exit_code_rule() -> None:
    ok, warn, skip = ({"id": "a.b", "status": s} for s in ("pass", "warn", "skip"))
    assert model.exit_code([ok, warn, skip]) == 0
    assert model.exit_code([ok, {"id": "drift.cudnn", "status": "fail"}]) == 1
    assert model.exit_code([{"id": "drift.cudnn", "status": "fail"}, {"id": "verify.run", "status": "fail"}]) == 2


def test_a_report_verify_printed_is_taken_as_it_is() -> None:
    printed = model.to_report([Check("torch.build", "fail", "x", hint="h")], "sb1", run="r1")
    result = {"rc": 1, "stdout": json.dumps(printed), "stderr": "FAIL  torch.build ..."}
    assert model.from_command(result, "sb1", "could not run", "hint") == printed


@pytest.mark.parametrize(
    ("result", "error"),
    [
        (
            {"rc": 2, "stdout": "", "msg": "[Errno 2] No such file or directory: b'/usr/local/bin/gpuenv-verify'"},
            "rc 2: ",
        ),
        ({"rc": 127, "stdout": "", "stderr": "/usr/bin/python3: not found"}, "rc 127: /usr/bin/python3: not found"),
        ({"rc": 0, "stdout": "PASS  torch.build ...", "stderr": ""}, "rc 0: "),  # lines, not a report
        ({"rc": 1, "stdout": '{"cut short', "stderr": "Killed"}, "rc 1: Killed"),
        ({"stdout": "", "msg": "skipped"}, "rc none: skipped"),
    ],
)
def test_a_command_that_printed_no_report_gets_a_failing_one(result: dict[str, Any], error: str) -> None:
    report = model.from_command(result, "sb1", "gpuenv verify could not run on the host", "run site.yml", STACK, "r1")
    assert (report["exit_code"], report["run"], report["stack_id"]) == (2, "r1", model.stack_id(STACK))
    (check,) = report["checks"]
    assert (check["id"], check["status"], check["hint"]) == ("verify.run", "fail", "run site.yml")
    assert check["observed"].startswith(error)


def test_drift_writes_its_checks_in_the_model() -> None:
    found = drift.compare({"cudnn": "9.1.0.70"}, {}, cuda_link=None, env_link=None, lock=None, freeze=None)
    checks = [c.as_dict() for c in found]
    assert all(set(c) == set(Check("a.b", "pass", "").as_dict()) for c in checks)
    assert {c["id"]: c["hint"] for c in checks}["drift.cudnn"] == drift.HINT


@pytest.mark.ansible
def test_drift_yml_takes_verify_s_report_or_makes_the_stand_in(tmp_path: Path, venv_env: dict[str, str]) -> None:
    """drift.yml's task that reads the host's report, run on localhost with what gpuenv-verify
    --drift registered: a host whose command printed a report, and one where the command is missing."""
    tasks = yaml.safe_load((REPO / "playbooks/drift.yml").read_text())[1]["tasks"]
    (compare,) = [t for t in tasks if t["name"] == "Read the host's report"]
    printed = model.to_report([Check("torch.build", "pass", "ok"), Check("drift.cudnn", "fail", "no")], "localhost")
    registered = {"gpu_stack_resolved": {"cudnn": "9.1.0.70", "cuda": "12.4.1"}}
    cases = {
        "printed": {"rc": 0, "stdout": json.dumps(printed), "stderr": ""},
        "missing": {"rc": 2, "stdout": "", "msg": "[Errno 2] No such file or directory: b'gpuenv-verify'"},
    }
    plays = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {**registered, "gpuenv_drift_register_verify": result},
            "tasks": [
                compare,
                {
                    "ansible.builtin.copy": {
                        "content": "{{ gpuenv_drift_report | to_json }}",
                        "dest": str(tmp_path / name),
                    }
                },
            ],
        }
        for name, result in cases.items()
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays))
    env = {**venv_env, "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp")}
    run = run_tool(
        "ansible-playbook",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        str(tmp_path / "play.yml"),
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads((tmp_path / "printed").read_text()) == printed  # verify's checks and drift's, as printed
    stand_in = json.loads((tmp_path / "missing").read_text())
    assert stand_in["checks"][0]["id"] == "verify.run"
    assert stand_in["checks"][0]["observed"].startswith("rc 2: [Errno 2] No such file")
    assert stand_in["exit_code"] == 2
