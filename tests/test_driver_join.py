"""The nvidia_driver role's join (tasks/join.yml): an install started in the background fails the
host where it is joined, with the module's own message, and nothing after it runs (no module check,
no reboot, no record); a host whose install ran in one go skips the join. site.yml starts the
install in driver_start.yml and joins it in driver_finish.yml."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from tests.conftest import run_tool

REPO = Path(__file__).resolve().parents[1]


def _play(tmp_path: Path, background: bool) -> list[dict[str, object]]:
    # What install-apt.yml's task runs: gpuenv_apt_pin, here with a pin apt does not offer, so that
    # the module fails before it touches dpkg, under Ansible's async wrapper or in one go.
    start: dict[str, object] = {
        "name": "Start an install that will fail",
        "gpuenv_apt_pin": {
            "package": "nvidia-driver",
            "offered": {"nvidia-driver": "535.247.01-1~deb12u1"},
            "pin": "550",
            "packages": ["nvidia-driver"],
        },
        "register": "nvidia_driver_register_install",
        "ignore_errors": not background,
    }
    if background:
        start.update({"async": 60, "poll": 0})
    return [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                start,
                {
                    "name": "Join it",
                    "ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": "join.yml"},
                },
                {
                    "name": "Mark that the join let the play go on",
                    "ansible.builtin.copy": {"content": "went on\n", "dest": str(tmp_path / "after"), "mode": "0644"},
                },
            ],
        }
    ]


def _run(tmp_path: Path, venv_env: dict[str, str], background: bool) -> str:
    (tmp_path / "play.yml").write_text(yaml.safe_dump(_play(tmp_path, background), sort_keys=False))
    env = dict(venv_env, ANSIBLE_NOCOLOR="1", ANSIBLE_ROLES_PATH=str(REPO / "roles"))
    out = run_tool(
        "ansible-playbook", "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml"),
        "-e", json.dumps({"ansible_python_interpreter": sys.executable}), env=env, timeout=180,
    )  # fmt: skip
    assert (out.returncode != 0) is background, out.stdout[-3000:]
    return out.stdout


@pytest.mark.ansible
def test_a_background_install_that_failed_fails_the_host_at_the_join_with_its_message(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    out = _run(tmp_path, venv_env, background=True)
    assert "nvidia_driver : Wait for the driver's install, started in the background" in out
    assert "no version of nvidia-driver that apt offers matches 550" in out, out[-3000:]
    # The host stopped there: no module check, no reboot, no record, nothing after the join.
    assert "Read which driver is loaded" not in out
    assert "Record what the driver role installed" not in out
    assert not (tmp_path / "after").exists()


@pytest.mark.ansible
def test_an_install_that_ran_in_one_go_skips_the_join(tmp_path: Path, venv_env: dict[str, str]) -> None:
    out = _run(tmp_path, venv_env, background=False)
    assert "no version of nvidia-driver that apt offers matches 550" in out  # the start's own failure
    assert "Wait for the driver's install" not in out
    assert (tmp_path / "after").read_text() == "went on\n"


def _specs(role: str) -> dict[str, Any]:
    specs = yaml.safe_load((REPO / "roles" / role / "meta/argument_specs.yml").read_text())
    return dict(specs["argument_specs"]["main"]["options"])


def test_the_install_goes_to_the_background_only_where_cuda_and_cudnn_take_nothing_from_apt() -> None:
    # Their apt steps would wait for the background dpkg, and their holds race it. The expression
    # names the roles' defaults (the driver's role does not load those roles): unset, each source is
    # its role's default.
    text = yaml.safe_load((REPO / "roles/nvidia_driver/vars/main.yml").read_text())["__nvidia_driver_apt_beside"]
    # An expression, not a template rendered into HTML: no escaping applies.
    environment = jinja2.Environment(autoescape=False)  # noqa: S701
    beside = environment.compile_expression(text.strip().removeprefix("{{").removesuffix("}}"))
    apt_sources = {"debian", "nvidia_repo"}
    cuda, cudnn = _specs("cuda_toolkit")["cuda_toolkit_source"], _specs("cudnn")["cudnn_source"]
    for cuda_source in cuda["choices"]:
        for cudnn_source in cudnn["choices"]:
            wanted = cuda_source in apt_sources or cudnn_source in apt_sources
            assert beside(cuda_toolkit_source=cuda_source, cudnn_source=cudnn_source) is wanted
    # Unset, each source is its role's default (which takes nothing from apt: site.yml's common case).
    assert beside() is beside(cuda_toolkit_source=cuda["default"], cudnn_source=cudnn["default"]) is False


def _initramfs(tmp_path: Path, venv_env: dict[str, str], *, pending: bool) -> bool:
    """initramfs.yml and the handler it notifies, on this machine: whether update-initramfs ran.
    PENDING: the install's module reported a held update (its marker, a file under TMP_PATH, exists
    then). The blacklist's path and update-initramfs are fakes under TMP_PATH too."""
    bin_dir, ran, marker = tmp_path / "bin", tmp_path / "ran", tmp_path / "pending"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "update-initramfs"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {ran}\n')
    fake.chmod(0o755)
    if pending:
        marker.touch()
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {
                "__nvidia_driver_pkg_mgr": "apt",
                "nvidia_driver_register_host": {"commands": {"update-initramfs": str(fake), "dracut": None}},
                "nvidia_driver_register_install": {"install": [], "initramfs_pending": pending},
            },
            "tasks": [
                {"ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": "initramfs.yml"}},
                {"ansible.builtin.meta": "flush_handlers"},
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = dict(venv_env, ANSIBLE_NOCOLOR="1", ANSIBLE_ROLES_PATH=str(REPO / "roles"))
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    extra = {
        "ansible_python_interpreter": sys.executable,
        "__nvidia_driver_blacklist_path": str(tmp_path / "bl.conf"),
        "__nvidia_driver_initramfs_marker": str(marker),
    }
    out = run_tool(
        "ansible-playbook", "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml"), "-e", json.dumps(extra),
        env=env, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:]
    assert "blacklist nouveau" in (tmp_path / "bl.conf").read_text()
    done = ran.exists()
    if done:
        assert ran.read_text() == "-u -k all\n"  # once, for every kernel
        ran.unlink()
    # The update made, the marker goes; where none was made, a marker would stay for the next run.
    assert not marker.exists() or not done
    return done


@pytest.mark.ansible
def test_the_initramfs_is_updated_once_after_the_install_for_what_it_held_and_the_blacklist(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    # A first run: the blacklist is new and the install held the packages' updates: one update.
    assert _initramfs(tmp_path, venv_env, pending=True)
    # Nothing held and the blacklist as it was: none.
    assert not _initramfs(tmp_path, venv_env, pending=False)
    # A marker an earlier run left (it died before its update), or a driver upgrade's held update.
    assert _initramfs(tmp_path, venv_env, pending=True)
    # A blacklist changed by hand (or lost): written back, and updated.
    (tmp_path / "bl.conf").write_text("# edited\n")
    assert _initramfs(tmp_path, venv_env, pending=False)
