"""Pure helpers for the cuda_toolkit and cudnn roles: read NVIDIA's redist manifests
(`redistrib_<version>.json`), name the archives a tree needs, and read the versions a tree
reports. Tested in tests/test_redist.py on the mirror's manifests and saved output."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

PLATFORM = "linux-x86_64"


class RedistError(ValueError):
    """A manifest that cannot give what was asked; the message says what it has."""


# A sha256 as NVIDIA's manifests give it; it names a directory, so nothing else passes.
SHA256 = re.compile(r"[0-9a-f]{64}")
# A path the roles may join to a mirror's URL, the controller's cache and a host's download
# directory: relative, no "." or ".." component, no empty component, no backslash or control
# character. A manifest is data from the network; its paths must not name where files are written.
_PLAIN_PART = re.compile(r"^[A-Za-z0-9_+~@=-][A-Za-z0-9._+~@=-]*$")


def plain_relative_path(path: object) -> bool:
    if not isinstance(path, str) or not path or path.startswith("/"):
        return False
    return all(_PLAIN_PART.fullmatch(part) and part not in (".", "..") for part in path.split("/"))


def archives(
    manifest: dict[str, Any] | str,
    components: list[str],
    *,
    platform: str = PLATFORM,
    variant: str | None = None,
) -> list[dict[str, str]]:
    """The archive of each component, in the order asked, as {component, version, relative_path,
    sha256, size}. `variant` picks the per-CUDA-major entry of cuDNN manifests ("cuda12")."""
    data: dict[str, Any] = json.loads(manifest) if isinstance(manifest, str) else manifest
    label = data.get("release_label", "?")
    offered = sorted(k for k, v in data.items() if isinstance(v, dict) and platform in v)
    missing = [c for c in components if c not in offered]
    if missing:
        raise RedistError(
            f"redistrib_{label}.json has no {', '.join(missing)} for {platform}; "
            f"it offers: {', '.join(offered) or 'nothing'}"
        )
    found = []
    for comp in components:
        entry = data[comp][platform]
        if variant is not None:
            if variant not in entry:
                raise RedistError(
                    f"redistrib_{label}.json has {comp} {data[comp].get('version')} for "
                    f"{', '.join(sorted(entry))} only, not {variant}"
                )
            entry = entry[variant]
        if "relative_path" not in entry or "sha256" not in entry:
            raise RedistError(f"redistrib_{label}.json: {comp} for {platform} lacks relative_path or sha256")
        if not plain_relative_path(entry["relative_path"]):
            raise RedistError(
                f"redistrib_{label}.json: {comp}'s relative_path {str(entry['relative_path'])[:120]!r} is not a plain "
                "relative path under the mirror (no leading '/', no '..', no empty part); the manifest is refused, "
                "since its paths name where files are written"
            )
        if not isinstance(entry["sha256"], str) or not SHA256.fullmatch(entry["sha256"]):
            raise RedistError(
                f"redistrib_{label}.json: {comp}'s sha256 {str(entry['sha256'])[:80]!r} is not 64 lowercase hex "
                "digits; the manifest is refused, since a sha256 names where files are kept"
            )
        found.append(
            {
                "component": comp,
                "version": str(data[comp]["version"]),
                "relative_path": entry["relative_path"],
                "sha256": entry["sha256"],
                "size": str(entry.get("size", "")),
                "file": entry["relative_path"].rsplit("/", 1)[-1],
            }
        )
    return found


def tree_id(found: list[dict[str, str]]) -> str:
    """A short id of exactly these archives: a tree built from other bytes gets another id."""
    h = hashlib.sha256()
    for a in sorted(found, key=lambda a: a["component"]):
        h.update(f"{a['component']}={a['sha256']}\n".encode())
    return h.hexdigest()[:12]


def debian_toolkit_release(debian_version: str) -> str | None:
    """12.4.1 from Debian's nvidia-cuda-toolkit version 12.4.131~12.4.1-2 (11.8.0 from
    11.8.89~11.8.0-5~deb12u1): the toolkit release after the '~'."""
    match = re.match(r"^(?:[0-9]+:)?[0-9.]+~([0-9]+\.[0-9]+\.[0-9]+)-", debian_version)
    return match.group(1) if match else None


_MISMATCH = re.compile(r"did not match (?P<expected>[0-9a-f]{64}); it was (?P<actual>[0-9a-f]{64})")


def fetch_failures(results: list[dict[str, Any]], base_url: str) -> list[str]:
    """One line per failed download of a loop over archives (get_url results, each with its
    archive as `item`): which file, from where, and either both sums or the download error."""
    lines = []
    for result in results:
        if not result.get("failed"):
            continue
        archive = result.get("item") or {}
        name = archive.get("file", "?")
        url = archive.get("url") or f"{base_url.rstrip('/')}/{archive.get('relative_path', name)}"
        msg = str(result.get("msg", ""))
        match = _MISMATCH.search(msg)
        if match:
            lines.append(f"{name} from {url}: sha256 is {match['actual']}, expected {match['expected']}")
        else:
            lines.append(f"{name} from {url}: could not be downloaded ({msg.strip() or 'no reason given'})")
    return lines
