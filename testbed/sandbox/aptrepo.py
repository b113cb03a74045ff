"""A local CUDA apt repository laid out, named, versioned and signed as NVIDIA's, built from the
sandbox mirror's redist archives (NVIDIA's own binaries, from PyPI's wheels), so that the roles'
nvidia_repo paths run for real against it:

    compute/cuda/repos/debian12/x86_64/Packages, Packages.gz, Release, Release.gpg, InRelease
    compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb
    compute/cuda/repos/debian12/x86_64/cuda-cudart-12-4_12.4.127-1_amd64.deb
    compute/cuda/repos/debian12/x86_64/libcudnn9-cuda-12_9.1.0.70-1_amd64.deb
    compute/cuda/repos/debian12/x86_64/libcudnn8_8.6.0.163-1+cuda11.8_amd64.deb
    compute/cuda/repos/debian12/x86_64/cuda-drivers_535.309.01-1_amd64.deb (aptdriver.py: Debian's own)

What NVIDIA's packages are (names, versions, file layout, the alternatives and loader settings of
the config-common packages, the cuDNN headers' _vN names and the libcudnn alternative, the flat
repository's Release fields, the keyring package) is in docs/research/nvidia-apt-repo.md with
its sources; docs/sandbox.md says where this imitation differs. The repository is signed with a key
the sandbox makes once (kept with the mirror); cuda-keyring carries it as NVIDIA's carries theirs.
Built again only when its inputs (the mirror's manifests, this file) change.
"""

from __future__ import annotations

import concurrent.futures
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path
from typing import Any

from gpuenv import compat, versions
from testbed.sandbox import aptdriver
from testbed.sandbox.util import SandboxError, log

DISTROS = ("debian12", "debian13")
ARCH = "x86_64"
KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"
MAINTAINER = "cudatools <cudatools@nvidia.com>"
SECTION = "multiverse/devel"
TARGET = "targets/x86_64-linux"
LIBDIR = "usr/lib/x86_64-linux-gnu"
INCDIR = "usr/include/x86_64-linux-gnu"
# The redist components this repository packages, and NVIDIA's package name for each.
COMPONENTS = {"cuda_cudart": "cudart", "cuda_nvcc": "nvcc", "cuda_nvrtc": "nvrtc"}
STAMP = ".gpuenv-repo.json"
LDCONFIG_TRIGGER = "activate-noawait ldconfig"


@dataclass
class Deb:
    """One package: its control fields and its files (path inside the package -> bytes, or a link
    target written "-> target"), with maintainer scripts."""

    name: str
    version: str
    arch: str = "amd64"
    depends: list[str] = field(default_factory=list)
    description: str = ""
    files: dict[str, bytes | str] = field(default_factory=dict)
    trees: list[tuple[Path, str]] = field(default_factory=list)  # (a staged directory, where it goes)
    scripts: dict[str, str] = field(default_factory=dict)
    # dpkg triggers it activates: a package of shared libraries activates ldconfig, so that the
    # loader's cache lists them once dpkg is done (as Debian's library packages and NVIDIA's do).
    triggers: list[str] = field(default_factory=list)

    def filename(self) -> str:
        return f"{self.name}_{self.version}_{self.arch}.deb"

    def control(self) -> str:
        lines = [
            f"Package: {self.name}",
            f"Version: {self.version}",
            f"Architecture: {self.arch}",
            f"Maintainer: {MAINTAINER}",
            "Priority: optional",
            f"Section: {SECTION}",
        ]
        if self.depends:
            lines.append("Depends: " + ", ".join(self.depends))
        summary, _, body = (self.description or self.name).partition("\n")
        body = body or f" {summary}, as NVIDIA's CUDA repository has it."
        lines.append(f"Description: {summary}")
        lines += [f" {line.strip()}" if line.strip() else " ." for line in body.splitlines()]
        return "\n".join(lines) + "\n"


def _digest(data: bytes, algo: str) -> str:
    return hashlib.new(algo, data).hexdigest()


def _docs(deb: Deb, root: Path) -> None:
    """The copyright file and the changelog every package carries (lintian's no-copyright-file and
    no-changelog): NVIDIA's software under NVIDIA's license, and who made this package."""
    doc = root / "usr/share/doc" / deb.name
    doc.mkdir(parents=True, exist_ok=True)
    (doc / "copyright").write_text(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
        f"Upstream-Name: {deb.name}\n"
        "Source: https://developer.download.nvidia.com/compute/\n\n"
        "Files: *\nCopyright: NVIDIA Corporation\nLicense: NVIDIA\n"
        " NVIDIA's license for this software: the CUDA Toolkit EULA or the cuDNN Software License\n"
        " Agreement, as shipped in the redist archive the package was made from.\n"
    )
    entry = (
        f"{deb.name} ({deb.version}) stable; urgency=medium\n\n"
        "  * Made by gpuenv's sandbox from NVIDIA's redist archives, in the layout of\n"
        "    NVIDIA's CUDA repository.\n\n"
        f" -- {MAINTAINER}  Thu, 01 Jan 1970 00:00:00 +0000\n"
    )
    (doc / "changelog.Debian.gz").write_bytes(gzip.compress(entry.encode(), compresslevel=9, mtime=0))


def build_deb(deb: Deb, out_dir: Path) -> Path:
    """The .deb, built with dpkg-deb from a staged tree (root-owned files, gzip: a fast build)."""
    out = out_dir / deb.filename()
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        root = Path(tmp) / "root"
        (root / "DEBIAN").mkdir(parents=True)
        for source, dest in deb.trees:
            shutil.copytree(source, root / dest, symlinks=True, dirs_exist_ok=True)
        for rel, content in deb.files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, str) and content.startswith("-> "):
                path.symlink_to(content[3:])
            else:
                path.write_bytes(content.encode() if isinstance(content, str) else content)
                path.chmod(0o644)
        # Root's files, read by all; executables run by all (a wheel's may be 0744); dated now (the
        # mirror's archives date theirs 1970, which lintian calls ancient).
        now = time.time()
        for dirpath, dirnames, filenames in os.walk(root):
            for d in dirnames:
                Path(dirpath, d).chmod(0o755)
            for f in filenames:
                path = Path(dirpath, f)
                if not path.is_symlink():
                    path.chmod(0o755 if path.stat().st_mode & 0o111 else 0o644)
            for name in [*dirnames, *filenames]:
                os.utime(Path(dirpath, name), (now, now), follow_symlinks=False)
        _docs(deb, root)
        (root / "DEBIAN/control").write_text(deb.control())
        conffiles = sorted("/" + p.relative_to(root).as_posix() for p in (root / "etc").rglob("*") if p.is_file())
        if conffiles:
            (root / "DEBIAN/conffiles").write_text("".join(f"{c}\n" for c in conffiles))
        if deb.triggers:
            (root / "DEBIAN/triggers").write_text("".join(f"{t}\n" for t in deb.triggers))
        for name, body in deb.scripts.items():
            script = root / "DEBIAN" / name
            script.write_text("#!/bin/sh\nset -e\n" + body)
            script.chmod(0o755)
        done = subprocess.run(  # noqa: S603 - fixed argv
            ["/usr/bin/dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(root), str(out)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SandboxError(f"dpkg-deb could not build {deb.filename()}: {done.stderr.strip()[-800:]}")
    return out


def _unpack(archive: Path, dest: Path) -> Path:
    """A redist archive's top folder, unpacked into dest."""
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="tar")
    [top] = [p for p in dest.iterdir() if p.is_dir()]
    return top


def _split(top: Path, lib_dir: Path, dev: Path, runtime: Path) -> None:
    """A component's lib/: the versioned libraries and their soname links to runtime, the dev links
    (libx.so) and static libraries to dev, as NVIDIA's packages split them."""
    for entry in sorted((top / "lib").iterdir()) if (top / "lib").is_dir() else []:
        dev_file = entry.name.endswith(".a") or entry.name.endswith(".so")
        target = (dev if dev_file else runtime) / lib_dir
        target.mkdir(parents=True, exist_ok=True)
        if entry.is_symlink():
            (target / entry.name).symlink_to(os.readlink(entry))
        else:
            shutil.copy2(entry, target / entry.name)


def toolkit_debs(release: str, manifest: dict[str, Any], redist: Path, work: Path) -> list[Deb]:
    """NVIDIA's packages of one toolkit release from its redist manifest: a runtime and a -dev
    package per library component (cuda-cudart-12-4, cuda-cudart-dev-12-4), cuda-nvcc-12-4, the
    config-common package of the release with its alternatives, and cuda-toolkit-12-4."""
    major, minor = release.split(".")[:2]
    xy, dash = f"{major}.{minor}", f"{major}-{minor}"
    prefix = f"usr/local/cuda-{xy}"
    common = [f"cuda-toolkit-{dash}-config-common", f"cuda-toolkit-{major}-config-common", "cuda-toolkit-config-common"]
    debs: list[Deb] = []
    members: list[str] = []
    for comp, short in COMPONENTS.items():
        entry = manifest.get(comp)
        if not entry:
            continue
        version = f"{entry['version']}-1"
        top = _unpack(redist / entry["linux-x86_64"]["relative_path"], work / f"{release}-{comp}")
        runtime, dev = work / f"{release}-{comp}.rt", work / f"{release}-{comp}.dev"
        if short == "nvcc":
            nvcc = Deb(
                f"cuda-nvcc-{dash}",
                version,
                depends=common,
                description=f"CUDA nvcc\n Locked at CUDA Toolkit version {xy}.",
            )
            for folder in ("bin", "nvvm"):
                if (top / folder).is_dir():
                    nvcc.trees.append((top / folder, f"{prefix}/{folder}"))
            if (top / "include").is_dir():
                nvcc.trees.append((top / "include", f"{prefix}/{TARGET}/include"))
            debs.append(nvcc)
            members.append(f"{nvcc.name} (>= {entry['version']})")
            continue
        _split(top, Path(f"{prefix}/{TARGET}/lib"), dev, runtime)
        rt = Deb(
            f"cuda-{short}-{dash}",
            version,
            triggers=[LDCONFIG_TRIGGER],
            depends=common,
            description=f"CUDA {short}\n Locked at CUDA Toolkit version {xy}.",
        )
        rt.trees.append((runtime, "."))
        rt.files[f"{prefix}/lib64"] = f"-> {TARGET}/lib"
        dv = Deb(
            f"cuda-{short}-dev-{dash}",
            version,
            depends=[f"{rt.name} (= {version})"],
            description=f"CUDA {short} development files",
        )
        if dev.exists():
            dv.trees.append((dev, "."))
        if (top / "include").is_dir():
            dv.trees.append((top / "include", f"{prefix}/{TARGET}/include"))
        dv.files[f"{prefix}/include"] = f"-> {TARGET}/include"
        dv.files[f"{prefix}/lib64"] = f"-> {TARGET}/lib"
        debs += [rt, dv]
        members += [f"{rt.name} (>= {entry['version']})", f"{dv.name} (>= {entry['version']})"]
    cudart = manifest["cuda_cudart"]["version"]
    priority = int(major) * 10 + int(minor)
    alternatives = Deb(
        f"cuda-toolkit-{dash}-config-common",
        f"{cudart}-1",
        arch="all",
        description=f"Common config package for CUDA Toolkit {xy}.",
        scripts={
            "postinst": (
                f'if [ "$1" = configure ]; then\n'
                f"  update-alternatives --install /usr/local/cuda cuda /usr/local/cuda-{xy} {priority}\n"
                f"  update-alternatives --install /usr/local/cuda-{major} cuda-{major} /usr/local/cuda-{xy} "
                f"{priority}\n"
                "fi\n"
            ),
            "prerm": (
                'if [ "$1" = remove ] || [ "$1" = deconfigure ]; then\n'
                f"  update-alternatives --remove cuda /usr/local/cuda-{xy}\n"
                f"  update-alternatives --remove cuda-{major} /usr/local/cuda-{xy}\n"
                "fi\n"
            ),
        },
    )
    meta = Deb(
        f"cuda-toolkit-{dash}",
        f"{release}-1",
        depends=[*members, f"{alternatives.name} (>= {cudart})"],
        description=f"CUDA Toolkit {xy} meta-package\n Meta-package containing the toolkit's packages.",
    )
    return [*debs, alternatives, meta, *release_metas(release, [d.name for d in debs if "-dev-" not in d.name])]


def release_metas(release: str, libraries: list[str]) -> list[Deb]:
    """cuda-libraries-X-Y (the runtime libraries), cuda-runtime-X-Y (those and the driver the
    release needs: cuda-drivers at its minimum version) and cuda-X-Y (the runtime and the toolkit),
    the recipe's name: on NVIDIA's repository it pulls the driver, as here."""
    major, minor = release.split(".")[:2]
    xy, dash, version = f"{major}.{minor}", f"{major}-{minor}", f"{release}-1"
    minimum = compat.load().toolkit_driver.get(release)
    if minimum is None:
        raise SandboxError(f"gpuenv/data/compat.yaml has no minimum driver for CUDA {release}: add it with its source")
    libs = [n for n in libraries if n != f"cuda-nvcc-{dash}"]
    return [
        Deb(
            f"cuda-libraries-{dash}",
            version,
            depends=[f"{n} (>= {release.rsplit('.', 1)[0]})" for n in libs],
            description=f"CUDA Libraries {xy} meta-package\n The runtime libraries of CUDA {xy}.",
        ),
        Deb(
            f"cuda-runtime-{dash}",
            version,
            depends=[f"cuda-libraries-{dash} (>= {release})", f"cuda-drivers (>= {minimum})"],
            description=f"CUDA Runtime {xy} meta-package\n The libraries and the driver CUDA {xy} needs.",
        ),
        Deb(
            f"cuda-{dash}",
            version,
            depends=[f"cuda-runtime-{dash} (>= {release})", f"cuda-toolkit-{dash} (>= {release})"],
            description=f"CUDA {xy} meta-package\n The toolkit, the runtime and the driver.",
        ),
    ]


def driver_meta_debs(version: str, present: set[str]) -> list[Deb]:
    """NVIDIA's driver metapackages over the re-versioned driver: cuda-drivers-<branch> (the
    proprietary modules and the user space), cuda-drivers (the newest branch), and nvidia-open-<branch>
    and nvidia-open where the open modules are there at the driver's version."""
    branch = version.split(".", maxsplit=1)[0]
    # As NVIDIA's: a lower bound on the branch's packages (cuda-drivers-580: nvidia-driver (>= ...)).
    userspace = [f"{n} (>= {version})" for n in ("nvidia-driver", "libcuda1", "nvidia-smi") if n in present]
    flavors = [("cuda-drivers", "nvidia-kernel-dkms", "CUDA Driver meta-package", "proprietary modules")]
    if "nvidia-kernel-open-dkms" in present:
        flavors.append(("nvidia-open", "nvidia-kernel-open-dkms", "NVIDIA driver metapackage", "open modules"))
    debs = []
    for meta, modules, title, which in flavors:
        debs += [
            Deb(
                f"{meta}-{branch}",
                version,
                depends=[*userspace, f"{modules} (>= {version})"],
                description=f"{title}, branch-specific\n The {branch} driver, {which}.",
            ),
            Deb(
                meta,
                version,
                depends=[f"{meta}-{branch} (= {version})"],
                description=f"{title}, branch-agnostic\n The newest driver branch, {which}.",
            ),
        ]
    return debs


def config_debs(releases: dict[str, dict[str, Any]]) -> list[Deb]:
    """cuda-toolkit-config-common (000_cuda.conf) and one cuda-toolkit-X-config-common per major
    (988_cuda-X.conf), each at the newest cudart version of what it serves."""
    ldconfig = {
        "postinst": 'if [ "$1" = configure ]; then ldconfig; fi\n',
        "postrm": 'if [ "$1" = remove ]; then ldconfig; fi\n',
    }
    newest = max(releases, key=lambda r: [int(p) for p in r.split(".")])
    debs = [
        Deb(
            "cuda-toolkit-config-common",
            f"{releases[newest]['cuda_cudart']['version']}-1",
            arch="all",
            description="Common config package for CUDA Toolkit.",
            files={"etc/ld.so.conf.d/000_cuda.conf": f"/usr/local/cuda/{TARGET}/lib\n"},
            scripts=dict(ldconfig),
        )
    ]
    for major in sorted({r.split(".")[0] for r in releases}):
        top = max((r for r in releases if r.split(".")[0] == major), key=lambda r: [int(p) for p in r.split(".")])
        debs.append(
            Deb(
                f"cuda-toolkit-{major}-config-common",
                f"{releases[top]['cuda_cudart']['version']}-1",
                arch="all",
                description=f"Common config package for CUDA Toolkit {major}.",
                files={f"etc/ld.so.conf.d/988_cuda-{major}.conf": f"/usr/local/cuda-{major}/{TARGET}/lib\n"},
                scripts=dict(ldconfig),
            )
        )
    return debs


def cudnn_debs(manifest: dict[str, Any], redist: Path, work: Path) -> list[Deb]:
    """NVIDIA's cuDNN packages of one release, per CUDA major it is built for: cuDNN 9 as
    libcudnn9-cuda-12, libcudnn9-dev-cuda-12 and cudnn9-cuda-12 (version 9.1.0.70-1); cuDNN 8 as
    libcudnn8 and libcudnn8-dev (8.6.0.163-1+cuda11.8). Libraries in /usr/lib/x86_64-linux-gnu,
    headers as cudnn*_vN.h in /usr/include/x86_64-linux-gnu; the -dev package registers the libcudnn
    alternative (/usr/include/cudnn.h and the library's dev link)."""
    entry = manifest["cudnn"]
    version = entry["version"]
    cudnn_major = versions.CudnnVersion(version).major
    debs: list[Deb] = []
    for variant, archive in entry["linux-x86_64"].items():
        cuda_major = variant.removeprefix("cuda")
        top = _unpack(redist / archive["relative_path"], work / f"cudnn-{version}-{variant}")
        runtime, dev = work / f"cudnn-{version}-{variant}.rt", work / f"cudnn-{version}-{variant}.dev"
        _split(top, Path(LIBDIR), dev, runtime)
        # The tarball has each header twice (cudnn_adv.h and cudnn_adv_v9.h, the same text); NVIDIA's
        # package ships the _vN names, and the alternative gives the plain ones.
        suffix = f"_v{cudnn_major}"
        bases = sorted({h.stem.removesuffix(suffix) for h in (top / "include").glob("*.h")})
        headers = {}
        for base in bases:
            source = top / "include" / f"{base}{suffix}.h"
            headers[f"{INCDIR}/{base}{suffix}.h"] = (
                source if source.exists() else top / "include" / f"{base}.h"
            ).read_bytes()
        if cudnn_major == "8":
            cuda_xy = {"11": "11.8", "12": "12.2"}.get(cuda_major, f"{cuda_major}.0")
            full = f"{version}-1+cuda{cuda_xy}"
            rt_name, dev_name, meta_name = "libcudnn8", "libcudnn8-dev", None
        else:
            full = f"{version}-1"
            rt_name, dev_name, meta_name = (
                f"libcudnn{cudnn_major}-cuda-{cuda_major}",
                f"libcudnn{cudnn_major}-dev-cuda-{cuda_major}",
                f"cudnn{cudnn_major}-cuda-{cuda_major}",
            )
        rt = Deb(rt_name, full, description="cuDNN runtime libraries", triggers=[LDCONFIG_TRIGGER])
        rt.trees.append((runtime, "."))
        dv = Deb(
            dev_name, full, depends=[f"{rt_name} (= {full})"], description="cuDNN development libraries and headers"
        )
        # The dev links (libcudnn.so, ...) are the alternative's slaves, to the soname link, as in
        # NVIDIA's packages: not files of the package.
        dev_links = {}
        if dev.exists():
            for link in sorted((dev / LIBDIR).glob("libcudnn*.so")):
                dev_links[link.name] = os.readlink(link)
                link.unlink()
            dv.trees.append((dev, "."))
        dv.files.update(headers)
        slaves = [f"--slave /usr/include/{b}.h {b}_h /{INCDIR}/{b}{suffix}.h" for b in bases if b != "cudnn"]
        slaves += [
            f"--slave /{LIBDIR}/{name} {name.removesuffix('.so')}_so /{LIBDIR}/{target}"
            for name, target in sorted(dev_links.items())
        ]
        priority = int(cudnn_major) * 10
        dv.scripts = {
            "postinst": (
                'if [ "$1" = configure ]; then\n'
                "  update-alternatives --install /usr/include/cudnn.h libcudnn "
                f"/{INCDIR}/cudnn_v{cudnn_major}.h {priority}" + "".join(f" \\\n    {slave}" for slave in slaves) + "\n"
                "fi\n"
            ),
            "prerm": (
                'if [ "$1" = remove ] || [ "$1" = deconfigure ]; then\n'
                f"  update-alternatives --remove libcudnn /{INCDIR}/cudnn_v{cudnn_major}.h\n"
                "fi\n"
            ),
        }
        debs += [rt, dv]
        if meta_name:
            debs.append(
                Deb(
                    meta_name,
                    full,
                    depends=[f"{rt_name} (= {full})", f"{dev_name} (= {full})"],
                    description=f"cuDNN {cudnn_major} for CUDA {cuda_major}",
                )
            )
    return debs


def keyring_deb(public_key: bytes, distro: str) -> Deb:
    """cuda-keyring_1.1-1_all.deb: the key as NVIDIA's package installs theirs, and its sources line
    (naming NVIDIA's URL, as theirs does: the roles write their own sources with the site's URL)."""
    url = f"https://developer.download.nvidia.com/compute/cuda/repos/{distro}/{ARCH}/"
    return Deb(
        "cuda-keyring",
        "1.1-1",
        arch="all",
        description="GPG keyring for the CUDA repository",
        files={
            KEYRING.lstrip("/"): public_key,
            f"etc/apt/sources.list.d/cuda-{distro}-{ARCH}.list": f"deb [signed-by={KEYRING}] {url} /\n",
        },
    )


# --- the index and its signature -----------------------------------------------------------------
def _fields(deb: Path) -> str:
    done = subprocess.run(["/usr/bin/dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True)  # noqa: S603
    return done.stdout.rstrip("\n")


def packages_index(repo: Path) -> bytes:
    """NVIDIA's flat Packages: each deb's control, with Filename ./<file>, Size and its sums."""
    stanzas = []
    for deb in sorted(repo.glob("*.deb")):
        data = deb.read_bytes()
        stanzas.append(
            _fields(deb)
            + f"\nFilename: ./{deb.name}\nSize: {len(data)}\nMD5sum: {_digest(data, 'md5')}\n"
            + f"SHA1: {_digest(data, 'sha1')}\nSHA256: {_digest(data, 'sha256')}\n"
        )
    return "\n".join(stanzas).encode()


def release(files: dict[str, bytes]) -> str:
    """The flat repository's Release (the fields of NVIDIA's: no Suite, Codename or Components)."""
    lines = ["Origin: NVIDIA", "Label: NVIDIA CUDA", f"Architecture: {ARCH}", f"Date: {formatdate(usegmt=True)}"]
    for title, algo in (("MD5Sum", "md5"), ("SHA1", "sha1"), ("SHA256", "sha256")):
        lines.append(f"{title}:")
        lines += [f" {_digest(data, algo)} {len(data):>16} {name}" for name, data in sorted(files.items())]
    lines.append("Acquire-By-Hash: no")
    return "\n".join(lines) + "\n"


class Signer:
    """The sandbox's repository key, in a GnuPG home of its own (made once, kept)."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def _gpg(self, *args: str, data: bytes | None = None) -> bytes:
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        done = subprocess.run(  # noqa: S603 - fixed argv
            ["/usr/bin/gpg", "--batch", "--quiet", "--homedir", str(self.home), *args],
            input=data,
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            raise SandboxError(f"gpg {args[0]} failed: {done.stderr.decode(errors='replace').strip()[-600:]}")
        return done.stdout

    def ensure(self) -> None:
        if not self._gpg("--list-secret-keys", "--with-colons").strip():
            log("making the sandbox CUDA repository's signing key")
            self._gpg(
                "--passphrase",
                "",
                "--quick-gen-key",
                "gpuenv sandbox CUDA repository <cuda@gpuenv.invalid>",
                "rsa3072",
                "sign",
                "never",
            )

    def public(self) -> bytes:
        return self._gpg("--export")

    def clearsign(self, text: bytes) -> bytes:
        return self._gpg("--digest-algo", "SHA256", "--clearsign", data=text)

    def detach(self, text: bytes) -> bytes:
        return self._gpg("--digest-algo", "SHA256", "--armor", "--detach-sign", data=text)


def write_index(repo: Path, signer: Signer) -> None:
    packages = packages_index(repo)
    files = {"Packages": packages, "Packages.gz": gzip.compress(packages, mtime=0)}
    for name, data in files.items():
        (repo / name).write_bytes(data)
    text = release(files).encode()
    (repo / "Release").write_bytes(text)
    (repo / "Release.gpg").write_bytes(signer.detach(text))
    (repo / "InRelease").write_bytes(signer.clearsign(text))


# --- the whole repository --------------------------------------------------------------------
def _inputs(site: Path) -> dict[str, str]:
    manifests = sorted((site / "compute/cuda/redist").glob("redistrib_*.json")) + sorted(
        (site / "compute/cudnn/redist").glob("redistrib_*.json")
    )
    code = hashlib.sha256(b"".join(Path(str(m.__file__)).read_bytes() for m in (aptdriver, sys.modules[__name__])))
    return {"code": code.hexdigest(), **{m.name: hashlib.sha256(m.read_bytes()).hexdigest() for m in manifests}}


def default_key_home(site: Path) -> Path:
    """The signing key's GnuPG home, kept beside the mirror's site (not served)."""
    return site.parent / "repo-key"


def default_downloads(site: Path) -> Path:
    """Debian's driver packages, as downloaded (kept beside the mirror's site, not served)."""
    return site.parent / "debian-debs"


def build(site: Path, key_home: Path, debian_roots: dict[str, Path], downloads: Path | None = None) -> list[Path]:
    """Build (or keep) the repository for each distro under site/compute/cuda/repos; returns the
    repository directories. The mirror (site/compute/*/redist) must be built first; debian_roots
    names, per distro, the Debian root whose apt lists say which driver Debian has (its packages
    are fetched from Debian's archive into downloads)."""
    cuda_redist, cudnn_redist = site / "compute/cuda/redist", site / "compute/cudnn/redist"
    if not any(cuda_redist.glob("redistrib_*.json")):
        raise SandboxError(
            f"no redist manifests under {cuda_redist}: build the mirror first (scripts/sandbox mirror build)"
        )
    downloads = downloads or default_downloads(site)
    drivers = {d: aptdriver.driver_closure(aptdriver.debian_index(debian_roots[d])) for d in DISTROS}
    common = _inputs(site)
    inputs = {
        d: {**common, "driver": {p.fields["Filename"]: p.fields["SHA256"] for p in drivers[d][1]}} for d in DISTROS
    }
    repos = {d: site / "compute/cuda/repos" / d / ARCH for d in DISTROS}
    if all((r / STAMP).exists() and json.loads((r / STAMP).read_text()) == inputs[d] for d, r in repos.items()):
        return list(repos.values())
    signer = Signer(key_home)
    signer.ensure()
    releases = {
        json.loads(m.read_text())["release_label"]: json.loads(m.read_text())
        for m in sorted(cuda_redist.glob("redistrib_*.json"))
    }
    with tempfile.TemporaryDirectory(dir=site) as tmp:
        work, built = Path(tmp) / "work", Path(tmp) / "debs"
        work.mkdir()
        built.mkdir()
        # Each release's archives are unpacked (xz) and each package compressed (dpkg-deb) in a
        # process of its own: one per core at a time.
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            staged = [pool.submit(toolkit_debs, rel, manifest, cuda_redist, work) for rel, manifest in releases.items()]
            staged += [
                pool.submit(cudnn_debs, json.loads(m.read_text()), cudnn_redist, work)
                for m in sorted(cudnn_redist.glob("redistrib_*.json"))
            ]
            debs: list[Deb] = config_debs(releases) + [deb for job in staged for deb in job.result()]
            log(f"building {len(debs)} packages of the sandbox CUDA repository")
            files = list(pool.map(lambda deb: build_deb(deb, built), debs))
        for distro, repo in repos.items():
            shutil.rmtree(repo, ignore_errors=True)
            repo.mkdir(parents=True)
            for f in files:
                os.link(f, repo / f.name)
            debian_version, packages = drivers[distro]
            version = aptdriver.nvidia_version(debian_version)
            log(f"{distro}: Debian's driver {debian_version} as NVIDIA's {version} ({len(packages)} packages)")
            for original in aptdriver.fetch(packages, downloads):
                aptdriver.reversion(original, debian_version, version, repo)
            for meta in driver_meta_debs(version, {aptdriver.RENAMES.get(p.name, p.name) for p in packages}):
                build_deb(meta, repo)
            build_deb(keyring_deb(signer.public(), distro), repo)
            write_index(repo, signer)
            (repo / STAMP).write_text(json.dumps(inputs[distro], indent=2) + "\n")
    return list(repos.values())
