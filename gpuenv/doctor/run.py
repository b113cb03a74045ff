"""One doctor run: take stock of the host, run verify in each environment with torch, judge, advise."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gpuenv.compat import CompatData
from gpuenv.doctor import EXIT_CLEAN, EXIT_FINDINGS, cuda, driver, envs, findings, hostfindings, trust, verifyrun
from gpuenv.doctor.advice import Advice, advise
from gpuenv.doctor.cuda import Cudnn, Toolkit
from gpuenv.doctor.driver import Driver, Gpu
from gpuenv.doctor.envs import Env, LibPath
from gpuenv.doctor.findings import Finding
from gpuenv.doctor.host import Host
from gpuenv.module_utils import gpuenv_hostparse as hostparse

STACK_RECORD = "/etc/gpuenv/stack.json"  # the record stack_record writes on a host gpuenv provisioned


@dataclass
class Options:
    gpus: list[Gpu] = field(default_factory=list)  # --gpu: GPUs besides those the host names
    homes: list[str] = field(default_factory=list)
    envs: list[str] = field(default_factory=list)
    depth: int = 4
    verify: bool = True
    verify_timeout: float = 180
    notes: list[str] = field(default_factory=list)  # the caller's, on what it left out


@dataclass
class Diagnosis:
    os: str
    os_key: str | None
    uid: int
    provisioned: bool  # gpuenv's record of the checked stack is there
    driver: Driver
    gpus: list[Gpu]
    toolkits: list[Toolkit]
    cudnn: list[Cudnn]
    envs: list[Env]  # those with torch
    other_envs: list[str]  # those without
    library_paths: list[LibPath]
    advice: Advice
    findings: list[Finding]
    notes: list[str]

    @property
    def exit_code(self) -> int:
        return EXIT_FINDINGS if self.findings else EXIT_CLEAN


def loader_cache(host: Host, notes: list[str]) -> dict[str, list[str]]:
    run = host.run(["ldconfig", "-p"], 60)
    if run is None or run.returncode != 0:
        notes.append("ldconfig -p did not answer: the loader's cache was not read (system cuDNN copies and the "
                     "user-space driver libraries may be missing below)")  # fmt: skip
        return {}
    return hostparse.parse_ldconfig(run.stdout)


def _verify(  # noqa: PLR0917 - examine's own state, passed on
    host: Host, found: list[Env], session: list[LibPath], cache: dict[str, list[str]], opts: Options, notes: list[str]
) -> None:
    with tempfile.TemporaryDirectory(prefix="gpuenv-doctor-") as tmp:
        # Readable by the accounts an environment may run as; root's own, so no one else can change it.
        os.chmod(tmp, 0o755)  # noqa: S103 - read and entered by others, written by root alone
        pyz = verifyrun.build(Path(tmp))
        os.chmod(pyz, 0o644)
        for env in found:
            why_not = verifyrun.runnable(env)
            if why_not:
                notes.append(f"verify did not run in {env.path}: {why_not}")
                env.verify_as = f"not run: {why_not}"
                continue
            how, ld_path = verifyrun.plan(host, env, session, cache)
            env.verify_as = how.describe()
            if how.how == trust.READ:
                continue
            env.verify = verifyrun.run(host, env, pyz, how, ld_path, opts.verify_timeout)


def examine(host: Host, data: CompatData, opts: Options) -> Diagnosis:
    notes = list(opts.notes)
    cache = loader_cache(host, notes)
    drv = driver.probe(host, cache)
    seen = driver.gpus(host, drv, data)
    gpus = seen + [g for g in opts.gpus if all(g.name != s.name for s in seen)]
    os_name, os_key = driver.os_release(host, data)
    homes = host.homes(opts.homes)
    every_env, search_notes = envs.find(host, homes, opts.depth, opts.envs)
    notes += search_notes
    with_torch = [e for e in every_env if e.torch]
    session = envs.session_paths(host, homes)
    toolkits = cuda.toolkits(host, drv.packages, every_env)
    ld_dirs = list(
        dict.fromkeys(d for lp in [*session, *(p for e in with_torch for p in e.lib_paths)] for d in lp.dirs)
    )
    copies = cuda.cudnn_copies(host, toolkits, cache, every_env, ld_dirs)
    by_real = {host.real(c.lib): c for c in copies}
    named = [*ld_dirs, *(e.cudnn_lib for e in with_torch if e.cudnn_lib)]
    by_dir = {d: by_real[host.real(d)] for d in named if host.real(d) in by_real}
    effective = drv.effective
    advice = advise(data, gpus, os_key, effective[0] if effective else None)
    if opts.verify and with_torch:
        _verify(host, with_torch, session, cache, opts, notes)
    found = [
        *hostfindings.host_findings(drv, gpus),
        *hostfindings.toolkit_findings(toolkits),
        *hostfindings.loader_findings(copies),
        *hostfindings.copies_findings(copies, cache, host.real),
    ]
    for env in with_torch:
        found += findings.env_findings(env, drv, gpus, session, by_dir, advice, data)
    if not gpus:
        notes.append("no NVIDIA GPU found (nvidia-smi and lspci named none, or did not run): the kernel-image "
                     "checks need one; name the GPUs with --gpu MODEL_OR_CC")  # fmt: skip
    return Diagnosis(
        os=os_name,
        os_key=os_key,
        uid=host.uid,
        provisioned=host.is_file(STACK_RECORD),
        driver=drv,
        gpus=gpus,
        toolkits=toolkits,
        cudnn=copies,
        envs=with_torch,
        other_envs=[e.path for e in every_env if not e.torch],
        library_paths=session,
        advice=advice,
        findings=found,
        notes=notes + advice.notes,
    )
