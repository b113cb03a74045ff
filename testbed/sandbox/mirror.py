"""A local mirror of NVIDIA's redist tree, built from NVIDIA's own binaries on PyPI.

The result has NVIDIA's layout and manifests exactly, so the roles use the same code path against
it as against NVIDIA's servers or a site's mirror of them:

    compute/cuda/redist/redistrib_12.4.1.json
    compute/cuda/redist/cuda_cudart/linux-x86_64/cuda_cudart-linux-x86_64-12.4.127-archive.tar.xz
    compute/cudnn/redist/redistrib_9.1.0.json
    compute/cudnn/redist/cudnn/linux-x86_64/cudnn-linux-x86_64-9.1.0.70_cuda12-archive.tar.xz

Built once and cached; building again verifies every wheel and archive against its checksum and
rebuilds only what is missing or does not match.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpuenv import redist
from testbed.sandbox import fleet
from testbed.sandbox.util import SandboxError, log, run

PLATFORM = "linux-x86_64"


@dataclass(frozen=True)
class Wheel:
    project: str
    version: str
    sha256: str
    # Older nvidia-* wheels are tagged manylinux1 (the tag is part of the file name PyPI serves).
    platform: str = "manylinux2014_x86_64"

    def filename(self) -> str:
        return f"{self.project.replace('-', '_')}-{self.version}-py3-none-{self.platform}.whl"


def spec() -> dict[str, Any]:
    text = resources.files("testbed").joinpath("data/mirror.yaml").read_text(encoding="utf-8")
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def digest(path: Path, algo: str = "sha256") -> str:
    h = hashlib.new(algo)
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(wheel: Wheel, wheels: Path) -> Path:
    """The wheel from PyPI (cached), its sha256 checked against the pin."""
    path = wheels / wheel.filename()
    if path.exists() and digest(path) == wheel.sha256:
        return path
    wheels.mkdir(parents=True, exist_ok=True)
    log(f"downloading {wheel.project}=={wheel.version} from PyPI")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary=:all:",
            "--platform",
            "manylinux2014_x86_64",
            "--python-version",
            "3.11",
            "--dest",
            str(wheels),
            f"{wheel.project}=={wheel.version}",
        ],
        capture=True,
        timeout=1800,
    )
    if not path.exists():
        raise SandboxError(f"pip saved no {wheel.filename()} in {wheels}")
    actual = digest(path)
    if actual != wheel.sha256:
        path.unlink()
        raise SandboxError(
            f"{wheel.filename()}: sha256 {actual}, expected {wheel.sha256}; the download was "
            "removed. A proxy or index that serves other files than PyPI would explain it."
        )
    return path


def _versioned_name(name: str, version: str) -> tuple[str, str] | None:
    """libcudnn.so.9 with version 9.1.0 -> ("libcudnn.so.9.1.0", "libcudnn.so"); None if not a .so.N."""
    match = re.fullmatch(r"(lib[^/]+\.so)\.([0-9]+(?:\.[0-9]+)*)", name)
    if not match:
        return None
    return f"{match.group(1)}.{version}", match.group(1)


def _stage(wheel_path: Path, prefix: str, top: Path, lib_version: str) -> None:
    """Unpack a wheel's files under `prefix` into `top`, with NVIDIA's library file names and links."""
    with zipfile.ZipFile(wheel_path) as zf:
        for info in zf.infolist():
            name = info.filename
            if name.endswith(".dist-info/License.txt"):
                (top / "LICENSE").write_bytes(zf.read(info))
                continue
            if not name.startswith(prefix + "/") or name.endswith(("/", "__init__.py")) or "__pycache__" in name:
                continue
            rel = name[len(prefix) + 1 :]
            dest = top / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, dest.open("wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            mode = (info.external_attr >> 16) & 0o777
            dest.chmod(mode or 0o644)
            renamed = _versioned_name(dest.name, lib_version) if "lib" in dest.parent.name else None
            if renamed is not None:
                real, dev_link = renamed
                if real != dest.name:
                    dest.rename(dest.parent / real)
                    (dest.parent / dest.name).symlink_to(real)
                if not (dest.parent / dev_link).exists():
                    (dest.parent / dev_link).symlink_to(dest.name)
    if not (top / "LICENSE").exists():
        raise SandboxError(f"{wheel_path.name} has no License.txt to ship as LICENSE")


def _pack(top: Path, archive: Path) -> None:
    """tar.xz with the top folder, sorted and owner-neutral; xz uses every core."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_suffix(".partial")
    # Level 0: on a cuDNN library 1.8 times as fast as level 1 for 8.5 % more bytes (the archives are
    # served on the machine itself); the cold build of the mirror is mostly this compression.
    env = {**os.environ, "XZ_OPT": "-T0 -0"}
    subprocess.run(  # noqa: S603 - fixed argv
        [
            "/usr/bin/tar",
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mtime=@0",
            "-cJf",
            str(tmp),
            "-C",
            str(top.parent),
            top.name,
        ],
        check=True,
        env=env,
    )
    tmp.replace(archive)


def _entry(archive: Path, root: Path) -> dict[str, str]:
    return {
        "relative_path": str(archive.relative_to(root)),
        "sha256": digest(archive),
        "md5": digest(archive, "md5"),
        "size": str(archive.stat().st_size),
    }


def _build_archive(
    wheel: Wheel, prefix: str, wheels: Path, archive: Path, *, lib_version: str, known: dict[str, str] | None
) -> None:
    license_file = archive.parent.parent / "LICENSE.txt"
    if archive.exists() and license_file.exists() and known is not None and digest(archive) == known["sha256"]:
        return
    if archive.exists():
        log(f"{archive.name} does not match its manifest (or has no license file beside it): rebuilding it")
    log(f"building {archive.name}")
    wheel_path = fetch_wheel(wheel, wheels)
    # Stage beside the wheel cache: the same disk as the site, not /tmp (often a small tmpfs).
    with tempfile.TemporaryDirectory(dir=wheels.parent) as tmp:
        top = Path(tmp) / archive.name.removesuffix(".tar.xz")
        top.mkdir()
        _stage(wheel_path, prefix, top, lib_version)
        _pack(top, archive)
        # NVIDIA serves each component's license beside its platforms (the manifests' license_path).
        shutil.copyfile(top / "LICENSE", archive.parent.parent / "LICENSE.txt")


def _previous(manifest: Path) -> dict[str, Any]:
    return json.loads(manifest.read_text()) if manifest.exists() else {}


def build(site: Path, wheels: Path) -> list[Path]:
    """Build or verify the mirror under `site`; returns the manifests."""
    manifests = []
    data = spec()
    cuda_root = site / "compute" / "cuda" / "redist"
    for release, components in data["cuda"].items():
        manifest_path = cuda_root / f"redistrib_{release}.json"
        old = _previous(manifest_path)
        manifest: dict[str, Any] = {"release_label": release, "release_product": "cuda"}
        for comp, entry in components.items():
            wheel = Wheel(**entry["wheel"])
            archive = cuda_root / comp / PLATFORM / f"{comp}-{PLATFORM}-{wheel.version}-archive.tar.xz"
            _build_archive(
                wheel,
                entry["prefix"],
                wheels,
                archive,
                lib_version=wheel.version,
                known=old.get(comp, {}).get(PLATFORM),
            )
            manifest[comp] = {
                "name": entry["name"],
                "license": entry["license"],
                "license_path": f"{comp}/LICENSE.txt",
                "version": wheel.version,
                PLATFORM: _entry(archive, cuda_root),
            }
        manifest_path.write_text(json.dumps(manifest, indent=4) + "\n")
        manifests.append(manifest_path)
    cudnn_root = site / "compute" / "cudnn" / "redist"
    for release, components in data["cudnn"].items():
        manifest_path = cudnn_root / f"redistrib_{release}.json"
        old = _previous(manifest_path)
        manifest = {"release_label": release, "release_product": "cudnn"}
        for comp, entry in components.items():
            version = entry["version"]
            per_variant: dict[str, Any] = {}
            for variant, v in entry["variants"].items():
                major = variant.removeprefix("cuda")
                archive = cudnn_root / comp / PLATFORM / f"{comp}-{PLATFORM}-{version}_cuda{major}-archive.tar.xz"
                lib_version = ".".join(version.split(".")[:3])
                _build_archive(
                    Wheel(**v["wheel"]),
                    v["prefix"],
                    wheels,
                    archive,
                    lib_version=lib_version,
                    known=old.get(comp, {}).get(PLATFORM, {}).get(variant),
                )
                per_variant[variant] = _entry(archive, cudnn_root)
            manifest[comp] = {
                "name": entry["name"],
                "license": entry["license"],
                "license_path": f"{comp}/LICENSE.txt",
                "version": version,
                PLATFORM: per_variant,
                "cuda_variant": sorted(v.removeprefix("cuda") for v in entry["variants"]),
            }
        manifest_path.write_text(json.dumps(manifest, indent=4) + "\n")
        manifests.append(manifest_path)
    for entry in data.get("cudnn_legacy", []):
        build_legacy_cudnn(site, wheels, entry)
    build_pytorch_index(site, data.get("pytorch_index", {}))
    return manifests


def legacy_cudnn_path(site: Path, entry: dict[str, Any]) -> Path:
    """compute/redist/cudnn/v8.6.0/cudnn-11.8-linux-x64-v8.6.0.163.tgz: the path and name pattern
    of NVIDIA's .tgz era (docs/research/cudnn8-releases.md 2a)."""
    version = str(entry["version"])
    release = ".".join(version.split(".")[:3])
    return site / "compute/redist/cudnn" / f"v{release}" / f"cudnn-{entry['cuda']}-linux-x64-v{version}.tgz"


def build_legacy_cudnn(site: Path, wheels: Path, entry: dict[str, Any]) -> Path:
    """The cuDNN tarball in the old layout (cuda/include, cuda/lib64), with its sha256 beside it in
    <name>.sha256 (that era had no manifest; sites pin the tarball itself)."""
    archive = legacy_cudnn_path(site, entry)
    sums = archive.with_name(archive.name + ".sha256")
    if archive.exists() and sums.exists() and sums.read_text().split()[0] == digest(archive):
        return archive
    log(f"building {archive.name}")
    wheel_path = fetch_wheel(Wheel(**entry["wheel"]), wheels)
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheels.parent) as tmp:
        top = Path(tmp) / "cuda"
        top.mkdir()
        _stage(wheel_path, entry["prefix"], top, ".".join(str(entry["version"]).split(".")[:3]))
        (top / "lib").rename(top / "lib64")
        (top / "LICENSE").rename(top / "NVIDIA_SLA_cuDNN_Support.txt")
        partial = archive.with_suffix(".partial")
        subprocess.run(  # noqa: S603 - fixed argv
            ["/usr/bin/tar", "--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mtime=@0",
             "--use-compress-program=gzip -n -1", "-cf", str(partial), "-C", tmp, "cuda"],
            check=True,
        )  # fmt: skip
        partial.replace(archive)
    sums.write_text(f"{digest(archive)}  {archive.name}\n")
    return archive


def build_pytorch_index(site: Path, index: dict[str, Any]) -> None:
    """site/whl/<variant>/<project>/ with the wheels and a PEP 503 index.html (sha256 in each link)."""
    for variant, projects in index.items():
        for project, wheels in projects.items():
            folder = site / "whl" / variant / project
            folder.mkdir(parents=True, exist_ok=True)
            links = []
            for wheel in wheels:
                target = folder / wheel["file"]
                if not (target.exists() and digest(target) == wheel["sha256"]):
                    _fetch_index_wheel(wheel, target)
                links.append(
                    f'<a href="{wheel["file"].replace("+", "%2B")}#sha256={wheel["sha256"]}">{wheel["file"]}</a>'
                )
            (folder / "index.html").write_text(
                "<!DOCTYPE html><html><body>\n" + "<br>\n".join(links) + "\n</body></html>\n"
            )


def _fetch_index_wheel(wheel: dict[str, Any], target: Path) -> None:
    for place in wheel.get("local", []):
        candidate = Path(place) / wheel["file"]
        if candidate.exists() and digest(candidate) == wheel["sha256"]:
            log(f"mirror: {wheel['file']} from {place}")
            shutil.copyfile(candidate, target)
            return
    log(f"mirror: downloading {wheel['file']}")
    partial = target.with_name(target.name + ".partial")
    try:
        if not str(wheel["url"]).startswith("https://"):
            raise OSError(f"not an https URL: {wheel['url']}")
        urllib.request.urlretrieve(wheel["url"], partial)  # noqa: S310 - https only, checked above
    except OSError as exc:
        raise SandboxError(
            f"{wheel['file']} is in none of {', '.join(wheel.get('local', [])) or 'no local folder'} and "
            f"{wheel['url']} cannot be reached ({exc}); copy the wheel into one of those folders"
        ) from exc
    if digest(partial) != wheel["sha256"]:
        partial.unlink()
        raise SandboxError(f"{wheel['url']}: sha256 is not {wheel['sha256']}; nothing was kept")
    partial.replace(target)


def archives(manifest: dict[str, Any]) -> list[dict[str, str]]:
    """Every platform archive entry of a manifest, cuDNN's per-CUDA-major nesting included."""
    found = []
    for entry in manifest.values():
        if not isinstance(entry, dict):
            continue
        for key, value in entry.items():
            if key.startswith(("linux-", "windows-")) and isinstance(value, dict):
                found.extend([value] if "relative_path" in value else list(value.values()))
    return found


def default_site() -> Path:
    return fleet.mirror_root()


def default_wheels() -> Path:
    return default_site().parent / "wheels"


def verify(site: Path) -> list[str]:
    """Problems with the built mirror: archives missing or not matching their manifest."""
    problems = []
    for product in ("cuda", "cudnn"):
        root = site / "compute" / product / "redist"
        for manifest_path in sorted(root.glob("redistrib_*.json")):
            for entry in archives(json.loads(manifest_path.read_text())):
                if not redist.plain_relative_path(entry.get("relative_path")):
                    problems.append(
                        f"{manifest_path}: relative_path {entry.get('relative_path')!r} is not under the mirror"
                    )
                    continue
                archive = root / entry["relative_path"]
                if not archive.exists():
                    problems.append(f"{archive}: missing")
                elif digest(archive) != entry["sha256"]:
                    problems.append(f"{archive}: sha256 differs from {manifest_path.name}")
                elif str(archive.stat().st_size) != entry["size"]:
                    problems.append(f"{archive}: size differs from {manifest_path.name}")
    for entry in spec().get("cudnn_legacy", []):
        archive = legacy_cudnn_path(site, entry)
        sums = archive.with_name(archive.name + ".sha256")
        if not archive.exists() or not sums.exists():
            problems.append(f"{archive}: missing (or its .sha256)")
        elif sums.read_text().split()[0] != digest(archive):
            problems.append(f"{archive}: sha256 differs from {sums.name}")
    return problems
