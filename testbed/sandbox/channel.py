"""The sandbox's local conda channel, built like the NVIDIA mirror: from pinned sources, cached,
served over HTTP, rebuilt only where its inputs change.

    <cache>/mirror/site/conda/{linux-64,noarch}/*.conda and repodata.json   the channel; the mirror's
        HTTP server serves it to the sandbox as http://10.199.0.1:8000/conda
    <cache>/channel/sources/      the pinned tarballs and wheels, each checked against its sha256
    <cache>/channel/recipes/      the recipe.yaml of each package, as last built
    <cache>/channel/logs/         rattler-build's log of each package's last build
    <cache>/channel/state.json    recipe sha256 -> built file and its sha256

The packages are built with rattler-build (py-rattler-build) and indexed with py-rattler, both
pinned in requirements/controller.in. testbed/data/channel.yaml says what the channel holds.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

import yaml

from testbed.sandbox import fleet, mirror, pypi2conda, recipes
from testbed.sandbox.recipes import Recipe
from testbed.sandbox.util import SandboxError, log

SUBDIRS = ("linux-64", "noarch")
# zstd level 3: packing torch's 1.7 GB is seconds, not the minutes that rattler-build's default takes.
PACKAGE_FORMAT = "conda:3"


def spec() -> dict[str, Any]:
    text = resources.files("testbed").joinpath("data/channel.yaml").read_text(encoding="utf-8")
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def channel_dir(name: str = "conda-forge") -> Path:
    """Under the mirror's site, so that the mirror's server (scripts/sandbox up) serves it too: the
    main channel (conda-forge's names), or PyTorch's channel's layout ("pytorch") beside it."""
    return fleet.mirror_root() / recipes.CHANNEL_FOLDERS[name]


def channel_url(name: str = "conda-forge") -> str:
    return f"http://{fleet.controller_ip()}:{fleet.MIRROR_PORT}/{recipes.CHANNEL_FOLDERS[name]}"


def work_dir() -> Path:
    return fleet.cache_dir() / "channel"


@dataclass(frozen=True)
class Outcome:
    recipe: Recipe
    built: bool
    seconds: float


def ensure_os_packages(packages: list[str]) -> None:
    """Install the Debian packages the build needs, when missing (root only, as scripts/setup)."""
    missing = []
    for pkg in packages:
        probe = subprocess.run(  # noqa: S603 - fixed argv
            ["/usr/bin/dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True, check=False
        )
        if probe.stdout.strip() != "install ok installed":
            missing.append(pkg)
    if not missing:
        return
    if os.geteuid() != 0:
        raise SandboxError(
            f"the channel build needs Debian packages {' '.join(missing)}: run it as root, or "
            f"sudo apt-get install --no-install-recommends {' '.join(missing)}"
        )
    log(f"channel: installing Debian packages {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
    ):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=1800)  # noqa: S603
        if done.returncode != 0:
            raise SandboxError(
                f"{' '.join(argv)} exited {done.returncode}: {(done.stderr or done.stdout).strip()[-1500:]}; "
                "check the apt sources in /etc/apt/sources.list* and the network to Debian's archive"
            )


def fetch(entry: dict[str, Any], sources: Path) -> Path:
    """sources/<file>, checked against its sha256: kept from before, taken from a local folder that
    holds it (the NVIDIA mirror's wheel cache, `local`), or downloaded from its URL."""
    target: Path = sources / entry["file"]
    if target.exists() and mirror.digest(target) == entry["sha256"]:
        return target
    sources.mkdir(parents=True, exist_ok=True)
    for folder in [*entry.get("local", []), str(mirror.default_wheels())]:
        candidate = Path(folder) / entry["file"]
        if candidate.exists() and mirror.digest(candidate) == entry["sha256"]:
            target.unlink(missing_ok=True)
            try:
                os.link(candidate, target)  # same disk: no second copy of a GB-sized wheel
            except OSError:
                shutil.copyfile(candidate, target)
            return target
    url = str(entry["url"])
    if not url.startswith(("https://", "http://deb.debian.org/")):
        raise SandboxError(f"{url}: only https URLs and Debian's archive (checked by sha256) are fetched")
    log(f"channel: downloading {url}")
    partial = target.with_name(target.name + ".partial")
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=120) as response, partial.open("wb") as out:  # noqa: S310
            for block in iter(lambda: response.read(1 << 20), b""):
                h.update(block)
                out.write(block)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise SandboxError(
            f"{url} cannot be fetched ({exc}); put {entry['file']} (sha256 {entry['sha256']}) in {sources}"
        ) from None
    if h.hexdigest() != entry["sha256"]:
        partial.unlink()
        raise SandboxError(
            f"{url}: sha256 {h.hexdigest()}, expected {entry['sha256']}; nothing was kept. A proxy that "
            "serves other files, or a pin in testbed/data/channel.yaml that is wrong, would explain it."
        )
    partial.replace(target)
    return target


def plan(data: dict[str, Any], sources: Path) -> list[Recipe]:
    """Every package's recipe, its sources fetched and checked; refuses a channel whose packages
    depend on a name no package of the channel provides."""
    pythons = {minor: entry["version"] for minor, entry in data.get("pythons", {}).items()}
    names = {pypi2conda.normalize(k): v for k, v in data.get("pypi_names", {}).items()}
    planned: list[Recipe] = []
    for minor, entry in data.get("pythons", {}).items():
        fetch(entry["source"], sources)
        planned += [recipes.cpython_recipe(minor, entry), recipes.python_abi_recipe(minor)]
    planned += [recipes.cuda_version_recipe(str(c)) for c in data.get("cuda_versions", [])]
    planned += [recipes.listed_metapackage_recipe(e) for e in data.get("metapackages", [])]
    by_file = {e["file"]: e for e in data.get("wheels", [])}
    for entry in data.get("wheels", []):
        info = pypi2conda.read_wheel(fetch(entry, sources))
        planned.append(recipes.wheel_recipe(_bundled(entry, by_file, sources), info, pythons, names))
    idents = [r.ident for r in planned]
    doubles = sorted({i for i in idents if idents.count(i) > 1})
    if doubles:
        raise SandboxError(f"channel.yaml has two packages for {', '.join(doubles)}: remove one")
    provided = {r.name for r in planned}
    for r in planned:
        for dep in yaml.safe_load(r.text).get("requirements", {}).get("run", []):
            name = dep.split()[0]
            if not name.startswith("__") and name not in provided:
                raise SandboxError(
                    f"{r.name} {r.version} depends on {dep!r}, which no package of the channel provides: add its "
                    "wheel to testbed/data/channel.yaml (or map its PyPI name under pypi_names)"
                )
    return planned


def _bundled(entry: dict[str, Any], by_file: dict[str, dict[str, Any]], sources: Path) -> dict[str, Any]:
    """The entry with each wheel it bundles (by file name) as that wheel's entry, fetched."""
    if not entry.get("bundle"):
        return entry
    unknown = [f for f in entry["bundle"] if f not in by_file]
    if unknown:
        raise SandboxError(f"{entry['file']} bundles {', '.join(unknown)}, which channel.yaml's wheels lack")
    for name in entry["bundle"]:
        fetch(by_file[name], sources)
    return {**entry, "bundle": [by_file[f] for f in entry["bundle"]]}


class _Log:
    """rattler-build's progress callback: its log, into the package's log file."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def on_download_start(self, event: object) -> None:
        pass

    def on_download_progress(self, event: object) -> None:
        pass

    def on_download_complete(self, event: object) -> None:
        pass

    def on_build_step(self, event: Any) -> None:
        self.out.write(f"== {event.step_name}: {event.message}\n")

    def on_log(self, event: Any) -> None:
        self.out.write(f"{event.message}\n")
        self.out.flush()


def build_one(recipe: Recipe, work: Path) -> Path:
    """Build one package with rattler-build; returns the .conda file (in work/build)."""
    import rattler_build  # noqa: PLC0415 - a heavy native module, needed only when something is built

    folder = work / "recipes" / recipe.ident
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    # Only recipe.yaml in its folder: rattler-build copies the folder into the package (info/recipe).
    (folder / "recipe.yaml").write_text(recipe.text)
    out = work / "build"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    logfile = work / "logs" / f"{recipe.ident}.log"
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with logfile.open("w") as fh:
        try:
            rattler_build.Stage0Recipe.from_file(folder / "recipe.yaml").run_build(
                tool_config=rattler_build.ToolConfiguration(compression_threads=os.cpu_count()),
                output_dir=out,
                # The build's own output folder as its only channel: nothing is solved from outside.
                channels=[out.resolve().as_uri()],
                progress_callback=_Log(fh),
                no_build_id=True,
                package_format=PACKAGE_FORMAT,
            )
        except rattler_build.RattlerBuildError as exc:
            fh.write(f"\n{exc}\n")
            tail = "".join(logfile.read_text().splitlines(keepends=True)[-25:])
            raise SandboxError(
                f"rattler-build failed for {recipe.ident}; its log is {logfile}, ending:\n{tail}"
            ) from None
    built = out / recipe.subdir / recipe.filename()
    if not built.exists():
        raise SandboxError(f"rattler-build made no {built} (see {logfile})")
    return built


@contextmanager
def _locked(work: Path) -> Iterator[None]:
    work.mkdir(parents=True, exist_ok=True)
    with (work / "lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Another build finishes first (scripts/test starts one before its lanes, and a molecule
            # scenario's prepare asks for the same channel); this one then finds its packages built.
            log(f"waiting for another channel build, which holds {work / 'lock'}")
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def build(data: dict[str, Any] | None = None, channel: Path | None = None, work: Path | None = None) -> list[Outcome]:
    """Build what changed, keep what did not, drop what the data no longer names, index, verify.
    `channel` is the main channel's folder; the others (PyTorch's channel's layout) are beside it."""
    data = spec() if data is None else data
    channel = channel_dir() if channel is None else channel
    work = work_dir() if work is None else work
    with _locked(work):
        ensure_os_packages(list(data.get("os_packages", [])))
        planned = plan(data, work / "sources")
        state_file = work / "state.json"
        state: dict[str, dict[str, str]] = json.loads(state_file.read_text()) if state_file.exists() else {}
        # Every channel of the table, whether or not the data still names a package of it: one that
        # lost all its packages loses its files and its index lists nothing.
        folders = {name: channel.parent / name for name in recipes.CHANNEL_FOLDERS.values()}
        folders[recipes.MAIN] = channel
        for folder in folders.values():
            for subdir in SUBDIRS:
                (folder / subdir).mkdir(parents=True, exist_ok=True)
        outcomes, replaced = [], set()
        for recipe in planned:
            rel = f"{recipe.subdir}/{recipe.filename()}"
            known = state.get(recipe.ident, {})
            target = folders[recipe.channel] / rel
            if known.get("key") == recipe.key and target.exists() and mirror.digest(target) == known.get("sha256"):
                target.chmod(0o644)  # channels built before the chmod below
                outcomes.append(Outcome(recipe, built=False, seconds=0.0))
                continue
            log(f"channel: building {recipe.name} {recipe.version} {recipe.build}")
            start = time.monotonic()
            built = build_one(recipe, work)
            if target.exists():
                replaced.add(recipe.channel)
            partial = target.with_name(target.name + ".partial")
            shutil.move(built, partial)
            partial.chmod(0o644)  # rattler-build writes 0600; the channel is served to everyone
            partial.replace(target)
            shutil.rmtree(work / "build", ignore_errors=True)
            old = known.get("file")
            if old and old != rel:
                (folders[recipe.channel] / old).unlink(missing_ok=True)
            state[recipe.ident] = {"key": recipe.key, "file": rel, "sha256": mirror.digest(target)}
            state_file.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
            outcomes.append(Outcome(recipe, built=True, seconds=time.monotonic() - start))
        keep = {f"{r.channel}/{r.subdir}/{r.filename()}" for r in planned}
        for ident in set(state) - {r.ident for r in planned}:
            del state[ident]
        state_file.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
        problems = []
        for name, folder in folders.items():
            for subdir in SUBDIRS:
                for stale in (folder / subdir).glob("*.conda"):
                    if f"{name}/{subdir}/{stale.name}" not in keep:
                        log(f"channel: removing {stale.name} (channel.yaml no longer names it)")
                        stale.unlink()
            index(folder, force=name in replaced)
            problems += verify(folder)
        if problems:
            raise SandboxError("the channel does not match its index:\n  " + "\n  ".join(problems))
        return outcomes


def index(channel: Path, *, force: bool = False) -> None:
    """repodata.json of every subdir, by py-rattler's indexer (plain JSON: http.server serves it as is).

    Without force it adds new files and drops removed ones (a second or so); it does not notice a
    file replaced under the same name, which only a repair makes: then force re-reads every
    package (about 40 s for this channel)."""
    from rattler.index import index_fs  # noqa: PLC0415 - a heavy native module

    asyncio.run(index_fs(channel, write_zst=False, write_shards=False, force=force))


def verify(channel: Path) -> list[str]:
    """Problems: a package missing, or whose sha256 or size differs from repodata; a package file
    that repodata does not list."""
    problems = []
    for subdir in SUBDIRS:
        repodata_path = channel / subdir / "repodata.json"
        if not repodata_path.exists():
            problems.append(f"{repodata_path}: missing (run scripts/sandbox channel build)")
            continue
        repodata = json.loads(repodata_path.read_text())
        listed = {**repodata.get("packages", {}), **repodata.get("packages.conda", {})}
        for filename, record in sorted(listed.items()):
            path = channel / subdir / filename
            if not path.exists():
                problems.append(f"{path}: missing")
            elif path.stat().st_size != record.get("size"):
                problems.append(f"{path}: size differs from {subdir}/repodata.json")
            elif mirror.digest(path) != record.get("sha256"):
                problems.append(f"{path}: sha256 differs from {subdir}/repodata.json")
        for path in sorted((channel / subdir).glob("*.conda")):
            if path.name not in listed:
                problems.append(f"{path}: not in {subdir}/repodata.json")
    return problems
