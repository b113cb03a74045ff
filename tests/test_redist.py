"""The cuda_toolkit and cudnn roles' helpers, on the mirror's manifests (NVIDIA's layout) and on
saved real output (tests/data/README.md says whence)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuenv import redist
from gpuenv.module_utils import gpuenv_hostparse as hostparse

DATA = Path(__file__).parent / "data"

# The shape of NVIDIA's redistrib_<version>.json (compat-facts.md section 6), values from the mirror.
CUDA_MANIFEST = {
    "release_label": "12.4.1",
    "release_product": "cuda",
    "cuda_cudart": {
        "name": "CUDA Runtime (cudart)",
        "version": "12.4.127",
        "linux-x86_64": {
            "relative_path": "cuda_cudart/linux-x86_64/cuda_cudart-linux-x86_64-12.4.127-archive.tar.xz",
            "sha256": "a" * 64,
            "size": "1000",
        },
    },
    "cuda_nvcc": {
        "name": "CUDA NVCC",
        "version": "12.4.131",
        "linux-x86_64": {
            "relative_path": "cuda_nvcc/linux-x86_64/cuda_nvcc-linux-x86_64-12.4.131-archive.tar.xz",
            "sha256": "b" * 64,
        },
        "linux-sbsa": {"relative_path": "x", "sha256": "c" * 64},
    },
}
CUDNN_MANIFEST = {
    "release_label": "9.1.0",
    "cudnn": {
        "version": "9.1.0.70",
        "linux-x86_64": {
            "cuda12": {
                "relative_path": "cudnn/linux-x86_64/cudnn-linux-x86_64-9.1.0.70_cuda12-archive.tar.xz",
                "sha256": "d" * 64,
            }
        },
    },
}


def test_archives_in_the_order_asked() -> None:
    found = redist.archives(json.dumps(CUDA_MANIFEST), ["cuda_nvcc", "cuda_cudart"])
    assert [a["component"] for a in found] == ["cuda_nvcc", "cuda_cudart"]
    assert found[0]["version"] == "12.4.131"
    assert found[0]["file"] == "cuda_nvcc-linux-x86_64-12.4.131-archive.tar.xz"


def test_a_missing_component_names_what_the_manifest_offers() -> None:
    with pytest.raises(redist.RedistError) as err:
        redist.archives(CUDA_MANIFEST, ["cuda_cudart", "libcublas"])
    assert "no libcublas" in str(err.value)
    assert "offers: cuda_cudart, cuda_nvcc" in str(err.value)


def test_cudnn_variant_per_cuda_major() -> None:
    found = redist.archives(CUDNN_MANIFEST, ["cudnn"], variant="cuda12")
    assert found[0]["file"] == "cudnn-linux-x86_64-9.1.0.70_cuda12-archive.tar.xz"
    with pytest.raises(redist.RedistError, match="cuda12 only, not cuda11"):
        redist.archives(CUDNN_MANIFEST, ["cudnn"], variant="cuda11")


def test_tree_id_changes_with_the_bytes_not_the_order() -> None:
    found = redist.archives(CUDA_MANIFEST, ["cuda_cudart", "cuda_nvcc"])
    assert redist.tree_id(found) == redist.tree_id(list(reversed(found)))
    other = json.loads(json.dumps(CUDA_MANIFEST))
    other["cuda_nvcc"]["linux-x86_64"]["sha256"] = "e" * 64
    assert redist.tree_id(redist.archives(other, ["cuda_cudart", "cuda_nvcc"])) != redist.tree_id(found)


@pytest.mark.parametrize(("version", "release"), [("12.4.131", "12.4"), ("12.1.105", "12.1")])
def test_ptxas_version(version: str, release: str) -> None:
    text = (DATA / f"ptxas-version-{version}.txt").read_text()
    assert hostparse.tool_version(text) == {"release": release, "version": version}
    assert hostparse.tool_version("ptxas: command not found") is None


def test_cudnn_header_version() -> None:
    assert hostparse.cudnn_header_version((DATA / "cudnn_version-9.1.0.70.h").read_text()) == "9.1.0"
    assert hostparse.cudnn_header_version("#define CUDNN_MAJOR 9\n") is None


def test_the_loader_cache_lists_each_soname_s_paths() -> None:
    text = (
        "3 libs found in cache `/etc/ld.so.cache'\n"
        "\tlibcudnn.so.9 (libc6,x86-64) => /usr/local/cuda-12.4/lib64/libcudnn.so.9\n"
        "\tlibcudnn.so (libc6,x86-64) => /usr/local/cuda-12.4/lib64/libcudnn.so\n"
        "\tlibcudnn_ops.so.9 (libc6,x86-64) => /usr/local/cuda-12.4/lib64/libcudnn_ops.so.9\n"
    )
    cache = hostparse.parse_ldconfig(text)
    assert cache["libcudnn.so.9"] == ["/usr/local/cuda-12.4/lib64/libcudnn.so.9"]
    assert "libcudart.so.12" not in cache


@pytest.mark.parametrize(("suite", "release"), [("bookworm", "11.8.0"), ("trixie", "12.4.1")])
def test_debian_toolkit_release(suite: str, release: str) -> None:
    (version,) = hostparse.parse_madison((DATA / f"apt-cache-madison-nvidia-cuda-toolkit-{suite}.txt").read_text())
    assert redist.debian_toolkit_release(version) == release


def test_fetch_failures_name_the_file_and_both_sums() -> None:
    # get_url's own message names its temporary file, not the archive; the role says which archive.
    cudart = "cuda_cudart-linux-x86_64-12.1.105-archive.tar.xz"
    tmp_msg = f"The checksum for /root/.ansible/tmp/tmp9y7v8dj0 did not match {'0' * 64}; it was {'2e' * 32}."
    results = [
        {"item": {"file": "ok.tar.xz", "relative_path": "x/ok.tar.xz"}, "changed": True},
        {"failed": True, "item": {"file": cudart, "relative_path": "cuda_cudart/a.tar.xz"}, "msg": tmp_msg},
        {"failed": True, "item": {"file": "gone.tar.xz", "url": "http://m/gone.tar.xz"}, "msg": "HTTP 404"},
    ]
    assert redist.fetch_failures(results, "http://m/redist/") == [
        "cuda_cudart-linux-x86_64-12.1.105-archive.tar.xz from http://m/redist/cuda_cudart/a.tar.xz: "
        f"sha256 is {'2e' * 32}, expected {'0' * 64}",
        "gone.tar.xz from http://m/gone.tar.xz: could not be downloaded (HTTP 404)",
    ]


@pytest.mark.parametrize(
    "path",
    [
        "../../../etc/cron.d/gpuenv",
        "/etc/profile.d/x.sh",
        "cuda_cudart/linux-x86_64/../../../../root/.ssh/authorized_keys",
        "cuda_cudart//x.tar.xz",
        "cuda_cudart/./x.tar.xz",
        "cuda_cudart\\..\\x.tar.xz",
        "cuda_cudart/x.tar.xz\n",
        "",
    ],
)
def test_a_manifest_path_outside_the_mirror_is_refused(path: str) -> None:
    # A manifest is data from the network; its paths name where the controller and the hosts write.
    manifest = {
        "release_label": "12.4.1",
        "cuda_cudart": {"version": "12.4.127", "linux-x86_64": {"relative_path": path, "sha256": "0" * 64}},
    }
    with pytest.raises(redist.RedistError, match="is not a plain relative path under the mirror"):
        redist.archives(manifest, ["cuda_cudart"])


def test_plain_manifest_paths_pass() -> None:
    for path in (
        "cuda_cudart/linux-x86_64/cuda_cudart-linux-x86_64-12.4.127-archive.tar.xz",
        "cudnn/linux-x86_64/cudnn-linux-x86_64-9.1.0.70_cuda12-archive.tar.xz",
        "cudnn-11.3-linux-x64-v8.2.1.32.tgz",
    ):
        assert redist.plain_relative_path(path), path
