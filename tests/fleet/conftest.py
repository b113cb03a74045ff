"""The fleet the tests in this package share (pytest's package scope): one Debian 12 host is
provisioned with stack A by site.yml, three more start from its snapshot, and every module here
works on those 4 hosts, in file order (test_1_..., test_2_..., ...). Needs root; the whole package
takes about half an hour."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from testbed.sandbox import fleet, mirror
from tests.fleet.site import STACK_A, Site


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/fleet/" in str(item.path):
            item.add_marker(pytest.mark.sandbox)
            item.add_marker(
                pytest.mark.skipif(
                    os.geteuid() != 0, reason="the sandbox needs root (network namespaces, mounts, nspawn)"
                )
            )


@pytest.fixture(scope="package")
def site(tmp_path_factory: pytest.TempPathFactory, venv_env: dict[str, str]) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("fleet")
    env = {**venv_env, "ANSIBLE_NOCOLOR": "1"}
    fleet.down()
    # The hosts install CUDA and cuDNN from the local mirror: built here on a fresh machine (where no
    # demo or molecule scenario built it first), checked when it exists.
    mirror.build(mirror.default_site(), mirror.default_wheels())
    try:
        fleet.up(1, ["debian12"], root / "hosts-1.yml")
        s = Site(root, env)
        s.declare(STACK_A)
        first = s.play("site.yml")
        assert first.returncode == 0, first.stdout[-4000:]
        snap = fleet.snapshot("sb1", root / "snapshot")
        fleet.down()
        fleet.up(4, [], root / "hosts.yml", snapshot=snap)
        s.declare(STACK_A)
        yield s
    finally:
        fleet.down()
        # A provisioned host's layer is 7.5 GB, and pytest keeps its last three runs' directories.
        shutil.rmtree(root / "snapshot", ignore_errors=True)
