"""The roles' refusals of their settings (gpuenv/rolechecks.py): each wrong setting its own
sentence, naming the variable and what it must be; right settings refuse nothing."""

from __future__ import annotations

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
