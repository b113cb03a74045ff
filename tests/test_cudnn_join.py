"""The cudnn role's join (tasks/join.yml): a placement started in the background fails the host
where it is joined, with the module's own message, and nothing after it runs (no loader check, no
record). site.yml starts the placement in cuda_build.yml and joins it in cuda_finish.yml."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_local_play

REPO = Path(__file__).resolve().parents[1]


def _play(tmp_path: Path, link: Path, base: Path) -> list[dict[str, object]]:
    return [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    # What tarball.yml's background task runs: the module under Ansible's async wrapper.
                    "name": "Start a placement that will fail, in the background",
                    "gpuenv_cuda_tree": {
                        "link": "{{ item }}",
                        "base": str(base),
                        "cudnn_sha256": "0" * 64,
                        "cudnn_version": "9.1.0.70",
                        "unpack_dir": str(tmp_path / "unpack"),
                    },
                    "loop": [str(link)],
                    "register": "cudnn_register_jobs",
                    "async": 60,
                    "poll": 0,
                },
                {
                    "name": "Join it",
                    "ansible.builtin.include_role": {"name": "cudnn", "tasks_from": "join.yml"},
                    "vars": {"cudnn_background_timeout": 60},
                },
                {
                    "name": "Mark that the join let the play go on",
                    "ansible.builtin.copy": {"content": "went on\n", "dest": str(tmp_path / "after"), "mode": "0644"},
                },
            ],
        }
    ]


@pytest.mark.ansible
def test_a_background_placement_that_failed_fails_the_host_at_the_join_with_its_message(
    tmp_path: Path, venv_env: dict[str, str]
) -> None:
    link, base = tmp_path / "cuda-12.4", tmp_path / "no-toolkit-tree"
    (tmp_path / "unpack").mkdir()
    out = run_local_play(tmp_path, _play(tmp_path, link, base), venv_env)
    assert out.returncode != 0, out.stdout[-3000:]
    assert "cudnn : Wait for each tree's cuDNN, placed in the background" in out.stdout
    assert f"the toolkit tree {base} does not exist: run the cuda_toolkit role" in out.stdout, out.stdout[-3000:]
    # The host stopped there: no loader check, no record, nothing after the join.
    assert "Ask the loader which libcudnn" not in out.stdout
    assert "Record what the cuDNN role installed" not in out.stdout
    assert not (tmp_path / "after").exists()
    assert not link.exists()
