"""The sandbox fleet the fleet tests share: 4 Debian 12 hosts on stack A, and the helpers to
declare a stack, run a playbook and read a host (used by tests/fleet/conftest.py and the
test modules beside it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from testbed.sandbox import fleet
from tests.conftest import REPO, run_tool

MIRROR = f"http://{fleet.controller_ip()}:{fleet.MIRROR_PORT}"
CACHE = fleet.cache_url()
# torch's CPU build from the local mirror's copy of PyTorch's CPU index: what the fleet tests check
# is the orchestration (batches, rollbacks, switches, faults), and a CPU environment builds in
# seconds where a CUDA one takes minutes; CUDA builds of torch are the subject of molecule's
# verify and pytorch_env scenarios. The stack declares a CUDA build (the schema knows no other)
# and the site asks for the CPU one (gpu_stack_torch_cpu), which verify and drift then expect.
BASE_STACK = {
    "driver": "535",
    "cudnn": "9.1.0.70",
    "python": "3.11",
    "torch": "2.13.0",
    "torch_variant": "cu126",
}
STACK_A = {**BASE_STACK, "cuda": "12.1.1"}
STACK_B = {**BASE_STACK, "cuda": "12.4.1"}
STACK_C = {**BASE_STACK, "cuda": "12.1.1", "packages": ["einops==0.8.1"]}
# A stack sb1 has never had: a CUDA 11.8 tree to unpack, cuDNN 8.6 for it (redistrib_8.6.0.json,
# a 700 MB tarball whose unpack takes seconds), and a new environment (one more package).
STACK_K = {**BASE_STACK, "cuda": "11.8.0", "cudnn": "8.6.0", "packages": ["einops==0.8.1", "six==1.16.0"]}
STACK_D = {**BASE_STACK, "cuda": "12.4.1", "packages": ["einops==0.8.1", "six==1.16.0"]}
# K without cuDNN, for the link faults on sb2: the CUDA 11.8 archives and the environment are the
# downloads a fault must meet; cuDNN's 700 MB tarball would add a minute and test no other path.
STACK_N = {**STACK_K, "cudnn": "none"}
SITE_VARS = {
    "cuda_toolkit_redist_url": f"{MIRROR}/compute/cuda/redist",
    "cudnn_redist_url": f"{MIRROR}/compute/cudnn/redist",
    "cuda_toolkit_components": ["cuda_cudart", "cuda_nvcc", "cuda_nvrtc"],
    "pytorch_env_pypi_url": f"{CACHE}/pypi/simple",
    "pytorch_env_torch_index": f"{MIRROR}/whl/{{variant}}",
    # The mirror's CPU index holds torch alone.
    "pytorch_env_companions": [],
    "gpu_stack_torch_cpu": True,
    "nvidia_driver_mode": "userspace",
}


class Site:
    """An inventory directory of the sandbox's hosts with a declared stack, and the reports."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.inventory = root / "inventory"
        self.reports = root / "reports"
        self.env = env
        (self.inventory / "group_vars").mkdir(parents=True, exist_ok=True)
        (self.inventory / "host_vars").mkdir(exist_ok=True)

    def child(self, name: str) -> Site:
        """A Site of its own under this one (inventory, reports, background log) for a test that
        runs beside others on the same hosts."""
        return Site(self.root / name, self.env)

    def declare(self, stack: dict[str, Any], host_vars: dict[str, dict[str, Any]] | None = None) -> None:
        shutil.copy(fleet.State.load().inventory or "", self.inventory / "hosts.yml")
        (self.inventory / "group_vars/gpu_hosts.yml").write_text(yaml.safe_dump({"gpu_stack": stack, **SITE_VARS}))
        for old in (self.inventory / "host_vars").glob("*.yml"):
            old.unlink()
        for host, values in (host_vars or {}).items():
            (self.inventory / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(values))

    def _argv(self, playbook: str, *args: str) -> list[str]:
        extra = {
            "gpu_verify_reports_dir": str(self.reports / "verify"),
            "gpuenv_upgrade_reports_dir": str(self.reports / "rollout"),
            "gpuenv_drift_reports_dir": str(self.reports / "drift"),
            "onboard_user_reports_dir": str(self.reports / "onboard"),
        }
        return ["-i", str(self.inventory), f"playbooks/{playbook}", "-e", json.dumps(extra), *args]

    def play(self, playbook: str, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
        return run_tool("ansible-playbook", *self._argv(playbook, *args), env=self.env, timeout=timeout)

    def start(self, playbook: str, *args: str) -> subprocess.Popen[str]:
        """The playbook running in the background, in a process group of its own (so that a test can
        kill it with everything it started), its output in <root>/background.log."""
        log = (self.root / "background.log").open("w")
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "ansible-playbook"), *self._argv(playbook, *args)],
            cwd=REPO,
            env=self.env,
            stdin=subprocess.DEVNULL,  # not the test's: ssh would make it non-blocking (conftest.run_tool)
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


def ssh(host: str, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    h = fleet.State.load().hosts[host]
    # A stdin of its own: ssh makes the stdin it inherits non-blocking for every process that shares it,
    # Ansible started beside it included (conftest.run_tool).
    return subprocess.run(
        fleet.ssh_argv(h, command),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def link(host: str, path: str) -> str:
    return ssh(host, f"readlink {path}").stdout.strip()


def recap(stdout: str) -> dict[str, dict[str, int]]:
    """The last PLAY RECAP of a run: host -> {ok, changed, failed, ...}."""
    out = {}
    for line in stdout.rsplit("PLAY RECAP", 1)[1].splitlines():
        if " : " in line:
            host, counts = line.split(" : ", 1)
            out[host.strip()] = {k: int(v) for k, v in (kv.split("=") for kv in counts.split())}
    return out


def summary(site: Site) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((site.reports / "rollout/summary.json").read_text())
    return loaded


GIT = ["git", "-c", "user.name=gpuenv test", "-c", "user.email=site@gpuenv.invalid"]


def make_signer(site: Site, name: str) -> tuple[Path, str]:
    """An SSH signing key made for the test, and its allowed_signers line."""
    key = site.root / f"signer-{name}"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True)  # noqa: S607
    kind, blob = key.with_suffix(".pub").read_text().split()[:2]
    return key, f"site@gpuenv.invalid {kind} {blob}"


def put(host: str, path: str, body: str, mode: str = "755") -> None:
    """Write a file on the host."""
    h = fleet.State.load().hosts[host]
    argv = fleet.ssh_argv(h, f"cat > {path} && chmod {mode} {path}")
    placed = subprocess.run(argv, input=body, capture_output=True, text=True, check=False)
    assert placed.returncode == 0, placed.stderr


def wait_for(host: str, command: str, timeout: float) -> bool:
    """Whether `command` succeeded on the host within timeout seconds (asked every half second)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ssh(host, command, timeout=30).returncode == 0:
            return True
        time.sleep(0.5)
    return False
