"""A cuDNN version parsed once (gpuenv/module_utils/gpuenv_cudnn_version.py, gpuenv.versions'
CudnnVersion): its major and release, as every reader compares them."""

from __future__ import annotations

import pytest

from gpuenv import versions
from gpuenv.module_utils.gpuenv_cudnn_version import CudnnVersion


@pytest.mark.parametrize(
    ("text", "major", "release", "full"),
    [
        ("9.1.0.70", "9", "9.1.0", "9.1.0.70"),
        ("8.9.7.29", "8", "8.9.7", "8.9.7.29"),
        ("8.6.0", "8", "8.6.0", "8.6.0"),
        ("9", "9", "9", "9"),
        (" 9.10.2.21\n", "9", "9.10.2", "9.10.2.21"),
    ],
)
def test_the_parts_of_a_build_a_release_and_a_major(text: str, major: str, release: str, full: str) -> None:
    version = CudnnVersion(text)
    assert (version.major, version.release, str(version)) == (major, release, full)


@pytest.mark.parametrize("text", ["", "9.1.0.70.1", "9.x", "v9.1.0", "9..1", "٩.1.0", "none", "9.1.0-1"])
def test_what_is_not_a_cudnn_version_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a cuDNN version"):
        CudnnVersion(text)


def test_the_controller_and_the_modules_share_one_type() -> None:
    assert versions.CudnnVersion is CudnnVersion
    assert CudnnVersion("9.1.0.70") == CudnnVersion("9.1.0.70")
    assert len({CudnnVersion("9.1.0.70"), CudnnVersion("9.1.0.70"), CudnnVersion("9.1.0")}) == 2
