"""The sandbox's CUDA apt repository (gpuenv/sandbox/aptrepo.py), built from a small stand-in of the
mirror's redist archives: NVIDIA's package names and versions, its file layout, the alternatives the
maintainer scripts register, a Packages index whose sums are the files', and a Release signed with
the key that cuda-keyring carries, checked with gpgv as apt checks it."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from gpuenv import hostparse
from gpuenv.sandbox import aptrepo
from gpuenv.sandbox.util import SandboxError

pytestmark = pytest.mark.skipif(
    not (shutil.which("dpkg-deb") and shutil.which("gpg") and shutil.which("gpgv")),
    reason="builds .deb files and signs an index: needs dpkg-deb, gpg and gpgv (scripts/setup installs them)",
)


def _archive(path: Path, top: str, files: dict[str, bytes | str]) -> dict[str, str]:
    """A redist archive (top/<files>; a str value is a link target) and its manifest entry."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:xz") as tar:
        for rel, content in files.items():
            info = tarfile.TarInfo(f"{top}/{rel}")
            if isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size, info.mode = len(content), 0o755 if rel.startswith("bin/") else 0o644
                tar.addfile(info, io.BytesIO(content))
    return {
        "relative_path": str(path.relative_to(path.parents[2])),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def _site(root: Path) -> Path:
    cuda = root / "compute/cuda/redist"
    cudart = _archive(
        cuda / "cuda_cudart/linux-x86_64/cuda_cudart-linux-x86_64-12.4.127-archive.tar.xz",
        "cuda_cudart-linux-x86_64-12.4.127-archive",
        {
            "lib/libcudart.so.12.4.127": b"\x7fELF cudart",
            "lib/libcudart.so.12": "libcudart.so.12.4.127",
            "lib/libcudart.so": "libcudart.so.12",
            "lib/libcudart_static.a": b"!<arch>",
            "include/cuda_runtime.h": b"/* cuda_runtime.h */\n",
        },
    )
    nvcc = _archive(
        cuda / "cuda_nvcc/linux-x86_64/cuda_nvcc-linux-x86_64-12.4.131-archive.tar.xz",
        "cuda_nvcc-linux-x86_64-12.4.131-archive",
        {
            "bin/ptxas": b"#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n",
            "nvvm/lib64/libnvvm.so": b"x",
        },
    )
    manifest = {
        "release_label": "12.4.1",
        "cuda_cudart": {"version": "12.4.127", "linux-x86_64": cudart},
        "cuda_nvcc": {"version": "12.4.131", "linux-x86_64": nvcc},
    }
    (cuda / "redistrib_12.4.1.json").write_text(json.dumps(manifest))
    cudnn = root / "compute/cudnn/redist"
    headers = {
        "include/cudnn.h": b"/* 9 */\n",
        "include/cudnn_v9.h": b"/* 9 */\n",
        "include/cudnn_version.h": b"#define CUDNN_MAJOR 9\n",
        "include/cudnn_version_v9.h": b"#define CUDNN_MAJOR 9\n",
    }
    nine = _archive(
        cudnn / "cudnn/linux-x86_64/cudnn-linux-x86_64-9.1.0.70_cuda12-archive.tar.xz",
        "cudnn-linux-x86_64-9.1.0.70_cuda12-archive",
        {
            **headers,
            "lib/libcudnn.so.9.1.0": b"\x7fELF cudnn",
            "lib/libcudnn.so.9": "libcudnn.so.9.1.0",
            "lib/libcudnn.so": "libcudnn.so.9",
        },
    )
    (cudnn / "redistrib_9.1.0.json").write_text(
        json.dumps({"release_label": "9.1.0", "cudnn": {"version": "9.1.0.70", "linux-x86_64": {"cuda12": nine}}})
    )
    eight = _archive(
        cudnn / "cudnn/linux-x86_64/cudnn-linux-x86_64-8.6.0.163_cuda11-archive.tar.xz",
        "cudnn-linux-x86_64-8.6.0.163_cuda11-archive",
        {"include/cudnn.h": b"/* 8 */\n", "include/cudnn_version.h": b"#define CUDNN_MAJOR 8\n",
         "lib/libcudnn_cnn_infer.so.8.6.0": b"\x7fELF", "lib/libcudnn_cnn_infer.so.8": "libcudnn_cnn_infer.so.8.6.0"},
    )  # fmt: skip
    (cudnn / "redistrib_8.6.0.json").write_text(
        json.dumps({"release_label": "8.6.0", "cudnn": {"version": "8.6.0.163", "linux-x86_64": {"cuda11": eight}}})
    )
    return root


def _contents(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout  # noqa: S607


def _script(deb: Path, name: str) -> str:
    return subprocess.run(["dpkg-deb", "-I", str(deb), name], capture_output=True, text=True, check=True).stdout  # noqa: S607


def test_the_repository_has_nvidia_s_packages_and_a_release_apt_can_check(tmp_path: Path) -> None:
    site = _site(tmp_path / "site")
    repos = aptrepo.build(site, tmp_path / "gnupg")
    assert [r.relative_to(site).as_posix() for r in repos] == [
        "compute/cuda/repos/debian12/x86_64",
        "compute/cuda/repos/debian13/x86_64",
    ]
    repo = repos[0]
    index = hostparse.parse_deb822((repo / "Packages").read_text())
    versions = {s["Package"]: s["Version"] for s in index}
    assert versions == {
        "cuda-cudart-12-4": "12.4.127-1",
        "cuda-cudart-dev-12-4": "12.4.127-1",
        "cuda-nvcc-12-4": "12.4.131-1",
        "cuda-toolkit-12-4": "12.4.1-1",
        "cuda-toolkit-12-4-config-common": "12.4.127-1",
        "cuda-toolkit-12-config-common": "12.4.127-1",
        "cuda-toolkit-config-common": "12.4.127-1",
        "libcudnn9-cuda-12": "9.1.0.70-1",
        "libcudnn9-dev-cuda-12": "9.1.0.70-1",
        "cudnn9-cuda-12": "9.1.0.70-1",
        "libcudnn8": "8.6.0.163-1+cuda11.8",
        "libcudnn8-dev": "8.6.0.163-1+cuda11.8",
        "cuda-keyring": "1.1-1",
    }
    for stanza in index:  # NVIDIA's flat form, and sums that are the files'
        deb = repo / stanza["Filename"].removeprefix("./")
        assert stanza["Filename"].startswith("./")
        assert stanza["SHA256"] == hashlib.sha256(deb.read_bytes()).hexdigest()
        assert stanza["Maintainer"] == "cudatools <cudatools@nvidia.com>"
    # The layout: libraries in the toolkit's targets tree, lib64 a link to it; cuDNN in the system's
    # library directory, its headers as _vN names behind the libcudnn alternative.
    cudart = _contents(repo / "cuda-cudart-12-4_12.4.127-1_amd64.deb")
    assert "./usr/local/cuda-12.4/targets/x86_64-linux/lib/libcudart.so.12.4.127" in cudart
    assert "./usr/local/cuda-12.4/lib64 -> targets/x86_64-linux/lib" in cudart
    assert "libcudart.so ->" not in cudart  # the dev link is the -dev package's
    assert "-rwxr-xr-x root/root" in _contents(repo / "cuda-nvcc-12-4_12.4.131-1_amd64.deb")
    common = _script(repo / "cuda-toolkit-12-4-config-common_12.4.127-1_all.deb", "postinst")
    assert "update-alternatives --install /usr/local/cuda cuda /usr/local/cuda-12.4 124" in common
    conf = _contents(repo / "cuda-toolkit-config-common_12.4.127-1_all.deb")
    assert "./etc/ld.so.conf.d/000_cuda.conf" in conf
    dev = _contents(repo / "libcudnn9-dev-cuda-12_9.1.0.70-1_amd64.deb")
    assert "./usr/include/x86_64-linux-gnu/cudnn_version_v9.h" in dev
    assert "cudnn_v9_v9.h" not in dev
    postinst = _script(repo / "libcudnn9-dev-cuda-12_9.1.0.70-1_amd64.deb", "postinst")
    assert (
        "update-alternatives --install /usr/include/cudnn.h libcudnn /usr/include/x86_64-linux-gnu/cudnn_v9.h 90"
        in postinst
    )
    assert (
        "--slave /usr/lib/x86_64-linux-gnu/libcudnn.so libcudnn_so /usr/lib/x86_64-linux-gnu/libcudnn.so.9" in postinst
    )
    assert "./usr/lib/x86_64-linux-gnu/libcudnn_cnn_infer.so.8.6.0" in _contents(
        repo / "libcudnn8_8.6.0.163-1+cuda11.8_amd64.deb"
    )
    # The Release lists the index by its sums; InRelease verifies with the key cuda-keyring installs.
    release = hostparse.parse_deb822((repo / "Release").read_text())[0]
    assert (release["Origin"], release["Label"], release["Architecture"]) == ("NVIDIA", "NVIDIA CUDA", "x86_64")
    assert hashlib.sha256((repo / "Packages").read_bytes()).hexdigest() in release["SHA256"]
    unpacked = tmp_path / "keyring"
    subprocess.run(["dpkg-deb", "-x", str(repo / "cuda-keyring_1.1-1_all.deb"), str(unpacked)], check=True)  # noqa: S607
    keyring = unpacked / aptrepo.KEYRING.lstrip("/")
    sources = (unpacked / "etc/apt/sources.list.d/cuda-debian12-x86_64.list").read_text()
    assert sources == (
        "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
        "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ /\n"
    )
    gpgv = ["gpgv", "--keyring", str(keyring), str(repo / "InRelease")]
    checked = subprocess.run(gpgv, capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stderr
    # The same inputs: nothing is built again.
    before = (repo / "InRelease").stat().st_mtime_ns
    aptrepo.build(site, tmp_path / "gnupg")
    assert (repo / "InRelease").stat().st_mtime_ns == before


def test_without_the_mirror_the_build_says_to_build_it_first(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="build the mirror first"):
        aptrepo.build(tmp_path, tmp_path / "gnupg")
