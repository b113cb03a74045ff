"""A Debian root built now: a host booted from it at once offers what its sources name.

debootstrap fetches the index of `main` alone; the root's sources also name contrib, non-free and
non-free-firmware. Before the fix, a host booted from a new root offered no nvidia-cuda-toolkit for
the hour its index looked fresh to the roles' cache_valid_time. This builds a root of
its own (about two minutes), leaving the cached ones alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.sandbox import fleet

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root (network namespaces, mounts, nspawn)"),
]


@pytest.fixture(scope="module")
def new_root_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[fleet.Host, Path]]:
    tmp = tmp_path_factory.mktemp("roots")
    roots = tmp / "roots"
    fleet.down()
    before = os.environ.get("GPUENV_SANDBOX_ROOTS")
    os.environ["GPUENV_SANDBOX_ROOTS"] = str(roots)
    try:
        state = fleet.up(1, ["debian12"], tmp / "hosts.yml")
        yield state.hosts["sb1"], roots
    finally:
        fleet.down()
        if before is None:
            os.environ.pop("GPUENV_SANDBOX_ROOTS", None)
        else:
            os.environ["GPUENV_SANDBOX_ROOTS"] = before
        shutil.rmtree(roots, ignore_errors=True)  # a root is a few hundred MB


def test_a_host_from_a_new_root_offers_non_free_at_once(new_root_host: tuple[fleet.Host, Path]) -> None:
    host, roots = new_root_host
    assert Path(host.base).parent == roots  # built by this test, not taken from the cache
    # No `apt-get update` on the host: what it offers comes from the root as built.
    madison = subprocess.run(
        fleet.ssh_argv(host, "apt-cache madison nvidia-cuda-toolkit"),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert madison.returncode == 0, madison.stderr
    assert "bookworm/non-free" in madison.stdout, madison.stdout + madison.stderr
    # Every component the sources name has its index (contrib too, which nothing here installs).
    lists = subprocess.run(
        fleet.ssh_argv(host, "ls /var/lib/apt/lists"), capture_output=True, text=True, check=False, timeout=30
    )
    for component in ("main", "contrib", "non-free", "non-free-firmware"):
        assert f"_bookworm_{component}_binary-amd64_Packages" in lists.stdout, lists.stdout
