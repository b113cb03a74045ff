"""Where gpuenv doctor looks: conda environments (envs_dirs, environments.txt, conda's own cudnn and
CUDA packages), venvs in every home as root and only one's own as a user, the active environment,
the LD_LIBRARY_PATH a shell script sets, links inside the host tree, and the runner for another root."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from gpuenv.doctor import cuda, envs
from gpuenv.doctor.host import DoctorError, Host, root_runner
from gpuenv.module_utils import gpuenv_hostparse as hostparse
from tests.doctor_hosts import FakeHost, data, venv

CONDA_ENV = "/home/alice/conda-envs/ml"


def conda_env(fh: FakeHost, prefix: str) -> None:
    """A conda environment as conda lays it out: conda-meta records, torch in site-packages."""
    for name, version in (("python", "3.12.7"), ("cudnn", "9.1.0.70"), ("cuda-nvcc", "12.4.131")):
        record = {"name": name, "version": version, "build": "h_0", "channel": "conda-forge"}
        fh.write(f"{prefix}/conda-meta/{name}-{version}-h_0.json", json.dumps(record))
    fh.write(f"{prefix}/lib/python3.12/site-packages/torch/version.py", data("torch-version-2.5.1+cu124.txt"))
    fh.tool(f"{prefix}/bin/python")


def test_conda_env_from_envs_dirs_with_its_own_cudnn_and_cuda(tmp_path: Path) -> None:
    fh = FakeHost(tmp_path / "root")
    fh.write("/home/alice/.condarc", "envs_dirs:\n  - ~/conda-envs\n")
    conda_env(fh, CONDA_ENV)
    host = fh.host()
    found, notes = envs.find(host, host.homes(), 4, [])
    assert notes == []
    [env] = found
    assert (env.path, env.kind, env.torch, env.torch_cuda) == (CONDA_ENV, "conda", "2.5.1+cu124", "12.4")
    assert "envs_dirs of /home/alice/.condarc" in env.found_by
    assert (env.cudnn, env.cudnn_lib, env.cudnn_from) == ("9.1.0.70", f"{CONDA_ENV}/lib", "conda package cudnn")
    [toolkit] = cuda.toolkits(host, [], found)
    assert (toolkit.path, toolkit.version, toolkit.kind) == (CONDA_ENV, "12.4.131", "conda")


def test_environments_txt_names_a_prefix_outside_the_usual_places(tmp_path: Path) -> None:
    fh = FakeHost(tmp_path / "root")
    conda_env(fh, "/srv/envs/shared")
    fh.write("/home/alice/.conda/environments.txt", "/srv/envs/shared\n/srv/envs/deleted\n")
    host = fh.host()
    found, _ = envs.find(host, host.homes(), 4, [])
    assert [(e.path, e.found_by) for e in found] == [("/srv/envs/shared", ["/home/alice/.conda/environments.txt"])]


def test_root_looks_in_every_home_a_user_in_their_own(tmp_path: Path) -> None:
    fh = FakeHost(tmp_path / "root")
    venv(fh, "/home/alice/venvs/a", "2.5.1+cu124", None)
    venv(fh, "/home/bob/work/b/.venv", "2.0.1+cu117", None)
    venv(fh, "/root/v", "2.13.0+cu130", None)
    as_alice = fh.host()
    assert [e.path for e in envs.find(as_alice, as_alice.homes(), 4, [])[0]] == ["/home/alice/venvs/a"]
    as_root = fh.host(home="/root", uid=0)
    assert as_root.homes() == ["/root", "/home/alice", "/home/bob"]
    found = [e.path for e in envs.find(as_root, as_root.homes(), 4, [])[0]]
    assert sorted(found) == ["/home/alice/venvs/a", "/home/bob/work/b/.venv", "/root/v"]
    # The search stops at its depth: bob's venv is three levels down.
    assert "/home/bob/work/b/.venv" not in [e.path for e in envs.find(as_root, as_root.homes(), 2, [])[0]]


def test_the_active_environment_and_a_stale_variable(tmp_path: Path) -> None:
    fh = FakeHost(tmp_path / "root")
    venv(fh, "/opt/tools/venv", "2.5.1+cu124", None)
    host = fh.host(environ={"VIRTUAL_ENV": "/opt/tools/venv", "CONDA_PREFIX": "/opt/removed/env"})
    [env] = envs.find(host, host.homes(), 4, [])[0]
    assert (env.path, env.active, env.found_by) == ("/opt/tools/venv", True, ["VIRTUAL_ENV"])


def test_system_python_with_torch_from_pip_as_root(tmp_path: Path) -> None:
    fh = FakeHost(tmp_path / "root")
    fh.write("/usr/local/lib/python3.11/dist-packages/torch/version.py", data("torch-version-2.0.1+cu117.txt"))
    fh.tool("/usr/bin/python3.11")
    host = fh.host()
    [env] = envs.find(host, host.homes(), 4, [])[0]
    assert (env.kind, env.python, env.torch) == ("system", "/usr/bin/python3.11", "2.0.1+cu117")


@pytest.mark.parametrize(
    ("script", "dirs"),
    [
        # NVIDIA's post-installation line, on an empty LD_LIBRARY_PATH.
        (
            "export LD_LIBRARY_PATH=/usr/local/cuda-11.8/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}\n",
            ["/usr/local/cuda-11.8/lib64"],
        ),
        # A variable of the script's own, $HOME, appended to what came before.
        (
            'CUDA_HOME=/opt/cuda\nexport LD_LIBRARY_PATH="$CUDA_HOME/lib64:$HOME/lib"\n'
            "LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/usr/local/cudnn/lib  # cuDNN\n",
            ["/opt/cuda/lib64", "/home/alice/lib", "/usr/local/cudnn/lib"],
        ),
        # A variable the script does not set is unknown: that entry is left out, not guessed.
        ("export LD_LIBRARY_PATH=$CONDA_PREFIX/lib:/usr/lib/wsl/lib\n", ["/usr/lib/wsl/lib"]),
        ("# LD_LIBRARY_PATH=/commented/out\nPATH=/usr/local/cuda/bin:$PATH\n", []),
    ],
)
def test_ld_library_path_of_a_script(script: str, dirs: list[str]) -> None:
    assert hostparse.ld_library_path(script, "/home/alice") == dirs


def test_links_stay_inside_the_host_tree(tmp_path: Path) -> None:
    fh = FakeHost(tmp_path / "root")
    fh.write("/opt/gpuenv/cuda/t/version.json", "{}")
    fh.link("/usr/local/cuda", "/opt/gpuenv/cuda/t")  # absolute: the host's /opt, not this machine's
    fh.link("/usr/local/etc-link", "/etc")  # this machine has /etc; the tree does not
    host = fh.host()
    assert host.real("/usr/local/cuda/version.json") == "/opt/gpuenv/cuda/t/version.json"
    assert host.real("/usr/local/etc-link") is None
    fh.link("/loop", "/loop")
    assert host.real("/loop") is None


def test_a_root_that_is_no_directory(tmp_path: Path) -> None:
    with pytest.raises(DoctorError, match="is not a directory"):
        Host(root=tmp_path / "missing")


def test_root_runner_points_the_readers_at_the_tree(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    def base(
        argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str] | None:
        seen.append(list(argv))
        return subprocess.CompletedProcess(list(argv), 0, "", "")

    run = root_runner(tmp_path, base)
    assert run(["/usr/sbin/ldconfig", "-p"], 5, None) is not None
    assert run(["/usr/bin/dpkg-query", "-W", "nvidia-*"], 5, None) is not None
    assert run(["/usr/bin/rpm", "-qa"], 5, None) is not None
    # Commands that would describe this machine, and ldconfig in any form that writes, do not run.
    for argv in (["/usr/bin/nvidia-smi", "-L"], ["/usr/sbin/ldconfig"], ["/opt/env/bin/python", "x.pyz"]):
        assert run(argv, 5, None) is None
    assert seen == [
        ["ldconfig", "-C", f"{tmp_path}/etc/ld.so.cache", "-p"],
        ["dpkg-query", f"--admindir={tmp_path}/var/lib/dpkg", "-W", "nvidia-*"],
        ["rpm", "--root", str(tmp_path), "-qa"],
    ]
