"""roles/pytorch_env's messages, rendered by Ansible on the controller as the role renders them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, run_tool

TEMPLATE = REPO / "roles/pytorch_env/templates/install-failed.j2"
# pip's log of a torch install: pages of progress on stdout, the error alone on stderr.
PIP_LOG = (
    "".join(
        f"Collecting pkg{i}\n  Downloading http://10.199.2.1:3142/pypi/files/pkg{i}-1.0-py3-none-any.whl (135 kB)\n"
        for i in range(200)
    )
    + "Installing collected packages: mpmath, sympy, nvidia-cudnn-cu11, torch\n"
)
PIP_ERROR = "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device\n"


def _render(tmp_path: Path, venv_env: dict[str, str], stdout: str, stderr: str) -> str:
    facts = {
        "pytorch_env_installer": "pip",
        "pytorch_env_dir": "/opt/gpuenv/envs/.store/default-40a453800f4f",
        "pytorch_env_register_resolve": {"rc": 1, "stdout": stdout, "stderr": stderr},
    }
    (tmp_path / "vars.json").write_text(json.dumps(facts))
    run = run_tool(
        "ansible",
        "localhost",
        "-m",
        "ansible.builtin.debug",
        "-a",
        f"msg={{{{ lookup('ansible.builtin.template', '{TEMPLATE}') }}}}",
        "-e",
        f"@{tmp_path / 'vars.json'}",
        env={
            **venv_env,
            "ANSIBLE_NOCOLOR": "1",
        },
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    # The ad-hoc command's one result: "localhost | SUCCESS =>" and the result in YAML (ansible.cfg's
    # callback_result_format).
    msg: str = yaml.safe_load(run.stdout.split("=>", 1)[1])["msg"]
    return msg


@pytest.mark.ansible
def test_a_failed_install_shows_the_installers_error_not_just_its_download_log(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    # A cold run's failure read only "...Installing collected packages: ...": the last 1,500 characters of
    # stderr and stdout together were stdout's, and pip's error on stderr was cut off.
    msg = _render(tmp_path, venv_env, PIP_LOG, PIP_ERROR)
    assert "It said: ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device" in msg
    assert "Its output ended: ...".lower() in msg.lower()
    assert "Installing collected packages: mpmath, sympy, nvidia-cudnn-cu11, torch" in msg
    assert "pkg3 " not in msg  # the download log's beginning is not repeated


@pytest.mark.ansible
def test_a_missing_wheel_is_explained_from_either_stream(tmp_path: Path, venv_env: dict[str, str]) -> None:
    err = "ERROR: Could not find a version that satisfies the requirement foo (from versions: none)\n"
    msg = _render(tmp_path, venv_env, "", err)
    assert "It said: ERROR: Could not find a version" in msg
    assert "Its output ended" not in msg
    assert "gpuenv installs as root with wheels only" in msg
