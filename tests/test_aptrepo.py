"""The sandbox's CUDA apt repository (testbed/sandbox/aptrepo.py), built from a small stand-in of the
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

from gpuenv.module_utils import gpuenv_hostparse as hostparse
from testbed.sandbox import aptrepo
from testbed.sandbox.util import SandboxError

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


DEBIAN12_DRIVER = "535.309.01-0+deb12u1"
DEBIAN13_DRIVER = "550.163.01-2"


def _debian_deb(out: Path, control: dict[str, str]) -> Path:
    """A small real package (dpkg-deb builds it) with the given control fields and one file."""
    root = out / f"{control['Package']}.d"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "usr/share/doc" / control["Package"]).mkdir(parents=True)
    (root / "usr/share/doc" / control["Package"] / "README").write_text(f"{control['Package']}\n")
    fields = {"Architecture": "amd64", "Maintainer": "Debian NVIDIA Maintainers <x@debian.org>", **control}
    fields.setdefault("Description", "stand-in")
    (root / "DEBIAN/control").write_text("".join(f"{k}: {v}\n" for k, v in fields.items()))
    deb = out / f"{control['Package']}_{control['Version']}_amd64.deb"
    argv = ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)]
    subprocess.run(argv, check=True, capture_output=True)
    shutil.rmtree(root)
    return deb


def _debian_root(tmp_path: Path, name: str, version: str, open_version: str, downloads: Path) -> Path:
    """A Debian root's apt lists (non-free) naming Debian's driver packages, as Debian builds them
    (the relations between them, a virtual package one of them provides, a package of another source
    at its own version, bookworm's open modules at an older version), their files in downloads."""
    upstream, open_upstream = version.split("-", maxsplit=1)[0], open_version.split("-", maxsplit=1)[0]
    src = f"nvidia-graphics-drivers ({version})"
    packages = [
        {"Package": "nvidia-driver", "Version": version, "Source": src,
         "Depends": f"nvidia-alternative (= {version}), nvidia-kernel-dkms (= {version}) | nvidia-kernel-{upstream}"
                    f" | nvidia-open-kernel-{upstream}, nvidia-support",
         "Recommends": f"nvidia-settings (>= 535), libnvidia-cfg1 (= {version})"},
        {"Package": "nvidia-kernel-dkms", "Version": version, "Source": src,
         "Depends": "nvidia-kernel-support--v1, dkms (>= 3.0.3-4~)", "Provides": f"nvidia-kernel-{upstream}"},
        {"Package": "nvidia-kernel-support", "Version": version, "Source": src,
         "Depends": f"nvidia-alternative (= {version})", "Provides": "nvidia-kernel-support--v1"},
        {"Package": "nvidia-alternative", "Version": version, "Source": src},
        {"Package": "libnvidia-cfg1", "Version": version, "Source": src},
        {"Package": "libcuda1", "Version": version, "Source": src, "Depends": f"nvidia-alternative (= {version})"},
        {"Package": "nvidia-smi", "Version": version, "Source": src, "Depends": f"libnvidia-ml1 (= {version})"},
        {"Package": "libnvidia-ml1", "Version": version, "Source": src},
        {"Package": "nvidia-support", "Version": "20240109+1"},
        {"Package": "nvidia-open-kernel-dkms", "Version": open_version,
         "Source": f"nvidia-open-gpu-kernel-modules ({open_version})",
         "Depends": "nvidia-kernel-support--v1", "Provides": f"nvidia-open-kernel-{open_upstream}"},
    ]  # fmt: skip
    downloads.mkdir(parents=True, exist_ok=True)
    stanzas = []
    for control in packages:
        deb = _debian_deb(downloads, control)
        pool = f"pool/non-free/n/nvidia-graphics-drivers/{deb.name}"
        stanzas.append(
            "".join(f"{k}: {v}\n" for k, v in control.items())
            + f"Architecture: amd64\nFilename: {pool}\nSize: {deb.stat().st_size}\n"
            + f"SHA256: {hashlib.sha256(deb.read_bytes()).hexdigest()}\n"
        )
    lists = tmp_path / name / "var/lib/apt/lists"
    lists.mkdir(parents=True)
    (lists / f"deb.debian.org_debian_dists_{name}_non-free_binary-amd64_Packages").write_text("\n".join(stanzas))
    return tmp_path / name


def _debian_roots(tmp_path: Path) -> tuple[dict[str, Path], Path]:
    downloads = tmp_path / "debian-debs"
    return {
        "debian12": _debian_root(tmp_path, "bookworm", DEBIAN12_DRIVER, "535.261.03-1", downloads),
        "debian13": _debian_root(tmp_path, "trixie", DEBIAN13_DRIVER, DEBIAN13_DRIVER, downloads),
    }, downloads


def _contents(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout  # noqa: S607


def _script(deb: Path, name: str) -> str:
    return subprocess.run(["dpkg-deb", "-I", str(deb), name], capture_output=True, text=True, check=True).stdout  # noqa: S607


def test_the_repository_has_nvidia_s_packages_and_a_release_apt_can_check(tmp_path: Path) -> None:
    site = _site(tmp_path / "site")
    roots, downloads = _debian_roots(tmp_path)
    repos = aptrepo.build(site, tmp_path / "gnupg", roots, downloads)
    assert [r.relative_to(site).as_posix() for r in repos] == [
        "compute/cuda/repos/debian12/x86_64",
        "compute/cuda/repos/debian13/x86_64",
    ]
    repo = repos[0]
    index = hostparse.parse_deb822((repo / "Packages").read_text())
    versions = {s["Package"]: s["Version"] for s in index}
    driver = (
        *("nvidia-driver", "nvidia-kernel-dkms", "nvidia-kernel-support", "nvidia-alternative"),
        *("libnvidia-cfg1", "libcuda1", "nvidia-smi", "libnvidia-ml1", "cuda-drivers", "cuda-drivers-535"),
    )
    assert {p: v for p, v in versions.items() if p in driver} == dict.fromkeys(driver, "535.309.01-1")
    versions = {p: v for p, v in versions.items() if p not in driver}
    assert versions == {
        "cuda-cudart-12-4": "12.4.127-1",
        "cuda-cudart-dev-12-4": "12.4.127-1",
        "cuda-nvcc-12-4": "12.4.131-1",
        "cuda-toolkit-12-4": "12.4.1-1",
        "cuda-libraries-12-4": "12.4.1-1",
        "cuda-runtime-12-4": "12.4.1-1",
        "cuda-12-4": "12.4.1-1",
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
        if stanza["Package"] not in driver:  # the driver's are Debian's packages, re-versioned
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
    # Library packages have dpkg run ldconfig once they are in, so that the loader's cache lists them.
    assert _script(repo / "libcudnn9-cuda-12_9.1.0.70-1_amd64.deb", "triggers") == "activate-noawait ldconfig\n"
    assert _script(repo / "cuda-cudart-12-4_12.4.127-1_amd64.deb", "triggers") == "activate-noawait ldconfig\n"
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
    aptrepo.build(site, tmp_path / "gnupg", roots, downloads)
    assert (repo / "InRelease").stat().st_mtime_ns == before


def _member(deb: Path, prefix: str) -> bytes:
    data = deb.read_bytes()
    pos = 8
    while pos < len(data):
        name, size = data[pos : pos + 16].decode().strip(), int(data[pos + 48 : pos + 58])
        if name.startswith(prefix):
            return data[pos + 60 : pos + 60 + size]
        pos += 60 + size + size % 2
    raise AssertionError(f"{deb.name} has no {prefix} member")


def test_the_driver_is_debian_s_packages_re_versioned_as_nvidia_s(tmp_path: Path) -> None:
    site = _site(tmp_path / "site")
    roots, downloads = _debian_roots(tmp_path)
    bookworm, trixie = aptrepo.build(site, tmp_path / "gnupg", roots, downloads)
    index = {s["Package"]: s for s in hostparse.parse_deb822((bookworm / "Packages").read_text())}
    # Every relation between the driver's packages names the new version; the rest is Debian's.
    driver = index["nvidia-driver"]
    assert driver["Depends"] == (
        "nvidia-alternative (= 535.309.01-1), nvidia-kernel-dkms (= 535.309.01-1) | nvidia-kernel-535.309.01"
        " | nvidia-open-kernel-535.309.01, nvidia-support"
    )
    assert driver["Source"] == "nvidia-graphics-drivers (535.309.01-1)"
    assert driver["Recommends"] == "nvidia-settings (>= 535), libnvidia-cfg1 (= 535.309.01-1)"
    # Reached through the virtual package it provides; a package of another source stays Debian's,
    # and bookworm's open modules (another version) are left out, as are NVIDIA's open metapackages.
    assert "nvidia-kernel-support" in index
    assert "nvidia-support" not in index
    assert not {"nvidia-open-kernel-dkms", "nvidia-kernel-open-dkms", "nvidia-open"} & set(index)
    assert index["cuda-drivers"]["Depends"] == "cuda-drivers-535 (= 535.309.01-1)"
    assert index["cuda-drivers-535"]["Depends"] == (
        "nvidia-driver (>= 535.309.01-1), libcuda1 (>= 535.309.01-1), nvidia-smi (>= 535.309.01-1), "
        "nvidia-kernel-dkms (>= 535.309.01-1)"
    )
    assert index["cuda-runtime-12-4"]["Depends"] == "cuda-libraries-12-4 (>= 12.4.1), cuda-drivers (>= 550.54.15)"
    # The binaries are Debian's, byte for byte; only the control member changed.
    original = downloads / f"nvidia-driver_{DEBIAN12_DRIVER}_amd64.deb"
    rebuilt = bookworm / "nvidia-driver_535.309.01-1_amd64.deb"
    assert _member(rebuilt, "data.tar") == _member(original, "data.tar")
    assert _member(rebuilt, "control.tar") != _member(original, "control.tar")
    for deb in bookworm.glob("*.deb"):
        info = subprocess.run(["dpkg-deb", "--info", str(deb)], capture_output=True, text=True, check=False)  # noqa: S607
        assert info.returncode == 0, (deb.name, info.stderr)
    # Debian 13: the open modules under NVIDIA's name, answering to Debian's, and nvidia-open.
    index = {s["Package"]: s for s in hostparse.parse_deb822((trixie / "Packages").read_text())}
    opened = index["nvidia-kernel-open-dkms"]
    assert opened["Version"] == "550.163.01-1"
    assert "nvidia-open-kernel-dkms (= 550.163.01-1)" in opened["Provides"]
    assert opened["Conflicts"] == opened["Replaces"] == "nvidia-open-kernel-dkms"
    assert index["nvidia-open"]["Depends"] == "nvidia-open-550 (= 550.163.01-1)"
    assert "nvidia-kernel-open-dkms (>= 550.163.01-1)" in index["nvidia-open-550"]["Depends"]


def test_a_new_driver_in_debian_s_index_builds_the_repository_again(tmp_path: Path) -> None:
    site = _site(tmp_path / "site")
    roots, downloads = _debian_roots(tmp_path)
    repo = aptrepo.build(site, tmp_path / "gnupg", roots, downloads)[0]
    shutil.rmtree(roots["debian12"])
    roots["debian12"] = _debian_root(tmp_path, "bookworm", "535.320.01-0+deb12u1", "535.261.03-1", downloads)
    aptrepo.build(site, tmp_path / "gnupg", roots, downloads)
    assert (repo / "libcuda1_535.320.01-1_amd64.deb").exists()
    assert not (repo / "libcuda1_535.309.01-1_amd64.deb").exists()


def test_without_the_mirror_the_build_says_to_build_it_first(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="build the mirror first"):
        aptrepo.build(tmp_path, tmp_path / "gnupg", {}, tmp_path)


def test_a_root_without_apt_lists_says_how_to_get_them(tmp_path: Path) -> None:
    site = _site(tmp_path / "site")
    roots = {"debian12": tmp_path / "empty", "debian13": tmp_path / "empty"}
    with pytest.raises(SandboxError, match="has no apt lists"):
        aptrepo.build(site, tmp_path / "gnupg", roots, tmp_path)


# lintian's errors that NVIDIA's own packages have too, by what they are: the toolkit lives in
# /usr/local/cuda-X.Y, its libraries depend on nothing but the config-common packages, the
# config-common packages add the toolkit to the loader's path, cuda-keyring installs apt sources.
# The stand-in archives' "libraries" are not amd64 ELF files, their static library no ar archive.
NVIDIA_LINTIAN = {
    "dir-in-usr-local",
    "file-in-usr-local",
    "missing-dependency-on-libc",
    "package-modifies-ld.so-search-path",
    "package-installs-apt-sources",
}
STAND_IN_LINTIAN = {"binary-from-other-architecture", "unpack-message-for-deb-data"}


@pytest.mark.skipif(not shutil.which("lintian"), reason="needs lintian (scripts/setup installs it)")
def test_lintian_finds_no_errors_beyond_those_of_nvidia_s_own_packages(tmp_path: Path) -> None:
    site = _site(tmp_path / "site")
    roots, downloads = _debian_roots(tmp_path)
    repo = aptrepo.build(site, tmp_path / "gnupg", roots, downloads)[0]
    # The packages made here: the driver's are Debian's own, only re-versioned.
    made = [d for d in sorted(repo.glob("*.deb")) if "nvidia" not in d.name and not d.name.startswith("libcuda1")]
    done = subprocess.run(["lintian", "-q", *map(str, made)], capture_output=True, text=True, check=False)  # noqa: S607
    errors = sorted({line.split()[2] for line in done.stdout.splitlines() if line.startswith("E: ")})
    assert set(errors) <= NVIDIA_LINTIAN | STAND_IN_LINTIAN, done.stdout
