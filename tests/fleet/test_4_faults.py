"""Faults injected on the shared fleet, after the other modules. The four
single-host faults run side by side, one host each, each with its own inventory and reports (a
fault test spends most of its time waiting on its host, and the suite's time is what CI allows):

- the driver role refuses to change the driver under GPU processes (sb3);
- a run SIGKILLed during the CUDA unpack, the cuDNN unpack (a background job, which goes on and
  which the next run's placement waits for) and the environment's install leaves the active
  toolkit, cuDNN and environment whole, and a rerun converges (sb1);
- a mirror out of reach is tried again and then named, nothing is half-installed, and a slow link
  and a link cut for seconds during a download still converge (sb2);
- a disk too small is refused before anything is written, naming both figures, and a disk that
  fills anyway leaves the active environment as it was and no partial build (sb4);

Then a host powered off mid-rollout stops the rollout, named unreachable, the batch after it
untouched; powered on, a second run finishes the job (sb3, then sb4).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from testbed.sandbox import faults, fleet
from tests.fleet.site import MIRROR, STACK_D, STACK_K, STACK_N, Site, link, put, recap, ssh, summary, wait_for

# The installer at work on a new environment: uv (the default) resolving or syncing, or pip's
# install. The bracket keeps the pattern from matching a shell that carries it.
INSTALLING = (
    "pgrep -f 'envs/.store/default-[^ ]*/bin/python -m [p]ip install|[u]v pip (compile|sync) .*envs/.store/default-'"
)
# The runs that fault the installer at work install: an environment an earlier test's play left in
# the fleet's cache would be unpacked instead (pytorch_env_build_cache).
INSTALL = ("-e", "pytorch_env_build_cache=false")
# And those that kill cuDNN's unpack, with the cache of unpacked cuDNNs off.
UNPACK = ("-e", "cudnn_build_cache=false")
HEADER = "grep -h -E '^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ' /usr/local/cuda/include/cudnn_version.h"


def active(host: str) -> dict[str, str]:
    """What the host serves: the default toolkit's tree and its cuDNN, the loader's libcudnn, and
    the environment, which must import torch."""
    torch = ssh(host, "/opt/gpuenv/envs/default/bin/python -c 'import torch; print(torch.__version__)'")
    assert torch.returncode == 0, torch.stderr[-2000:]
    loader = ssh(host, "ldconfig -p | grep -E 'libcudnn\\.so\\.[0-9]+ '").stdout
    return {
        "cuda": ssh(host, "readlink -f /usr/local/cuda").stdout.strip(),
        "cudnn": " ".join(ssh(host, HEADER).stdout.split()),
        "loader": " ".join(sorted(set(re.findall(r"=> (\S+)", loader)))),
        "env": link(host, "/opt/gpuenv/envs/default"),
        "torch": torch.stdout.strip(),
    }


# Every SSH session on the host that runs an Ansible module, with what the module started (tar,
# pip): with pipelining the module is `/bin/sh -c '/usr/bin/python3 && sleep 0'` reading its code
# from stdin, so no process is named after it (`pkill -f AnsiballZ` finds nothing, and a module
# left running then races the rerun).
KILL_MODULES = (
    "for s in $(ps -eo sid=,args= | awk '/[&][&] sleep 0/ {print $1}' | sort -u); do pkill -9 -s \"$s\"; done; "
    # [b]: the pattern must not match this command's own shell, whose line holds it too.
    "pkill -9 -f 'gpuenv-test-[b]lock'; true"
)


def kill_run(run: subprocess.Popen[str], host: str) -> None:
    """SIGKILL the controller's ansible-playbook with all it started, and the module on the host."""
    os.killpg(run.pid, signal.SIGKILL)
    run.wait(timeout=60)
    killed = ssh(host, KILL_MODULES)
    assert killed.returncode == 0, killed.stderr


def driver_role_refuses_under_gpu_processes(site: Site) -> None:
    # Debian's archive has one 535 driver, so a change is staged: dpkg-query reports an older driver
    # installed, and nvidia-smi a training job. The role must stop before apt, naming the job. The
    # fake rewrites the real answer, whatever format and packages the role asks about (the driver's
    # version is read from libcuda1 in userspace mode, not from a package named nvidia-*).
    smi = (
        "#!/bin/sh\n"
        'case "$*" in *--query-compute-apps*) echo "4242, python3 train.py, 1024 MiB"; exit 0;; esac\n'
        "exit 9\n"
    )
    dpkg = (
        "#!/bin/sh\n"
        'case "$*" in *Status-Abbrev*)\n'
        '  out=$(/usr/bin/dpkg-query "$@"); rc=$?\n'
        '  printf "%s\\n" "$out" | sed "s/535\\.[0-9.]*-[^ ]*/535.54.03-1/g"; exit $rc;;\n'
        "esac\n"
        'exec /usr/bin/dpkg-query "$@"\n'
    )
    put("sb3", "/usr/local/sbin/nvidia-smi", smi)
    put("sb3", "/usr/local/sbin/dpkg-query", dpkg)
    before = ssh("sb3", "dpkg-query -W -f '${Package} ${Version}\\n' 'nvidia*' 'libnvidia*' 'libcuda*'").stdout
    try:
        site.declare(STACK_D)
        run = site.play("driver.yml", "--limit", "sb3")
        assert run.returncode != 0
        assert "sb3 runs GPU processes" in run.stdout, run.stdout[-3000:]
        assert "4242, python3 train.py" in run.stdout
        assert "from 535.54.03-1 to" in run.stdout
        assert recap(run.stdout)["sb3"]["changed"] == 0
    finally:
        ssh("sb3", "rm -f /usr/local/sbin/nvidia-smi /usr/local/sbin/dpkg-query")
    after = ssh("sb3", "dpkg-query -W -f '${Package} ${Version}\\n' 'nvidia*' 'libnvidia*' 'libcuda*'").stdout
    assert after == before


def killed_mid_change_leaves_the_active_stack_whole(site: Site) -> None:
    before = active("sb1")
    site.declare(STACK_K)
    # 1. During the CUDA unpack: a tar that blocks when it writes into the toolkit's staging tree.
    tar = (
        "#!/bin/bash\n"
        'case "$*" in *--directory=/opt/gpuenv/cuda/.staging-*) exec -a gpuenv-test-block sleep 600;; esac\n'
        'exec /usr/bin/tar "$@"\n'
    )
    put("sb1", "/usr/local/sbin/tar", tar)
    try:
        run = site.start("site.yml", "--limit", "sb1")
        assert wait_for("sb1", "pgrep -f gpuenv-test-block", 600), (site.root / "background.log").read_text()[-3000:]
        kill_run(run, "sb1")
    finally:
        ssh("sb1", "rm -f /usr/local/sbin/tar")
    assert active("sb1") == before
    # 2. During the cuDNN unpack (the toolkit's tree is built by now, the default not yet moved). The
    # unpack is a background job, in a session of its own: it goes on without the run, and the next
    # run's placement waits for its lock.
    run = site.start("site.yml", "--limit", "sb1", *UNPACK)
    assert wait_for("sb1", "ls -d /var/cache/gpuenv/downloads/cudnn/*.partial", 600), (
        site.root / "background.log"
    ).read_text()[-3000:]
    kill_run(run, "sb1")
    assert active("sb1") == before
    # 3. During the environment's install.
    run = site.start("site.yml", "--limit", "sb1", *INSTALL)
    assert wait_for("sb1", INSTALLING, 900), (site.root / "background.log").read_text()[-3000:]
    kill_run(run, "sb1")
    # site.yml finishes the CUDA stage after the environment's (cuDNN's unpack runs beside it), so
    # /usr/local/cuda has not moved yet: the old toolkit, its cuDNN and the old environment serve,
    # each whole.
    assert active("sb1") == before
    # A rerun converges on the new stack, and verify passes on it.
    final = site.play("site.yml", "--limit", "sb1")
    assert final.returncode == 0, final.stdout[-4000:]
    now = active("sb1")
    assert now["cuda"].startswith("/opt/gpuenv/cuda/11.8.0-")
    assert now["cudnn"] == "#define CUDNN_MAJOR 8 #define CUDNN_MINOR 6 #define CUDNN_PATCHLEVEL 0"
    assert now["env"] != before["env"]
    assert ssh("sb1", "gpuenv-verify >/dev/null").returncode == 0
    assert ssh("sb1", "ls -d /opt/gpuenv/cuda/.staging-* /var/cache/gpuenv/downloads/cudnn/*.partial").stdout == ""


def mirror_out_of_reach_is_named_and_slow_or_cut_links_converge(site: Site) -> None:
    retries = json.dumps(
        {"cuda_toolkit_fetch": "host", "cudnn_fetch": "host", "cuda_toolkit_download_retries": 2,
         "cuda_toolkit_download_delay": 2, "cudnn_download_retries": 2, "cudnn_download_delay": 2}
    )  # fmt: skip
    site.declare(STACK_N)
    trees = "ls -A /opt/gpuenv/cuda /usr/local; ls -A /var/cache/gpuenv/downloads/cuda || true"
    before = ssh("sb2", trees).stdout
    faults.block("sb2", fleet.MIRROR_PORT)
    try:
        run = site.play("cuda.yml", "--limit", "sb2", "-e", retries)
    finally:
        faults.restore("sb2")
    assert run.returncode != 0
    assert "FAILED - RETRYING" in run.stdout  # tried again before giving up
    assert f"{MIRROR}/compute/cuda/redist/redistrib_11.8.0.json" in run.stdout, run.stdout[-3000:]
    assert "check cuda_toolkit_redist_url" in run.stdout
    assert ssh("sb2", trees).stdout == before  # nothing fetched, nothing half-built
    # A slow link: the same downloads, slower, and the run converges.
    faults.slow("sb2", "200mbit")
    try:
        slow = site.play("cuda.yml", "--limit", "sb2", "-e", retries)
    finally:
        faults.restore("sb2")
    assert slow.returncode == 0, slow.stdout[-4000:]
    assert link("sb2", "/usr/local/cuda") == "/usr/local/cuda-11.8"
    # The link cut for seconds while uv downloads the environment's packages (slowed, and uv's cache
    # emptied, so that the cut lands in torch's download): the run goes on and converges.
    assert ssh("sb2", "rm -rf /var/cache/gpuenv/uv").returncode == 0
    faults.slow("sb2", "16mbit")
    run = site.start("env.yml", "--limit", "sb2", *INSTALL)
    try:
        assert wait_for("sb2", INSTALLING, 900)
        subprocess.run(["sleep", "5"], check=True)  # noqa: S607
        faults.cut("sb2")
        # Shorter than uv's 30 s read timeout (its reads wait the cut out; pip's 15 s one ends in a
        # retry) and than SSH's minute of keep-alives.
        subprocess.run(["sleep", "20"], check=True)  # noqa: S607
    finally:
        faults.restore("sb2")
    assert run.wait(timeout=1800) == 0, (site.root / "background.log").read_text()[-4000:]
    assert ssh("sb2", "/opt/gpuenv/envs/default/bin/python -c 'import einops, six, torch'").returncode == 0


def disk_too_small_is_refused_and_one_that_fills_leaves_nothing_half_built(site: Site) -> None:
    site.declare(STACK_K)
    before = active("sb4")
    faults.disk("sb4", "/srv/small", 96)
    try:
        small = json.dumps({"pytorch_env_root": "/srv/small/envs", "cuda_toolkit_root": "/srv/small/cuda"})
        run = site.play("site.yml", "--limit", "sb4", "-e", small)
        assert run.returncode != 0
        # The toolkit's tree is the first build of the run: refused before anything was fetched.
        said = re.search(r"the CUDA 11\.8\.0 toolkit tree\(s\) needs about (\d+) MiB at /srv/small/cuda, "
                         r"and its filesystem has (\d+) MiB free", run.stdout)  # fmt: skip
        assert said, run.stdout[-3000:]
        assert int(said.group(1)) > int(said.group(2))
        assert "set cuda_toolkit_root (and cuda_toolkit_download_dir) to a bigger disk" in run.stdout
        assert ssh("sb4", "ls -A /srv/small").stdout.split() == ["lost+found"]
        # The environment alone, its estimate set below what it takes: the disk fills during pip.
        fill = json.dumps({"pytorch_env_root": "/srv/small/envs", "pytorch_env_space_mb": 10})
        run = site.play("env.yml", "--limit", "sb4", "-e", fill)
        assert run.returncode != 0
        assert "No space left on device" in run.stdout, run.stdout[-3000:]
        assert re.search(r"The unfinished build /srv/small/envs/\.store/default-[0-9a-f]+ was removed", run.stdout)
        assert ssh("sb4", "ls -A /srv/small/envs/.store /srv/small/envs/.tmp").stdout.split() == [
            "/srv/small/envs/.store:",
            "/srv/small/envs/.tmp:",
        ]
        assert active("sb4") == before  # the environment in use is the one in /opt/gpuenv/envs
    finally:
        faults.restore("sb4")


# One fault per host; each runs in a Site of its own (Site.declare writes the inventory's group_vars).
SIDE_BY_SIDE: dict[str, Callable[[Site], None]] = {
    "sb1": killed_mid_change_leaves_the_active_stack_whole,
    "sb2": mirror_out_of_reach_is_named_and_slow_or_cut_links_converge,
    "sb3": driver_role_refuses_under_gpu_processes,
    "sb4": disk_too_small_is_refused_and_one_that_fills_leaves_nothing_half_built,
}


def test_single_host_faults_side_by_side(site: Site) -> None:
    with ThreadPoolExecutor(len(SIDE_BY_SIDE)) as pool:
        running = {host: pool.submit(check, site.child(f"faults-{host}")) for host, check in SIDE_BY_SIDE.items()}
    failed = {
        f"{host}: {SIDE_BY_SIDE[host].__name__}": "".join(traceback.format_exception(error))
        for host, future in running.items()
        if (error := future.exception()) is not None
    }
    assert not failed, "\n\n".join(f"{name} failed:\n{why}" for name, why in failed.items())


def test_a_host_powered_off_mid_rollout_stops_it_and_a_second_run_finishes(site: Site) -> None:
    # Two hosts are enough to show it: sb3 is the canary batch, sb4 the batch after it.
    site.declare(STACK_D)
    untouched = (link("sb4", "/usr/local/cuda"), link("sb4", "/opt/gpuenv/envs/default"))
    run = site.start("upgrade.yml", "--limit", "sb3,sb4", *INSTALL)
    # sb3 builds the new environment in its batch: power it off then.
    assert wait_for("sb3", INSTALLING, 1200), (site.root / "background.log").read_text()[-3000:]
    faults.stop("sb3")
    try:
        assert run.wait(timeout=1800) != 0
        got = summary(site)
        assert got["hosts"]["sb3"]["state"] == "unreachable", got
        assert got["hosts"]["sb4"]["state"] == "waiting", got
        assert "sb4" in (got["stopped"] or "")
        assert (link("sb4", "/usr/local/cuda"), link("sb4", "/opt/gpuenv/envs/default")) == untouched
    finally:
        faults.start("sb3")
    again = site.play("upgrade.yml", "--limit", "sb3,sb4")
    assert again.returncode == 0, again.stdout[-4000:]
    states = {h: v["state"] for h, v in summary(site)["hosts"].items()}
    assert states["sb3"] == states["sb4"] == "upgraded", states
    for host in ("sb3", "sb4"):
        assert link(host, "/usr/local/cuda") == "/usr/local/cuda-12.4"
        assert ssh(host, "/opt/gpuenv/envs/default/bin/python -c 'import six'").returncode == 0
