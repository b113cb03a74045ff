"""An all-reduce across processes: one per GPU over NCCL, or two over gloo on a host without one.
The ranks are forked from verify's own process, which has imported torch already, so the check
costs the all-reduce and not a torch import per rank; it runs before any other check touches CUDA
(Spec.forks), because CUDA does not survive a fork once initialised.

The ranks meet through a file store in a directory of verify's own (mode 0700), not a TCPStore on
a port: verify may run as root, and any local account could race for a port picked and released,
then feed the ranks what it liked. The backends' own rank-to-rank sockets (gloo's pairs, NCCL's
bootstrap) stay on loopback and carry the check's four numbers only: whoever reaches one can at
worst make the check fail, never run code."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import tempfile
import time
from typing import Any

from gpuenv.verify.base import Checks, Context, Spec, run_tool
from gpuenv.verify.model import Check

CHECKS = Checks()
_TIMEOUT = 120  # seconds for every rank to report


def _allreduce_worker(rank: int, world: int, store_path: str, results: Any) -> None:
    """One rank, in a process forked from verify after `import torch`: it picks NCCL and its own
    GPU where torch sees one, gloo on the CPU otherwise."""
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415 - already imported; forked
        import torch.distributed as dist  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415

        on_gpu = bool(torch.version.cuda) and torch.cuda.is_available()
        backend = "nccl" if on_gpu else "gloo"
        if on_gpu:
            torch.cuda.set_device(rank)
        store = dist.FileStore(store_path, world)  # type: ignore[attr-defined,unused-ignore]  # torch exports it untyped
        dist.init_process_group(backend, store=store, rank=rank, world_size=world)
        x = torch.ones(4, device="cuda" if on_gpu else "cpu") * (rank + 1)
        dist.all_reduce(x)
        total = float(world * (world + 1) // 2)
        ok = x.tolist() == [total] * 4
        dist.destroy_process_group()
        results.put((rank, backend, ok, None if ok else f"rank {rank} got {x.tolist()}, not {[total] * 4}"))
    except Exception as exc:  # the rank's failure is the check's observation
        results.put((rank, "?", False, f"rank {rank}: {type(exc).__name__}: {exc}"))


def _gpu_count_without_cuda_init(ctx: Context) -> int:
    """How many GPUs the ranks will find, asked of the driver (nvidia-smi), not of CUDA: CUDA
    initialised in verify's own process would make it unusable in the processes forked from it."""
    if not ctx.torch.version.cuda or shutil.which("nvidia-smi") is None:
        return 0
    listing = run_tool(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], timeout=30)
    gpus = len(listing.stdout.split()) if listing.returncode == 0 else 0
    # nvidia-smi lists every GPU; the ranks see only those CUDA_VISIBLE_DEVICES leaves them.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = min(gpus, len([d for d in visible.split(",") if d.strip()]))
    return gpus


def _gather(procs: list[Any], results: Any, world: int) -> list[tuple[int, str, bool, str | None]]:
    """What the ranks reported, until all did, all exited, or the time is up; then no rank is left."""
    found: list[tuple[int, str, bool, str | None]] = []
    deadline = time.monotonic() + _TIMEOUT
    while len(found) < world and time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            found.append(results.get(timeout=1))
        if len(found) < world and not any(p.is_alive() for p in procs) and results.empty():
            break
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
    return found


@CHECKS.add("dist.all_reduce", "all-reduce", forks=True)
def all_reduce(ctx: Context, me: Spec) -> Check:
    import multiprocessing  # noqa: PLC0415 - only this check starts processes

    gpus = _gpu_count_without_cuda_init(ctx)
    world = gpus if gpus > 0 else 2
    mp = multiprocessing.get_context("fork")
    results = mp.Queue()
    private = tempfile.mkdtemp(prefix="gpuenv-verify-dist-")  # 0700, verify's own
    try:
        store = os.path.join(private, "store")
        procs = [mp.Process(target=_allreduce_worker, args=(rank, world, store, results)) for rank in range(world)]
        for proc in procs:
            proc.start()
        found = _gather(procs, results, world)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    backend = "/".join(sorted({b for _, b, _, _ in found if b != "?"})) or "?"
    problems = [msg for _, _, ok, msg in found if not ok and msg]
    if len(found) < world:
        problems.append(f"{world - len(found)} of {world} ranks did not report within {_TIMEOUT} s (hung or crashed)")
    if not problems:
        return me.passed(
            f"all-reduce across {world} processes over {backend}", {"backend": backend, "processes": world}
        )
    return me.failed(
        f"all-reduce across {world} processes over {backend} failed",
        observed="; ".join(problems)[-800:],
        hint="torch.distributed does not work in this environment; see the message"
        + ("; with NCCL, NCCL_DEBUG=INFO shows why" if gpus else ""),
    )
