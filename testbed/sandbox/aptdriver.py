"""The driver of the sandbox's CUDA apt repository: Debian's own driver packages (real binaries,
from the Debian release the repository serves), re-versioned as NVIDIA versions its packages
(Debian's 535.309.01-0+deb12u1 becomes 535.309.01-1, a version Debian does not have), every
relation between them rewritten to the new version, Debian's open-module package under NVIDIA's
name, and NVIDIA's metapackages (cuda-drivers, cuda-drivers-<branch>, nvidia-open) made beside them.

Only the control member of each package changes: its data member (the binaries, byte for byte) is
copied into the new .deb as it was. What goes in is the install closure (Depends, Pre-Depends,
Recommends) of the driver's packages, restricted to the driver's own version: the packages Debian
builds from other sources at other versions (nvidia-persistenced, nvidia-modprobe, nvidia-support)
stay Debian's, and a host takes them from Debian's archive as a host on NVIDIA's repository does.
"""

from __future__ import annotations

import io
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

from gpuenv.module_utils.gpuenv_hostparse import package_key, parse_deb822
from testbed.sandbox import channel
from testbed.sandbox.util import SandboxError

# Where a host's apt installation of the driver starts (NVIDIA's metapackages depend on these).
DRIVER_ROOTS = ("nvidia-driver", "nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "nvidia-open-kernel-dkms")
# Debian's name -> NVIDIA's, for the packages NVIDIA names differently.
RENAMES = {"nvidia-open-kernel-dkms": "nvidia-kernel-open-dkms"}
# The control fields that name other packages.
RELATIONS = (
    *("Depends", "Pre-Depends", "Recommends", "Suggests", "Enhances"),
    *("Breaks", "Conflicts", "Replaces", "Provides"),
)
DEBIAN_ARCHIVE = "http://deb.debian.org/"


@dataclass(frozen=True)
class Package:
    """One package of Debian's index: its stanza and the list it came from."""

    fields: dict[str, str]
    archive_root: str  # the URL the index's Filename is relative to

    @property
    def name(self) -> str:
        return self.fields["Package"]

    @property
    def version(self) -> str:
        return self.fields["Version"]

    def url(self) -> str:
        return self.archive_root + self.fields["Filename"]


def debian_index(root: Path) -> dict[str, list[Package]]:
    """Every amd64 package the Debian root's apt lists name, by package name. The lists are apt's
    own copies (deb.debian.org_debian_dists_bookworm_non-free_binary-amd64_Packages); the archive a
    list belongs to (debian or debian-security) is in its name."""
    # The driver is in non-free (and non-free-firmware, contrib): main's lists, the largest, are not read.
    lists = sorted(
        path
        for component in ("non-free", "non-free-firmware", "contrib")
        for path in (root / "var/lib/apt/lists").glob(f"*_{component}_binary-amd64_Packages")
    )
    if not lists:
        raise SandboxError(
            f"{root} has no apt lists: its root was built without them; remove it and run scripts/sandbox roots"
        )
    index: dict[str, list[Package]] = {}
    for path in lists:
        host, _, rest = path.name.partition("_")
        archive = rest.split("_dists_")[0]
        base = f"http://{host}/{archive}/"
        for fields in parse_deb822(path.read_text(errors="replace")):
            if "Package" in fields and "Filename" in fields:
                index.setdefault(fields["Package"], []).append(Package(fields, base))
    return index


def _names(relation_field: str) -> list[str]:
    """The package names of a relation field ("a (>= 1) | b, c:any" -> a, b, c)."""
    names = []
    for clause in relation_field.split(","):
        for alternative in clause.split("|"):
            name = alternative.strip().split(" ")[0].split(":")[0]
            if name:
                names.append(name)
    return names


def driver_closure(index: dict[str, list[Package]]) -> tuple[str, list[Package]]:
    """The driver's Debian version (the newest nvidia-driver the index offers) and the install
    closure of DRIVER_ROOTS at that version. A root Debian builds at another version (bookworm's
    open modules trail its driver) is left out, as is every package it alone would pull."""
    offered = index.get("nvidia-driver", [])
    if not offered:
        raise SandboxError("Debian's index offers no nvidia-driver: the root's sources lack non-free")
    version = max(offered, key=lambda p: package_key(p.version)).version
    at_version = [p for offered in index.values() for p in offered if p.version == version]
    # A virtual name (nvidia-kernel-support--v1) reaches the packages that provide it.
    providers: dict[str, list[Package]] = {}
    for package in at_version:
        for name in {package.name, *_names(package.fields.get("Provides", ""))}:
            providers.setdefault(name, []).append(package)
    chosen: dict[str, Package] = {}
    seen: set[str] = set()
    todo = list(DRIVER_ROOTS)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for package in providers.get(name, []):
            if package.name not in chosen:
                chosen[package.name] = package
                for field in ("Depends", "Pre-Depends", "Recommends"):
                    todo += _names(package.fields.get(field, ""))
    return version, [chosen[n] for n in sorted(chosen)]


def nvidia_version(debian_version: str) -> str:
    """NVIDIA's version of a Debian driver version: the upstream version, revision 1."""
    return debian_version.rsplit(":", maxsplit=1)[-1].rsplit("-", 1)[0] + "-1"


def _rename(text: str) -> str:
    for old, new in RENAMES.items():
        text = re.sub(rf"(?<![a-z0-9.+-]){re.escape(old)}(?![a-z0-9.+-])", new, text)
    return text


def rewrite_control(control: str, old: str, new: str) -> str:
    """A control file re-versioned: Version, the Source's version, and every relation that names
    the old version (an exact pin or a bound) now naming the new one; NVIDIA's names for renamed
    packages (with a Provides, Conflicts and Replaces of Debian's name, so that either name resolves)."""
    out = []
    stanza = parse_deb822(control)[0]
    renamed_from = stanza["Package"] if stanza["Package"] in RENAMES else None
    for key, text in stanza.items():
        value = text
        if key == "Version":
            value = new
        elif key == "Source":
            value = text.replace(f"({old})", f"({new})")
        elif key in RELATIONS:
            value = _rename(text.replace(old, new))
        elif key == "Package":
            value = RENAMES.get(text, text)
        out.append(f"{key}: {value}".replace("\n", "\n "))
    if renamed_from:
        for key in ("Provides", "Conflicts", "Replaces"):
            extra = renamed_from if key != "Provides" else f"{renamed_from} (= {new})"
            line = next((i for i, s in enumerate(out) if s.startswith(f"{key}: ")), None)
            if line is None:
                out.append(f"{key}: {extra}")
            else:
                out[line] += f", {extra}"
    return "\n".join(out) + "\n"


# --- the .deb as an ar archive ------------------------------------------------------------------
def _ar_read(data: bytes) -> list[tuple[str, bytes]]:
    if not data.startswith(b"!<arch>\n"):
        raise SandboxError("not a Debian package (no ar header)")
    members, pos = [], 8
    while pos < len(data):
        header = data[pos : pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        members.append((name, data[pos + 60 : pos + 60 + size]))
        pos += 60 + size + (size % 2)
    return members


def _ar_write(members: list[tuple[str, bytes]]) -> bytes:
    out = [b"!<arch>\n"]
    for name, body in members:
        out.append(f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(body):<10}`\n".encode())
        out.append(body + (b"\n" if len(body) % 2 else b""))
    return b"".join(out)


def _tar_writer(out: io.BytesIO, name: str) -> tarfile.TarFile:
    """A tarball written in the compression its member name says (dpkg-deb writes xz, gz or none)."""
    if name == "control.tar.xz":
        return tarfile.open(fileobj=out, mode="w:xz", format=tarfile.GNU_FORMAT)
    if name == "control.tar.gz":
        return tarfile.open(fileobj=out, mode="w:gz", format=tarfile.GNU_FORMAT)
    if name == "control.tar":
        return tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT)
    raise SandboxError(f"a control member dpkg-deb did not write: {name}")


def _control_text(member: bytes) -> str:
    with tarfile.open(fileobj=io.BytesIO(member), mode="r:*") as tar:
        for info in tar.getmembers():
            body = tar.extractfile(info) if info.isfile() and info.name.lstrip("./") == "control" else None
            if body is not None:
                return body.read().decode()
    raise SandboxError("a package without a control file")


def _control_member(member: bytes, name: str, old: str, new: str) -> bytes:
    """The control tarball with its control file rewritten; every other entry (md5sums, the
    maintainer scripts) as it was, in the same compression."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(member), mode="r:*") as src, _tar_writer(out, name) as dst:
        for info in src.getmembers():
            body = src.extractfile(info) if info.isfile() else None
            if body is None:
                dst.addfile(info)
                continue
            data = body.read()
            if info.name.lstrip("./") == "control":
                data = rewrite_control(data.decode(), old, new).encode()
                info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    return out.getvalue()


def reversion(deb: Path, old: str, new: str, out_dir: Path) -> Path:
    """deb with its control re-versioned (rewrite_control), written to out_dir under its new name;
    the data member copied as it was."""
    members = _ar_read(deb.read_bytes())
    rebuilt = [(n, _control_member(b, n, old, new) if n.startswith("control.tar") else b) for n, b in members]
    control = next(_control_text(b) for n, b in rebuilt if n.startswith("control.tar"))
    stanza = parse_deb822(control)[0]
    target = out_dir / f"{stanza['Package']}_{stanza['Version']}_{stanza['Architecture']}.deb"
    target.write_bytes(_ar_write(rebuilt))
    return target


def fetch(packages: list[Package], downloads: Path) -> list[Path]:
    """Debian's files of packages, checked against the index's sha256 (kept in downloads)."""
    paths = []
    for package in packages:
        url = package.url()
        if not url.startswith(DEBIAN_ARCHIVE):
            raise SandboxError(f"{url}: the driver's packages come from Debian's archive only")
        paths.append(
            channel.fetch(
                {"file": Path(package.fields["Filename"]).name, "sha256": package.fields["SHA256"], "url": url},
                downloads,
            )
        )
    return paths
