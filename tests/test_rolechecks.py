"""The roles' refusals of their settings (gpuenv/rolechecks.py): each wrong setting its own
sentence, naming the variable and what it must be; right settings refuse nothing."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from gpuenv import rolechecks

GOOD = {
    "version": "9.1.0.70",
    "cuda_major": "12",
    "source": "tarball",
    "cuda_trees": ["/usr/local/cuda-12.4"],
    "tarball_url": "",
    "tarball_path": "",
    "tarball_checksum": "",
    "fetch": "controller",
}
SUM = "sha256:" + "a" * 64


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"tarball_url": "https://mirror.example/cudnn.tar.xz", "tarball_checksum": SUM},
        {"tarball_path": "/srv/cudnn.tgz", "tarball_checksum": SUM},
        {"tarball_url": "file:///srv/cudnn.tgz", "tarball_checksum": SUM},
        {"source": "nvidia_repo", "cuda_trees": []},
        {"tarball_url": "https://mirror.example/cudnn.tar.xz", "tarball_checksum": SUM, "fetch": "host"},
    ],
)
def test_right_settings_refuse_nothing(over: dict[str, Any]) -> None:
    assert rolechecks.cudnn_problems({**GOOD, **over}, "sb1") == []


@pytest.mark.parametrize(
    ("over", "sentence"),
    [
        ({"version": "8.6.0"}, 'cudnn_version "8.6.0" must be a full cuDNN build such as "8.6.0.163"'),
        ({"cuda_major": "12.4"}, 'cudnn_cuda_major "12.4" must be the CUDA major'),
        ({"cuda_trees": []}, "cudnn_cuda_trees is empty: a stack without a CUDA toolkit has no tree"),
        ({"tarball_url": "https://x/c.tgz", "tarball_path": "/c.tgz", "tarball_checksum": SUM},
         "cudnn_tarball_url and cudnn_tarball_path are both set"),
        ({"tarball_url": "https://x/c.tgz"}, "needs cudnn_tarball_checksum"),
        ({"tarball_checksum": SUM}, "cudnn_tarball_checksum is set without cudnn_tarball_url"),
        ({"tarball_url": "https://x/c.tgz", "tarball_checksum": "md5:abc"},
         'cudnn_tarball_checksum "md5:abc" must be "sha256:" and 64 lower-case hex digits'),
        ({"tarball_path": "c.tgz", "tarball_checksum": SUM}, 'cudnn_tarball_path "c.tgz" must be an absolute path'),
        ({"tarball_path": "/c.tgz", "tarball_checksum": SUM, "fetch": "host"}, "needs cudnn_fetch: controller"),
        ({"tarball_url": "file:///c.tgz", "tarball_checksum": SUM, "fetch": "host"}, "needs cudnn_fetch: controller"),
    ],
)  # fmt: skip
def test_each_wrong_setting_is_its_own_sentence(over: dict[str, Any], sentence: str) -> None:
    (problem,) = rolechecks.cudnn_problems({**GOOD, **over}, "sb1")
    assert problem.startswith("cudnn on sb1: ")
    assert sentence in problem
    assert problem.endswith("; nothing was changed.")


def test_several_wrong_settings_are_all_named_and_long_values_cut() -> None:
    problems = rolechecks.cudnn_problems({**GOOD, "version": "x" * 200, "cuda_major": "twelve"}, "h")
    assert len(problems) == 2
    assert '"' + "x" * 27 + '..."' in problems[0]
    assert "twelve" in problems[1]


DRIVER = {
    "mode": "full",
    "version": "550",
    "debian_variant": "",
    "reboot_policy": "if_needed",
    "secure_boot": "stop",
    "repo_url": "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/",
    "mok_key": "/var/lib/dkms/mok.key",
    "mok_cert": "/var/lib/dkms/mok.pub",
    "download_dir": "/var/cache/gpuenv/downloads",
    "resolved": True,
    "secure_boot_on": False,
    "controller": None,
}


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"version": "550.163.01"},
        {"version": "535.309", "debian_variant": "tesla-535"},
        {"mode": "none", "version": ""},
        {"secure_boot_on": True, "secure_boot": "sign"},
        {"secure_boot_on": True, "mode": "userspace"},
        {"repo_url": "file:///srv/mirror/cuda/"},
    ],
)
def test_right_driver_settings_refuse_nothing(over: dict[str, Any]) -> None:
    assert rolechecks.driver_problems({**DRIVER, **over}, "sb1") == []


@pytest.mark.parametrize(
    ("over", "sentence"),
    [
        ({"version": "55"}, 'version "55" must be a branch ("550") or an exact version'),
        ({"version": "550\n"}, "must be a branch"),
        ({"debian_variant": "tesla"}, 'nvidia_driver_debian_variant "tesla" must be empty or tesla-<branch>'),
        ({"controller": "sb1 is the controller (its machine id is the controller's)"},
         "nvidia_driver_reboot_policy if_needed is refused because sb1 is the controller"),
        ({"secure_boot_on": True}, "Secure Boot is on on sb1: the kernel would refuse an unsigned NVIDIA module"),
        ({"repo_url": "https://mirror.example/cuda/\nTrusted: yes"}, "nvidia_driver_repo_url"),
        ({"mok_key": 'mok.key"; touch /tmp/x; "'}, "nvidia_driver_mok_key"),
        ({"download_dir": "/var/../etc"}, "nvidia_driver_download_dir"),
    ],
)  # fmt: skip
def test_each_wrong_driver_setting_is_its_own_sentence(over: dict[str, Any], sentence: str) -> None:
    (problem,) = rolechecks.driver_problems({**DRIVER, **over}, "sb1")
    assert sentence in problem
    assert "No resolved stack" not in problem


def test_a_driver_version_missing_for_want_of_the_preflight_says_to_run_it() -> None:
    (problem,) = rolechecks.driver_problems({**DRIVER, "version": "", "resolved": False}, "sb1")
    assert 'version ""' in problem
    assert "No resolved stack: the preflight role (gpu_stack) did not run" in problem
    assert problem.endswith("or set nvidia_driver_version.")


def test_every_driver_refusal_at_once() -> None:
    wrong = {"version": "x", "controller": "it is the controller", "secure_boot_on": True, "mok_cert": "rel"}
    assert len(rolechecks.driver_problems({**DRIVER, **wrong}, "h")) == 4


MANIFEST_TEXT = '{"cudnn": {}}'
MANIFEST = {"status": 200, "url": "https://mirror.example/cudnn/redist/redistrib_9.1.0.json", "content": MANIFEST_TEXT}
ARCHIVE = {"version": "9.1.0.70", "file": "cudnn/linux-x86_64/cudnn-linux-x86_64-9.1.0.70_cuda12-archive.tar.xz"}
PLAN = {"error": None, "archives": [ARCHIVE]}
CUDNN = {
    "version": "9.1.0.70",
    "release": "9.1.0",
    "redist_url": "https://mirror.example/cudnn/redist",
    "manifest_checksum": "",
    "tarball_url": "",
    "tarball_path": "",
}


def test_a_manifest_that_has_the_declared_cudnn_is_not_refused() -> None:
    pinned = "sha256:" + hashlib.sha256(MANIFEST_TEXT.encode()).hexdigest()
    assert rolechecks.cudnn_manifest_problem(MANIFEST, PLAN, CUDNN) is None
    assert rolechecks.cudnn_manifest_problem(MANIFEST, PLAN, {**CUDNN, "manifest_checksum": pinned}) is None
    # A tarball given by path has no manifest to read.
    given = {**CUDNN, "tarball_path": "/srv/cudnn.tar.xz"}
    plan = {"error": None, "archives": [{**ARCHIVE, "file": "c.tar.xz"}]}
    assert rolechecks.cudnn_manifest_problem({}, plan, given) is None


@pytest.mark.parametrize(
    ("manifest", "plan", "over", "sentence"),
    [
        ({"status": 404, "msg": "HTTP Error 404"}, PLAN, {},
         "Neither https://mirror.example/cudnn/redist/redistrib_9.1.0.json nor redistrib_9.1.0.70.json can be read"
         " (HTTP Error 404)"),
        ({}, PLAN, {}, "(no answer)"),
        (MANIFEST, PLAN, {"manifest_checksum": "sha256:" + "0" * 64},
         "redistrib_9.1.0.json has sha256 "),
        (MANIFEST, {"error": "the manifest has no cudnn for cuda11", "archives": []}, {},
         "the manifest has no cudnn for cuda11; nothing was installed"),
        (MANIFEST, {"error": None, "archives": [{**ARCHIVE, "version": "9.1.1.17"}]}, {},
         "the manifest has cuDNN 9.1.1.17, not 9.1.0.70"),
        (MANIFEST, {"error": None, "archives": [{**ARCHIVE, "file": "../../etc/passwd"}]}, {},
         "the tarball name ../../etc/passwd is not a plain file name"),
    ],
)  # fmt: skip
def test_each_manifest_refusal_says_what_is_wrong(
    manifest: dict[str, Any], plan: dict[str, Any], over: dict[str, Any], sentence: str
) -> None:
    problem = rolechecks.cudnn_manifest_problem(manifest, plan, {**CUDNN, **over})
    assert problem is not None
    assert sentence in problem
    assert "othing was installed." in problem


def test_a_tarball_given_by_url_is_not_refused_for_want_of_a_manifest() -> None:
    given = {**CUDNN, "tarball_url": "https://x/cudnn.tar.xz", "manifest_checksum": "sha256:" + "0" * 64}
    assert rolechecks.cudnn_manifest_problem({"status": 404}, PLAN, given) is None


TOOLKIT = {"source": "redist", "versions": ["12.4.1"], "default": "12.4.1", "stack_cuda": "12.4.1"}


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"versions": ["12.4.1", "11.8.0"], "default": "11.8.0"},
        {"source": "none", "versions": [], "default": "", "stack_cuda": "none"},
        {"source": "nvidia_repo"},
    ],
)
def test_right_toolkit_settings_refuse_nothing(over: dict[str, Any]) -> None:
    assert rolechecks.cuda_toolkit_problems({**TOOLKIT, **over}, "sb1") == []


@pytest.mark.parametrize(
    ("over", "sentence"),
    [
        ({"stack_cuda": "none"}, "declares cuda: none (no system toolkit), but cuda_toolkit_source is redist"),
        ({"versions": ["12.4"], "default": "12.4"}, "versions ['12.4'] must each be X.Y.Z"),
        ({"versions": ["12.4.1", "12.4.0"]}, "one per X.Y (they share /usr/local/cuda-X.Y)"),
        ({"default": "11.8.0"}, 'the default "11.8.0" must be one of them'),
        ({"versions": []}, "versions [] must each be X.Y.Z"),
    ],
)  # fmt: skip
def test_each_wrong_toolkit_setting_is_refused_with_what_it_must_be(over: dict[str, Any], sentence: str) -> None:
    (problem,) = rolechecks.cuda_toolkit_problems({**TOOLKIT, **over}, "sb1")
    assert problem.startswith("cuda_toolkit on sb1: ")
    assert sentence in problem
    assert problem.endswith("Nothing was changed.")
