"""Rolling upgrades on the shared fleet: B to every host a batch at a time, C with a host that fails
and is put back, and a host whose GPUs are busy refused."""

from __future__ import annotations

import subprocess

from testbed.sandbox import fleet
from tests.fleet.site import CACHE, STACK_B, STACK_C, Site, link, recap, ssh, summary


def test_a_rolling_upgrade_reaches_every_host_a_batch_at_a_time(site: Site) -> None:
    site.declare(STACK_B)
    run = site.play("upgrade.yml")
    assert run.returncode == 0, run.stdout[-4000:]
    assert "ROLLOUT SUMMARY" in run.stdout
    got = summary(site)
    assert got["stopped"] is None
    assert {h: (v["state"], v["batch"]) for h, v in got["hosts"].items()} == {
        "sb1": ("upgraded", 1),
        "sb2": ("upgraded", 2),
        "sb3": ("upgraded", 2),
        "sb4": ("upgraded", 3),
    }
    for host in ("sb1", "sb2", "sb3", "sb4"):
        assert link(host, "/usr/local/cuda") == "/usr/local/cuda-12.4"
        assert ssh(host, "gpuenv-verify >/dev/null").returncode == 0
    # The same stack again changes nothing (all four hosts in one batch: the batches were the
    # subject above, and three batches of a no-op cost three times one).
    again = site.play("upgrade.yml", "-e", '{"gpuenv_upgrade_serial": ["100%"]}')
    assert again.returncode == 0, again.stdout[-3000:]
    assert {v["state"] for v in summary(site)["hosts"].values()} == {"unchanged"}
    assert {h: c["changed"] for h, c in recap(again.stdout).items()} == dict.fromkeys(
        ("localhost", "sb1", "sb2", "sb3", "sb4"), 0
    )


def test_a_host_that_fails_is_put_back_and_stops_the_rollout(site: Site) -> None:
    env_before = {h: link(h, "/opt/gpuenv/envs/default") for h in ("sb3", "sb4")}
    # sb3's PyPI path is broken: its environment cannot be built once its toolkit default moved.
    site.declare(STACK_C, {"sb3": {"pytorch_env_pypi_url": f"{CACHE}/pypi/broken-path/simple"}})
    run = site.play("upgrade.yml")
    assert run.returncode != 0
    got = summary(site)
    states = {h: v["state"] for h, v in got["hosts"].items()}
    assert states == {"sb1": "upgraded", "sb2": "upgraded", "sb3": "rolled back", "sb4": "waiting"}, got
    assert "sb4" in (got["stopped"] or "")
    assert got["hosts"]["sb3"]["verify"] == "pass"
    assert "untouched: the rollout stopped before its batch" in (site.reports / "rollout/summary.md").read_text()
    # sb3 has its previous toolkit default and environment, and verify passes on them.
    assert link("sb3", "/usr/local/cuda") == "/usr/local/cuda-12.4"
    assert link("sb3", "/opt/gpuenv/envs/default") == env_before["sb3"]
    assert ssh("sb3", "gpuenv-verify >/dev/null").returncode == 0
    # The batch after it was not touched at all.
    assert link("sb4", "/usr/local/cuda") == "/usr/local/cuda-12.4"
    assert link("sb4", "/opt/gpuenv/envs/default") == env_before["sb4"]
    # The hosts that did upgrade run C.
    for host in ("sb1", "sb2"):
        assert link(host, "/usr/local/cuda") == "/usr/local/cuda-12.1"
        assert ssh(host, "/opt/gpuenv/envs/default/bin/python -c 'import einops'").returncode == 0


def test_a_host_whose_gpus_are_busy_is_refused_and_left_as_it_was(site: Site) -> None:
    # A stand-in nvidia-smi that reports a training job on the GPU (the real one finds no driver).
    shim = (
        "#!/bin/sh\n"
        'case "$*" in *--query-compute-apps*) echo "4242, python3 train.py, 1024 MiB"; exit 0;; esac\n'
        'exec /usr/bin/nvidia-smi.real "$@"\n'
    )
    h = fleet.State.load().hosts["sb4"]
    put = (
        "mv /usr/bin/nvidia-smi /usr/bin/nvidia-smi.real && cat > /usr/bin/nvidia-smi && chmod 755 /usr/bin/nvidia-smi"
    )
    placed = subprocess.run(fleet.ssh_argv(h, put), input=shim, capture_output=True, text=True, check=False)
    assert placed.returncode == 0, placed.stderr
    try:
        before = (link("sb4", "/usr/local/cuda"), link("sb4", "/opt/gpuenv/envs/default"))
        site.declare(STACK_C)
        for extra in (
            [],
            ["-e", '{"fleet_upgrade_busy": "wait", "fleet_upgrade_wait_timeout": 4, "fleet_upgrade_wait_interval": 2}'],
        ):
            run = site.play("upgrade.yml", "--limit", "sb4", *extra)
            assert run.returncode != 0
            sb4 = summary(site)["hosts"]["sb4"]
            assert sb4["state"] == "refused", run.stdout[-4000:]
            assert "4242, python3 train.py" in sb4["note"]
            assert (link("sb4", "/usr/local/cuda"), link("sb4", "/opt/gpuenv/envs/default")) == before
    finally:
        ssh("sb4", "mv /usr/bin/nvidia-smi.real /usr/bin/nvidia-smi")
