"""`scripts/sandbox` (python -m testbed.sandbox): the local test fleet and its artifact mirror."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
from pathlib import Path

from testbed.sandbox.util import SandboxError

try:
    from testbed.sandbox import aptrepo, cache, channel, faults, fleet, mirror, roots
except SandboxError as exc:  # the instance's settings are read on import: a bad one is the user's to fix
    sys.exit(f"sandbox: error: {exc}")

DEFAULT_INVENTORY = Path(__file__).resolve().parents[2] / "inventory" / "sandbox" / "hosts.yml"


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0911 - each subcommand returns its own exit status
    parser = argparse.ArgumentParser(prog="scripts/sandbox", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="boot N Debian hosts reachable over SSH (idempotent)")
    p_up.add_argument("count", type=int)
    p_up.add_argument(
        "--os",
        action="append",
        default=[],
        choices=["debian12", "debian13"],
        help="OS of host 1, 2, ... (repeat; the last one fills the rest); default debian12",
    )
    p_up.add_argument("--inventory", type=Path, default=DEFAULT_INVENTORY, help="where to write the inventory")
    p_up.add_argument(
        "--kernel", action="store_true", help="hosts have Debian's kernel package, as a workstation (driver full mode)"
    )
    p_up.add_argument(
        "--kernel-host",
        action="append",
        default=[],
        metavar="NAME",
        help="this host alone (sb1, ...) has Debian's kernel package, as --kernel gives every host (repeat)",
    )
    p_up.add_argument("--snapshot", type=Path, help="start new hosts from a snapshot (scripts/sandbox snapshot)")
    p_snap = sub.add_parser("snapshot", help="save a provisioned host's changes to start new hosts from")
    p_snap.add_argument("host")
    p_snap.add_argument("dest", type=Path)
    sub.add_parser("down", help="stop every host and remove all the sandbox made (cached roots stay)")
    p_status = sub.add_parser("status", help="the hosts and whether they answer")
    p_status.add_argument("--json", action="store_true")
    p_inv = sub.add_parser("inventory", help="print the inventory's path (--show: its content)")
    p_inv.add_argument("--show", action="store_true")
    sub.add_parser("leftovers", help="list what of the sandbox exists on this machine (nothing after down)")
    p_fault = sub.add_parser("fault", help="inject a fault: stop, start, cut, slow, disk, block, restore")
    p_fault.add_argument("action", choices=["stop", "start", "cut", "slow", "disk", "block", "restore"])
    p_fault.add_argument("host")
    p_fault.add_argument("--rate", default="1mbit", help="slow: the bandwidth, e.g. 512kbit")
    p_fault.add_argument("--path", default="/opt/gpuenv", help="disk: where the small disk is mounted")
    p_fault.add_argument("--size-mb", type=int, default=64, help="disk: its size in MiB")
    p_fault.add_argument(
        "--port", type=int, default=8000, help="block: the controller's port the host loses (8000 mirror, 3142 cache)"
    )
    p_mirror = sub.add_parser(
        "mirror", help="the local NVIDIA redist mirror: build (or verify and repair), verify, path"
    )
    p_mirror.add_argument("action", choices=["build", "verify", "path"])
    p_repo = sub.add_parser(
        "repo",
        help="the local CUDA apt repository, laid out and signed as NVIDIA's, made from the mirror: build, path",
    )
    p_repo.add_argument("action", choices=["build", "path"])
    p_channel = sub.add_parser(
        "channel",
        help="the local conda channel (python, pytorch, cudnn, ...): build (or verify and repair), verify, path",
    )
    p_channel.add_argument("action", choices=["build", "verify", "path"])
    p_roots = sub.add_parser("roots", help="build the Debian roots hosts boot from, ahead of `up` (cached)")
    p_roots.add_argument(
        "--os", action="append", default=[], choices=["debian12", "debian13"], help="repeat; default both"
    )
    p_roots.add_argument("--kernel", action="store_true", help="the roots with Debian's kernel package (up --kernel)")
    p_cache = sub.add_parser("cache", help="the hosts' download cache (apt proxy and PyPI index): stats, path, clear")
    p_cache.add_argument("action", choices=["stats", "path", "clear"])
    p_sup = sub.add_parser("supervise", help=argparse.SUPPRESS)
    p_sup.add_argument("host")
    args = parser.parse_args(argv)

    try:
        if args.command == "up":
            state = fleet.up(
                args.count,
                args.os,
                args.inventory,
                kernel=args.kernel,
                kernel_hosts=tuple(args.kernel_host),
                snapshot=args.snapshot,
            )
            for host in state.hosts.values():
                print(f"{host.name}  {host.os:9} {host.ip}")
            print(f"inventory: {args.inventory}")
            print(f"try: ansible all -m ping -i {args.inventory}")
        elif args.command == "snapshot":
            print(fleet.snapshot(args.host, args.dest))
        elif args.command == "down":
            fleet.down()
            left = fleet.leftovers()
            if left:
                print("sandbox: down left these behind:\n  " + "\n  ".join(left), file=sys.stderr)
                return 1
        elif args.command == "status":
            rows = fleet.status()
            if args.json:
                print(json.dumps(rows, indent=2))
            elif not rows:
                print("no sandbox hosts (scripts/sandbox up N)")
            for r in [] if args.json else rows:
                print(
                    f"{r['name']}  {r['os']:9} {r['ip']:12} {'running' if r['running'] else 'stopped':8} "
                    f"ssh {'up' if r['ssh'] else 'down'}  {' '.join(r['faults'])}"
                )
        elif args.command == "inventory":
            state = fleet.State.load()
            if not state.inventory:
                raise SandboxError("no sandbox is up: run scripts/sandbox up N")
            print(Path(state.inventory).read_text() if args.show else state.inventory)
        elif args.command == "leftovers":
            left = fleet.leftovers()
            print("\n".join(left) if left else "nothing")
            return 1 if left else 0
        elif args.command == "fault":
            if args.action == "slow":
                faults.slow(args.host, args.rate)
            elif args.action == "disk":
                faults.disk(args.host, args.path, args.size_mb)
            elif args.action == "block":
                faults.block(args.host, args.port)
            else:
                getattr(faults, args.action)(args.host)
        elif args.command == "mirror":
            site = mirror.default_site()
            if args.action == "build":
                for manifest in mirror.build(site, mirror.default_wheels()):
                    print(manifest)
            elif args.action == "verify":
                problems = mirror.verify(site)
                print("\n".join(problems) if problems else f"{site}: every archive matches its manifest")
                return 1 if problems else 0
            else:
                print(site)
        elif args.command == "repo":
            site = mirror.default_site()
            if args.action == "build":
                # Debian's roots (debootstrap: mostly waiting on Debian's archive) are built while the
                # mirror packs its archives (xz: the cores); each is needed only once both are done.
                with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                    debian_roots = pool.submit(
                        lambda: {d: roots.ensure_root(fleet.roots_dir(), roots.release(d)) for d in aptrepo.DISTROS}
                    )
                    mirror.build(site, mirror.default_wheels())
                    debian = debian_roots.result()
                for repo in aptrepo.build(site, aptrepo.default_key_home(site), debian):
                    print(repo)
            else:
                print(site / "compute/cuda/repos")
        elif args.command == "roots":
            packages = (*roots.PACKAGES, *roots.KERNEL_PACKAGES) if args.kernel else roots.PACKAGES
            for os_name in args.os or list(roots.RELEASES):
                print(roots.ensure_root(fleet.roots_dir(), roots.release(os_name), packages))
        elif args.command == "channel":
            return _channel(args.action)
        elif args.command == "cache":
            if args.action == "stats":
                try:
                    print(json.dumps(cache.stats(fleet.cache_url()), indent=2))
                except OSError as exc:
                    raise SandboxError(
                        f"the download cache does not answer at {fleet.cache_url()} ({exc}): run scripts/sandbox up N"
                    ) from None
            elif args.action == "path":
                print(fleet.downloads_dir())
            else:
                if fleet.State.load().hosts:
                    raise SandboxError("the sandbox is up and its hosts use the cache: run scripts/sandbox down first")
                cache.clear(fleet.downloads_dir())
        elif args.command == "supervise":
            return fleet.supervise(args.host)
    except SandboxError as exc:
        print(f"sandbox: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _channel(action: str) -> int:
    where = channel.channel_dir()
    if action == "build":
        for o in channel.build():
            took = f"built in {o.seconds:.0f} s" if o.built else "cached"
            print(f"{o.recipe.subdir}/{o.recipe.filename()}  {took}")
        print(f"channel: {where}\nserved to the sandbox as {channel.channel_url()} (scripts/sandbox up)")
        print(f"PyTorch's channel's layout: {channel.channel_dir('pytorch')} ({channel.channel_url('pytorch')})")
    elif action == "verify":
        # The main channel always; PyTorch's channel's layout where it was built.
        pytorch = channel.channel_dir("pytorch")
        problems = channel.verify(where) + (channel.verify(pytorch) if pytorch.exists() else [])
        print("\n".join(problems) if problems else f"{where}: every package matches repodata.json")
        return 1 if problems else 0
    else:
        print(where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
