"""The local NVIDIA mirror: NVIDIA's manifest schema, checksums that match, NVIDIA's archive layout.

The first run downloads the nvidia-* wheels from PyPI (about 700 MB) and builds the archives
(a few minutes); later runs verify the cached mirror.
"""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
from pathlib import Path

import jsonschema
import pytest

from testbed.sandbox import mirror

SCHEMA = json.loads((Path(mirror.__file__).parents[1] / "data" / "redistrib.schema.json").read_text())


@pytest.fixture(scope="session")
def site() -> Path:
    path = mirror.default_site()
    mirror.build(path, mirror.default_wheels())
    return path


def _manifests(site: Path) -> list[Path]:
    found = sorted(site.glob("compute/*/redist/redistrib_*.json"))
    assert {p.name for p in found} >= {"redistrib_12.4.1.json", "redistrib_9.1.0.json"}
    return found


def test_manifests_match_nvidias_schema(site: Path) -> None:
    for path in _manifests(site):
        jsonschema.validate(json.loads(path.read_text()), SCHEMA)


def test_schema_rejects_what_nvidia_never_publishes() -> None:
    bad = {
        "release_label": "12.4.1",
        "release_product": "cuda",
        "cuda_cudart": {
            "name": "x",
            "license": "y",
            "version": "12.4.127",
            "linux-x86_64": {"relative_path": "a/b/c-archive.tar.xz", "sha256": "0" * 64, "md5": "0" * 32, "size": 123},
        },
    }  # size must be a string
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


def test_checksums_match_the_archives(site: Path) -> None:
    assert mirror.verify(site) == []
    for path in _manifests(site):
        for entry in mirror.archives(json.loads(path.read_text())):
            archive = path.parent / entry["relative_path"]
            assert mirror.digest(archive, "md5") == entry["md5"]
            assert (archive.parent.parent / "LICENSE.txt").exists()


def test_cudnn_archive_unpacks_to_nvidias_layout(site: Path, tmp_path: Path) -> None:
    manifest = json.loads((site / "compute/cudnn/redist/redistrib_9.1.0.json").read_text())
    entry = manifest["cudnn"]["linux-x86_64"]["cuda12"]
    assert entry["relative_path"] == "cudnn/linux-x86_64/cudnn-linux-x86_64-9.1.0.70_cuda12-archive.tar.xz"
    assert manifest["cudnn"]["cuda_variant"] == ["12"]
    subprocess.run(
        ["/usr/bin/tar", "-xJf", str(site / "compute/cudnn/redist" / entry["relative_path"]), "-C", str(tmp_path)],
        check=True,
    )
    top = tmp_path / "cudnn-linux-x86_64-9.1.0.70_cuda12-archive"
    assert sorted(p.name for p in top.iterdir()) == ["LICENSE", "include", "lib"]
    header = (top / "include/cudnn_version.h").read_text()
    assert re.search(r"#define CUDNN_MAJOR 9\b", header)
    assert re.search(r"#define CUDNN_MINOR 1\b", header)
    assert re.search(r"#define CUDNN_PATCHLEVEL 0\b", header)
    lib = top / "lib"
    for name in ("libcudnn", "libcudnn_ops", "libcudnn_cnn", "libcudnn_adv", "libcudnn_graph"):
        real = lib / f"{name}.so.9.1.0"
        assert real.is_file()
        assert not real.is_symlink()
        assert (lib / f"{name}.so.9").readlink() == Path(f"{name}.so.9.1.0")
        assert (lib / f"{name}.so").readlink() == Path(f"{name}.so.9")
    with (lib / "libcudnn.so.9.1.0").open("rb") as f:
        assert f.read(4) == b"\x7fELF"


def test_cuda_archives_unpack_to_nvidias_layout(site: Path) -> None:
    root = site / "compute/cuda/redist"
    manifest = json.loads((root / "redistrib_12.4.1.json").read_text())
    assert {"cuda_cudart", "cuda_nvcc", "cuda_nvrtc"} <= set(manifest)
    with tarfile.open(root / manifest["cuda_cudart"]["linux-x86_64"]["relative_path"]) as tf:
        names = set(tf.getnames())
    top = "cuda_cudart-linux-x86_64-12.4.127-archive"
    assert {
        f"{top}/LICENSE",
        f"{top}/include/cuda_runtime.h",
        f"{top}/lib/libcudart.so.12.4.127",
        f"{top}/lib/libcudart.so.12",
        f"{top}/lib/libcudart.so",
    } <= names


def test_a_damaged_archive_is_found_and_rebuilt(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A private copy of the small cudart part of the mirror, so the shared one stays intact.
    spec = mirror.spec()
    monkeypatch.setattr(
        mirror,
        "spec",
        lambda: {"cuda": {"12.4.1": {"cuda_cudart": spec["cuda"]["12.4.1"]["cuda_cudart"]}}, "cudnn": {}},
    )
    private = tmp_path / "site"
    mirror.build(private, mirror.default_wheels())
    archive = private / "compute/cuda/redist/cuda_cudart/linux-x86_64/cuda_cudart-linux-x86_64-12.4.127-archive.tar.xz"
    good = mirror.digest(archive)
    with archive.open("r+b") as f:
        f.seek(100)
        f.write(b"corrupt")
    assert mirror.verify(private) == [f"{archive}: sha256 differs from redistrib_12.4.1.json"]
    mirror.build(private, mirror.default_wheels())
    assert mirror.verify(private) == []
    assert mirror.digest(archive) == good


def test_verify_reports_a_manifest_path_outside_the_mirror_without_reading_it(tmp_path: Path) -> None:
    root = tmp_path / "compute/cuda/redist"
    root.mkdir(parents=True)
    outside = {"relative_path": "../../../../etc/passwd", "sha256": "0" * 64, "size": "1"}
    (root / "redistrib_12.4.1.json").write_text(json.dumps({"cuda_cudart": {"linux-x86_64": outside}}))
    # The mirror's other contents (the legacy cuDNN tarballs it must hold) are reported missing
    # too; what matters here is the manifest's own line.
    problems = [p for p in mirror.verify(tmp_path) if "redistrib_" in p or "passwd" in p]
    assert problems == [
        f"{root / 'redistrib_12.4.1.json'}: relative_path '../../../../etc/passwd' is not under the mirror"
    ]
