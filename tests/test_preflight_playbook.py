"""The Ansible preflight (playbooks/preflight.yml, role gpu_stack) on the controller itself.

These plays only read (facts, `command -v nvidia-smi`), so running them on localhost is safe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import gpuenv.checkspec
from gpuenv.preflight import check_host
from tests.conftest import run_tool

pytestmark = pytest.mark.ansible

REPO = Path(__file__).resolve().parents[1]


def _inventory(tmp_path: Path, stack: dict[str, Any] | None) -> Path:
    inv = tmp_path / "inventory"
    (inv / "group_vars").mkdir(parents=True)
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_hosts": {"hosts": {"localhost": host}}}}}))
    if stack is not None:
        (inv / "group_vars" / "gpu_hosts.yml").write_text(yaml.safe_dump({"gpu_stack": stack}))
    return inv


def _play(
    venv_env: dict[str, str],
    inv: Path,
    *extra: str,
    path_prefix: Path | None = None,
    playbook: str = "playbooks/preflight.yml",
    inject_facts: bool = True,
) -> subprocess.CompletedProcess[str]:
    env = dict(venv_env)
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_INJECT_FACT_VARS"] = str(inject_facts)
    env["ANSIBLE_LOCAL_TEMP"] = str(inv.parent / "ansible-tmp")
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    return run_tool("ansible-playbook", "-i", str(inv), playbook, *extra, env=env, timeout=300)


GOOD = {"profile": "torch-2.5-cu124", "gpu": "NVIDIA GeForce RTX 4090"}


def test_compatible_stack_passes_and_changes_nothing(tmp_path: Path, venv_env: dict[str, str]) -> None:
    run = _play(venv_env, _inventory(tmp_path, GOOD))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "compatible: 2.5.1+cu124" in run.stdout
    assert "changed=0" in run.stdout


def test_incompatible_stack_stops_with_the_reasons(tmp_path: Path, venv_env: dict[str, str]) -> None:
    run = _play(venv_env, _inventory(tmp_path, {**GOOD, "gpu": "NVIDIA GeForce RTX 5090"}))
    assert run.returncode != 0
    assert "torch 2.5.1+cu124 has no kernels for compute capability 12.0" in run.stdout
    assert "fix: use torch >= 2.7 with cu128" in run.stdout


def test_a_stack_the_schema_refuses_stops_with_the_schema_s_message(tmp_path: Path, venv_env: dict[str, str]) -> None:
    # An invalid stack resolves to nothing: the refusal must still print why, not fail on the
    # missing resolved stack while rendering its success message.
    run = _play(venv_env, _inventory(tmp_path, {**GOOD, "torch_variant": "cuda"}))
    assert run.returncode != 0
    assert "gpu_stack.torch_variant: " in run.stdout
    assert "is not the PyTorch CUDA wheel variant" in run.stdout
    assert "has no attribute" not in run.stdout + run.stderr


def test_a_cpu_build_asked_for_is_what_the_resolved_stack_expects(tmp_path: Path, venv_env: dict[str, str]) -> None:
    inv = _inventory(tmp_path, GOOD)
    play = tmp_path / "resolved.yml"
    play.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "gpu_hosts",
                    "gather_facts": False,
                    "roles": [{"role": str(REPO / "roles/gpu_stack")}],
                    "tasks": [
                        {
                            "ansible.builtin.copy": {
                                "content": "{{ gpu_stack_resolved | to_json }}",
                                "dest": str(tmp_path / "resolved.json"),
                                "mode": "0644",
                            }
                        }
                    ],
                }
            ]
        )
    )
    # The resolved stack is a variable of the host whether or not Ansible injects facts as variables
    # (inject_facts_as_vars = False, which sites set; an action's facts would be hidden then).
    for cpu, inject in ((False, True), (True, True), (True, False)):
        (tmp_path / "resolved.json").unlink(missing_ok=True)
        run = _play(venv_env, inv, "-e", f"gpu_stack_torch_cpu={cpu}", playbook=str(play), inject_facts=inject)
        assert run.returncode == 0, run.stdout
        resolved = json.loads((tmp_path / "resolved.json").read_text())
        assert resolved["torch"] == "2.5.1"
        if cpu:
            assert (resolved["torch_variant"], resolved["torch_cuda"], resolved["torch_cudnn"]) == ("cpu", None, None)
        else:
            assert (resolved["torch_variant"], resolved["torch_cuda"]) == ("cu124", "12.4")


def test_incompatible_stack_also_fails_in_check_mode(tmp_path: Path, venv_env: dict[str, str]) -> None:
    run = _play(venv_env, _inventory(tmp_path, {**GOOD, "driver": "470"}), "--check")
    assert run.returncode != 0
    assert "driver 470 is too old for CUDA 12.4.1" in run.stdout


def test_site_yml_starts_with_the_preflight() -> None:
    site = yaml.safe_load((REPO / "playbooks/site.yml").read_text())
    assert site[0]["ansible.builtin.import_playbook"] == "preflight.yml"


def _fake_nvidia_smi(tmp_path: Path, script: str) -> Path:
    """A directory holding an nvidia-smi that runs `script`, to put first on PATH."""
    fake = tmp_path / "bin"
    fake.mkdir()
    smi = fake / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{script}\n")
    smi.chmod(0o755)
    return fake


def test_detected_gpus_are_checked(tmp_path: Path, venv_env: dict[str, str]) -> None:
    fake = _fake_nvidia_smi(tmp_path, "echo 'NVIDIA GeForce RTX 5090, 12.0'")
    run = _play(venv_env, _inventory(tmp_path, GOOD), path_prefix=fake)
    assert run.returncode != 0
    assert "no kernels for compute capability 12.0 (NVIDIA GeForce RTX 5090)" in run.stdout


def test_nvidia_smi_failure_that_is_not_no_driver_fails_the_probe(tmp_path: Path, venv_env: dict[str, str]) -> None:
    fake = _fake_nvidia_smi(
        tmp_path, "echo 'Unable to determine the device handle for GPU0: Unknown Error' >&2; exit 15"
    )
    run = _play(venv_env, _inventory(tmp_path, GOOD), path_prefix=fake)
    assert run.returncode != 0
    assert "list its GPUs and NVIDIA PCI devices" in run.stdout
    assert "nvidia-smi could not list the GPUs (exit 15)" in run.stdout
    assert "Unable to determine the device handle" in run.stdout


def test_missing_stack_says_how_to_declare_one(tmp_path: Path, venv_env: dict[str, str]) -> None:
    run = _play(venv_env, _inventory(tmp_path, None))
    assert run.returncode != 0
    assert "No gpu_stack is declared for localhost" in run.stdout


def test_os_mismatch_is_refused(tmp_path: Path, venv_env: dict[str, str]) -> None:
    run = _play(venv_env, _inventory(tmp_path, {**GOOD, "os": "rhel9"}))
    assert run.returncode != 0
    assert "gpu_stack.os is rhel9 but the host runs" in run.stdout


@pytest.mark.parametrize("stack", [GOOD, {**GOOD, "gpu": "RTX 5090"}, {"driver": 550}, {**GOOD, "python": 3.1}])
def test_the_preflight_and_check_spec_agree(stack: dict[str, Any]) -> None:
    from_preflight = check_host(stack, roles_dir=REPO / "roles")
    from_preflight.pop("text")
    assert from_preflight == gpuenv.checkspec.check_mapping(stack)


def test_an_nvidia_smi_without_compute_cap_falls_back_to_names(tmp_path: Path, venv_env: dict[str, str]) -> None:
    script = (
        'case "$1" in --query-gpu=name) echo "NVIDIA GeForce RTX 5090";; '
        "*) echo 'Field \"compute_cap\" is not a valid field to query.' >&2; exit 2;; esac"
    )
    run = _play(venv_env, _inventory(tmp_path, GOOD), path_prefix=_fake_nvidia_smi(tmp_path, script))
    assert run.returncode != 0
    assert "no kernels for compute capability 12.0 (NVIDIA GeForce RTX 5090)" in run.stdout


def test_a_stage_after_the_preflight_checks_nothing_again_and_alone_checks_first(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    # site.yml's stages follow its preflight play: there the stage's own preflight is one skipped
    # include, not the role's dozen tasks again. Run alone, the stage checks the stack itself.
    inv = _inventory(tmp_path, GOOD)
    both = tmp_path / "site-like.yml"
    both.write_text(
        yaml.safe_dump(
            [{"ansible.builtin.import_playbook": str(REPO / f"playbooks/{p}.yml")} for p in ("preflight", "cuda")]
        )
    )
    check = "TASK [gpu_stack : Check the stack against the compatibility data"
    run = _play(venv_env, inv, "--tags", "preflight", playbook=str(both))
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(check) == 1
    alone = _play(venv_env, inv, "--tags", "preflight", playbook="playbooks/cuda.yml")
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert alone.stdout.count(check) == 1
    assert "compatible: 2.5.1+cu124" in alone.stdout
