"""The controller's caches of what one host of a fleet built and the others take instead of building
(gpuenv_dkms_cache: the driver's DKMS module; gpuenv_env_cache: the PyTorch environment;
gpuenv_cudnn_cache: cuDNN's unpacked tarball).

An entry is a file `<key><ext>` and its record `<key>.json`, the record fetched last: it is what
makes an entry, and holds the file's sha256. A key is a digest of everything the built artifact
depends on, so that any difference is another entry. The plan, read on the controller once for a
play, gives each key to one host to build; the other hosts with that key wait for it, and a host
whose key has an entry restores it. An entry whose file is missing or whose sha256 is not the
recorded one is refused, and its host builds it again and replaces it.

Python 3.8 compatible: the host side runs on the hosts' own Python.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from typing import IO, Any

from ansible.module_utils.gpuenv_cudnn_files import sha256_of
from ansible.module_utils.gpuenv_hostparse import parse_os_release

# A tar compressed with zstd: about half the bytes to copy and keep, and unpacked faster than it is
# copied. The roles install zstd where their cache is on.
EXT = ".tar.zst"
ZSTD_PACK = "zstd -T0 -3"
CHUNK = 1 << 20
# The directory an unpack works in, beside where the result goes (the same filesystem: moved, not
# copied).
RESTORE_PREFIX = ".gpuenv-restore-"


def digest_key(fields: dict[str, Any], names: tuple[str, ...]) -> str:
    """An entry's name: a digest of the named fields, every one required."""
    missing = [f for f in names if f not in fields]
    if missing:
        raise ValueError(f"cache key without {', '.join(missing)}")
    text = json.dumps({f: str(fields[f]) for f in names}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def os_release_id(text: str) -> str:
    """The OS release ("debian 13") from /etc/os-release: the release whose compiler, DKMS and libraries
    a build used."""
    values = parse_os_release(text)
    return f"{values.get('ID', 'unknown')} {values.get('VERSION_ID', '')}".strip()


def host_os_release(path: str) -> str:
    """The host's OS release ("debian 13") from its os-release file; "unknown" where it cannot be read."""
    try:
        with open(path, errors="replace") as handle:
            return os_release_id(handle.read())
    except OSError:
        return os_release_id("")


def read_entry(cache_dir: str, key: str, ext: str) -> dict[str, Any]:
    """One entry as the plan sees it: {"state": "hit", "entry": ...} (its record, with "file" where it
    lies), {"state": "miss"}, or {"state": "refused", "why": ...} for one that is damaged or does not
    describe its file."""
    meta_path = os.path.join(cache_dir, key + ".json")
    file_path = os.path.join(cache_dir, key + ext)
    if not os.path.exists(meta_path):
        return {"state": "miss"}
    try:
        with open(meta_path) as handle:
            entry = json.load(handle)
        recorded = str(entry["sha256"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return {"state": "refused", "why": f"its record {meta_path} cannot be read ({err})"}
    if entry.get("key") != key:
        return {"state": "refused", "why": f"its record {meta_path} is for another key ({entry.get('key')})"}
    if not os.path.exists(file_path):
        return {"state": "refused", "why": f"{file_path} is missing"}
    actual = sha256_of(file_path)
    if actual != recorded:
        return {"state": "refused", "why": f"{file_path} has sha256 {actual}, not the {recorded} the cache recorded"}
    entry["file"] = file_path
    return {"state": "hit", "entry": entry}


def plan(cache_dir: str, hosts: list[dict[str, Any]], ext: str, what: str, wait: bool = True) -> dict[str, Any]:
    """For each host (in play order, each with its "items": a "key" and the "name" the messages give
    it): the entries it restores, the items it builds, and (wait) the earlier host it waits for when
    every item it lacks is being built by one. An entry that fails its check counts as missing, and
    says why in the host's notes; the host that reads it first replaces it ("refused"). `what` names
    the artifact in those notes ("module", "environment")."""
    seen: dict[str, dict[str, Any]] = {}
    building: dict[str, str] = {}  # key -> the host that builds it
    out: dict[str, dict[str, Any]] = {}
    for host in hosts:
        name = str(host["host"])
        restore: list[dict[str, Any]] = []
        build: list[dict[str, Any]] = []
        notes: list[str] = []
        refused: list[str] = []
        for item in host.get("items") or []:
            key = str(item["key"])
            if key not in seen:
                seen[key] = read_entry(cache_dir, key, ext)
                if seen[key]["state"] == "refused":
                    refused.append(key)
                    notes.append(
                        f"the cached {what} for {item['name']} (entry {key}) is refused: {seen[key]['why']};"
                        " this host builds it and replaces the entry"
                    )
            state = seen[key]
            if state["state"] == "hit":
                restore.append({"item": item, "entry": state["entry"]})
            else:
                build.append(item)
        waits = [building[b["key"]] for b in build if b["key"] in building]
        wait_for = waits[0] if wait and build and len(waits) == len(build) else None
        # A host that cannot hand its build over ("exports": false) builds for itself alone.
        if wait_for is None and host.get("exports", True):
            for item in build:
                building.setdefault(str(item["key"]), name)
        out[name] = {
            "restore": restore,
            "build": [] if wait_for else build,
            "wait": build if wait_for else [],
            "wait_for": wait_for,
            "notes": notes,
            # The entries this host replaces: the first host with a refused key builds it, when it
            # can hand its build over.
            "refused": refused if host.get("exports", True) else [],
        }
    return {"hosts": out}


def host_actions(planned: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each host's part of a plan whose hosts ask for one item each: its "action" ("restore" the
    "entry", "wait" for "wait_for", or "build"), whether hosts wait for its build ("awaited"), its
    "notes", and whether its build replaces a refused entry ("replaces")."""
    waited_for = {mine["wait_for"] for mine in planned["hosts"].values() if mine["wait_for"]}
    out = {}
    for name, mine in planned["hosts"].items():
        restore = mine["restore"][0]["entry"] if mine["restore"] else None
        out[name] = {
            "action": "restore" if restore else "wait" if mine["wait"] else "build",
            "entry": restore,
            "wait_for": mine["wait_for"],
            "awaited": name in waited_for,
            "notes": mine["notes"],
            "replaces": bool(mine["refused"]),
        }
    return out


def escalated_user() -> str:
    """The user Ansible reached this host as, where it escalated through sudo or doas; "" otherwise.
    Through them Ansible's fetch reads a file whole into memory (its slurp module): a tar of
    gigabytes cannot be handed over that way."""
    return os.environ.get("SUDO_USER") or os.environ.get("DOAS_USER") or ""


def relative(root: str, path: str) -> str:
    rel = os.path.relpath(path, root)
    if rel.startswith("..") or os.path.isabs(rel):
        raise ValueError(f"{path} is not under {root}")
    return rel


class Hashing:
    """A file written (or read) through sha256."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self.size = 0

    def pump(self, src: IO[bytes], dest: IO[bytes]) -> None:
        """Copy src to dest through the digest; when dest stops taking it (tar exited), the rest of
        src is still read into the digest, so that a damaged copy is told by its sha256."""
        writing = True
        while True:
            block = src.read(CHUNK)
            if not block:
                return
            self.digest.update(block)
            self.size += len(block)
            if writing:
                try:
                    dest.write(block)
                except BrokenPipeError:
                    writing = False


def pack_tar(tar: str, root: str, members: list[str], dest: str) -> dict[str, Any]:
    """Write the members (relative to root) as a zstd tar at dest, hashing it as it is written:
    {"rc", "error", "sha256", "size"}. Owners by name (a group's id differs between hosts), modes and
    hard links as they are. A failed tar leaves no file at dest."""
    hashing = Hashing()
    argv = [tar, "--create", "--file=-", f"--use-compress-program={ZSTD_PACK}", f"--directory={root}", "--", *members]
    with open(dest, "wb") as out, tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors)  # noqa: S603 - tar, no shell
        hashing.pump(proc.stdout, out)  # type: ignore[arg-type]  # a pipe: stdout=PIPE
        rc = proc.wait()
        error = tail(errors)
    if rc != 0:
        remove_file(dest)
    return {"rc": rc, "error": error, "sha256": hashing.digest.hexdigest(), "size": hashing.size}


def extract_tar(tar: str, src: str, into: str, expect_sha256: object) -> dict[str, Any]:
    """Hash the zstd tar src, then, only when its sha256 is expect_sha256, extract it into the
    directory into: {"rc", "error", "sha256"} (rc None: not extracted). GNU tar as root keeps the
    owners (by name) and modes, skips members with "..", and makes symbolic links last, so that no
    member is written through one. tar reads src itself, in records of 1 MiB: streaming it through
    this process into tar's stdin instead cost a host 7 s more of CPU for a 2.3 GB environment (the
    hash is a second read of a file the copy left in the page cache, 1.5 s)."""
    sha256 = sha256_of(src)
    if sha256 != expect_sha256:
        return {"rc": None, "error": "", "sha256": sha256}
    argv = [
        tar,
        "--extract",
        f"--file={src}",
        "--use-compress-program=zstd",
        "--blocking-factor=2048",
        "--read-full-records",
        f"--directory={into}",
    ]
    with tempfile.TemporaryFile() as errors:
        rc = subprocess.run(argv, stderr=errors, check=False).returncode  # noqa: S603 - tar, no shell
        error = tail(errors)
    return {"rc": rc, "error": error, "sha256": sha256}


def work_dir(parent: str) -> str:
    """A new directory to unpack in under parent, after removing what a killed unpack left there
    (gigabytes that nothing is made of)."""
    os.makedirs(parent, exist_ok=True)
    for name in os.listdir(parent):
        if name.startswith(RESTORE_PREFIX):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=RESTORE_PREFIX, dir=parent)


def prune(cache_dir: str, keep: int, used: set[str], ext: str = EXT) -> list[str]:
    """Remove the entries beyond the newest `keep` that no host of this plan uses; their record first,
    since a record is what makes an entry."""
    records = []
    for name in os.listdir(cache_dir):
        key, suffix = os.path.splitext(name)
        if suffix == ".json" and key not in used:
            records.append((os.path.getmtime(os.path.join(cache_dir, name)), key))
    removed = []
    for _, key in sorted(records, reverse=True)[max(keep, 0) :]:
        for suffix in (".json", ext):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(cache_dir, key + suffix))
        removed.append(key)
    return sorted(removed)


def tree_size(path: str) -> int:
    """Bytes of the regular files under path (or of path), each hard-linked file once."""
    if not os.path.isdir(path):
        return os.path.getsize(path) if os.path.isfile(path) else 0
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def tail(errors: IO[bytes]) -> str:
    errors.seek(0)
    return errors.read().decode(errors="replace").strip()[-400:]


def remove_file(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
