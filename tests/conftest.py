from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

# torch's compiler (dynamo, which the compute checks' optimizer steps import) registers its stand-ins
# for builtins such as sys.intern when first imported, and refuses the wrapper Ansible's module_utils
# put in its place: imported first, before any test loads ansible.module_utils.basic, it keeps
# working in one pytest run with both.
with contextlib.suppress(ImportError):
    import torch._dynamo  # noqa: F401

REPO = Path(__file__).resolve().parents[1]


def run_tool(name: str, *args: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run one of the venv's commands (ansible, ansible-playbook, ...) from the repo root, output captured.

    With a stdin of its own: ssh sets O_NONBLOCK on the stdin it inherits, a flag of the open file that
    every process which inherited it shares, and an ansible-playbook started meanwhile then refuses to
    run ("Ansible requires blocking IO on stdin/stdout/stderr"). The fleet tests run ssh and Ansible
    side by side (a cold run's single-host faults failed so)."""
    return subprocess.run(
        [str(Path(sys.executable).parent / name), *args],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def run_local_play(
    tmp_path: Path, plays: list[dict[str, Any]], venv_env: dict[str, str], *, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Write PLAYS to tmp_path/play.yml and run it on the controller (localhost, local connection,
    this venv's Python), with the repo's roles: a role's task file run for real, as on a host."""
    (tmp_path / "play.yml").write_text(yaml.safe_dump(plays, sort_keys=False))
    env = dict(venv_env, ANSIBLE_NOCOLOR="1", ANSIBLE_ROLES_PATH=str(REPO / "roles"))
    return run_tool(
        "ansible-playbook", "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml"),
        "-e", json.dumps({"ansible_python_interpreter": sys.executable}), env=env, timeout=timeout,
    )  # fmt: skip


def check_mode_plans(
    playbook: Path, inventory: Path, tmp: Path, env: dict[str, str], plan_key: str, *, timeout: float
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], dict[str, str]]:
    """A role's plan in check mode on the controller (tests/ansible/: each inventory host the
    controller reporting another OS through the test modules in library/): the run, the debug
    message holding `plan_key` of each host that got that far, and each failed host's message."""
    env = dict(env)
    env.update(
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.oneline",
        ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"),
        ANSIBLE_LIBRARY=f"{playbook.parent / 'library'}:{REPO / 'plugins' / 'modules'}",
    )
    run = run_tool("ansible-playbook", "--check", "-i", str(inventory), str(playbook), env=env, timeout=timeout)
    plans: dict[str, Any] = {}
    failures: dict[str, str] = {}
    for line in run.stdout.splitlines():
        match = re.match(r"^(\S+) \| (SUCCESS|CHANGED|FAILED!) => (\{.*\})$", line)
        if not match:
            continue
        host, status, body = match.groups()
        msg = json.loads(body).get("msg")
        if status == "FAILED!":
            failures[host] = str(msg)
        elif isinstance(msg, dict) and plan_key in msg:
            plans[host] = msg
    return run, plans, failures


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def gpuenv_cmd() -> list[str]:
    """The gpuenv command as a user runs it (the console script when installed)."""
    script = Path(sys.executable).parent / "gpuenv"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpuenv"]


@pytest.fixture(scope="session")
def venv_env() -> dict[str, str]:
    """The environment for the venv's Ansible commands (tests copy it before changing it)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env.pop("ANSIBLE_INVENTORY", None)
    return env


MODULE_UTILS = REPO / "plugins" / "module_utils"
# What the package shares with the modules (ansible.cfg's second module_utils folder).
SHARED_MODULE_UTILS = REPO / "gpuenv" / "module_utils"


def module_utils(name: str) -> ModuleType:
    """A module_utils file as gpuenv's modules import it, ansible.module_utils.<name>: one the package
    shares (gpuenv/module_utils) is the package's own module, so that the tests and the controller's
    code share one object; a file of plugins/module_utils is loaded from itself."""
    key = f"ansible.module_utils.{name}"
    if key in sys.modules:
        return sys.modules[key]
    if (SHARED_MODULE_UTILS / f"{name}.py").is_file():
        module = importlib.import_module(f"gpuenv.module_utils.{name}")
    else:
        spec = importlib.util.spec_from_file_location(key, MODULE_UTILS / f"{name}.py")
        assert spec
        assert spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        try:
            spec.loader.exec_module(module)
        except ModuleNotFoundError as err:
            # It imports another module_utils file not loaded yet: that one first, then this again.
            sys.modules.pop(key, None)
            needed = str(err.name or "")
            if not needed.startswith("ansible.module_utils.gpuenv_") or needed == key:
                raise
            module_utils(needed.rsplit(".", 1)[1])
            return module_utils(name)
    sys.modules[key] = module
    return module


def load_plugin(relative: str) -> ModuleType:
    """One of gpuenv's plugins (plugins/modules/x.py, plugins/callback/x.py) imported from its file, with
    every module_utils file standing in for the copy Ansible would ship beside a module (the package's
    shared ones first: the other files import them)."""
    shared = sorted(p for p in SHARED_MODULE_UTILS.glob("gpuenv_*.py"))
    for path in [*shared, *sorted(MODULE_UTILS.glob("*.py"))]:
        module_utils(path.stem)
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def run_module(module: ModuleType, capsys: pytest.CaptureFixture[str], params: dict[str, Any]) -> dict[str, Any]:
    """Run one of gpuenv's modules' main() with these arguments (_ansible_check_mode, _ansible_diff
    among them) and return the JSON it exits with."""
    from ansible.module_utils.testing import patch_module_args  # noqa: PLC0415 - only the module tests need it

    with patch_module_args(params), pytest.raises(SystemExit):
        module.main()
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result
