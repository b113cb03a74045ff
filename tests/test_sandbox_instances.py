"""Sandbox instances side by side (GPUENV_SANDBOX_INSTANCE): their names never overlap, one's cleanup
does not see the other's processes, and the caches they share are built once, whoever asks first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.sandbox import channel, cleanup, roots
from testbed.sandbox.hosts import INSTANCE

NAMES = (
    "from testbed.sandbox import hosts, network; import json; print(json.dumps({"
    "'netns': hosts.NETNS_PREFIX, 'veth': hosts.VETH_PREFIX, 'peer': hosts.PEER_PREFIX,"
    "'bridge': network.BRIDGE, 'comment': network.RULE_COMMENT, 'subnet': str(network.SUBNET),"
    "'dir': str(hosts.sandbox_dir())}))"
)


def _names(instance: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUENV_SANDBOX_")}
    if instance:
        env["GPUENV_SANDBOX_INSTANCE"] = instance
    out = subprocess.run([sys.executable, "-c", NAMES], env=env, capture_output=True, text=True, check=True)
    names: dict[str, str] = json.loads(out.stdout)
    return names


def test_two_instances_share_no_name_prefix_subnet_or_directory() -> None:
    first, other = _names(""), _names("1")
    assert first["bridge"] == "gpuenv-br0"  # the machine's sandbox keeps the names it always had
    assert first["subnet"] == "10.199.0.0/24"
    assert other["subnet"] == "10.199.1.0/24"
    for a, b in ((first, other), (other, first)):
        for key in ("netns", "veth", "peer"):
            # cleanup removes whatever starts with these: neither may start the other's names
            assert not (b[key] + "sb1").startswith(a[key]), key
            assert not b["bridge"].startswith(a["veth"])
        assert a["comment"] not in b["comment"].split()
        assert not (b["dir"] + "/").startswith(a["dir"] + "/")


def test_an_instance_that_is_not_a_digit_is_refused_with_what_to_set() -> None:
    env = {**os.environ, "GPUENV_SANDBOX_INSTANCE": "molecule"}
    out = subprocess.run(
        [sys.executable, "-c", "import testbed.sandbox.hosts"], env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode != 0
    assert "GPUENV_SANDBOX_INSTANCE='molecule': leave it unset, or give a digit from 1 to 9" in out.stderr
    # scripts/sandbox says the same in one line, not with a traceback.
    env["GPUENV_SANDBOX_INSTANCE"] = "0"
    cli = subprocess.run(
        [sys.executable, "-m", "testbed.sandbox", "status"], env=env, capture_output=True, text=True, check=False
    )
    assert cli.returncode != 0
    assert cli.stderr == "sandbox: error: GPUENV_SANDBOX_INSTANCE='0': leave it unset, or give a digit from 1 to 9\n"


@pytest.fixture
def lookalikes() -> Iterator[dict[str, int]]:
    """A process that looks like this instance's download cache, and one that looks like another
    instance's (the same command line, another GPUENV_SANDBOX_INSTANCE)."""
    other = "2" if INSTANCE != "2" else "3"
    procs = {}
    for name, instance in (("ours", INSTANCE), ("theirs", other)):
        env = {k: v for k, v in os.environ.items() if k != "GPUENV_SANDBOX_INSTANCE"}
        if instance:
            env["GPUENV_SANDBOX_INSTANCE"] = instance
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)", "testbed.sandbox.cache"], env=env
        )
    try:
        yield {name: p.pid for name, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_cleanup_finds_its_own_instances_servers_only(lookalikes: dict[str, int]) -> None:
    found = {pid for pid, _ in cleanup._processes()}
    assert lookalikes["ours"] in found
    assert lookalikes["theirs"] not in found


def _hold(lock: Path, then: str) -> subprocess.Popen[bytes]:
    """flock(1) holds the lock for a second, then runs `then` and lets it go."""
    holder = subprocess.Popen(["flock", str(lock), "sh", "-c", f"sleep 1; {then}"])  # noqa: S607
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if subprocess.run(["flock", "-n", str(lock), "true"], check=False).returncode != 0:  # noqa: S607
            return holder
        time.sleep(0.05)
    raise AssertionError("flock never took the lock")


def test_a_second_channel_build_waits_for_the_first_instead_of_failing(tmp_path: Path) -> None:
    holder = _hold(tmp_path / "lock", f"touch {tmp_path / 'first-done'}")
    with channel._locked(tmp_path):
        assert (tmp_path / "first-done").exists()
    assert holder.wait() == 0


def test_a_root_another_process_is_building_is_waited_for_and_not_built_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rel = roots.release("debian12")
    root = tmp_path / roots._key(rel, roots.PACKAGES)

    def build_again(*_: object) -> Path:
        raise AssertionError("the root was built a second time")

    monkeypatch.setattr(roots, "_build_root", build_again)
    holder = _hold(tmp_path / f"{root.name}.lock", f"mkdir -p {root} && touch {root}/.gpuenv-complete")
    assert roots.ensure_root(tmp_path, rel) == root
    assert holder.wait() == 0


def test_the_roots_command_builds_nothing_that_is_cached_and_prints_its_path(tmp_path: Path) -> None:
    # scripts/test runs `scripts/sandbox roots` before its lanes; a cached root is only named.
    rel = roots.release("debian13")
    root = tmp_path / roots._key(rel, roots.PACKAGES)
    root.mkdir()
    (root / ".gpuenv-complete").write_text("")
    env = {**os.environ, "GPUENV_SANDBOX_ROOTS": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "testbed.sandbox", "roots", "--os", "debian13"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(root)]


def test_a_kernel_host_that_is_not_among_the_hosts_is_refused_before_anything_boots(tmp_path: Path) -> None:
    # molecule's create passes --kernel-host for each platform with `kernel: true`; a name outside
    # sb1..sbN is a scenario's mistake, said before any host or root is made.
    env = {**os.environ, "GPUENV_SANDBOX_DIR": str(tmp_path / "sandbox"), "GPUENV_SANDBOX_ROOTS": str(tmp_path)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "testbed.sandbox",
            "up",
            "2",
            "--kernel-host",
            "sb3",
            "--inventory",
            str(tmp_path / "i"),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode != 0
    assert "--kernel-host names sb3, which is not among sb1..sb2" in out.stderr
    assert not (tmp_path / "sandbox").exists()
    assert list(tmp_path.iterdir()) == []
