"""gpuenv verify's checks in each environment: the zipapp the gpu_verify role ships (gpuenv.verify.bundle),
run with the environment's own Python in a subprocess with a timeout, with the LD_LIBRARY_PATH a
session in that environment gets (so that the loader's choice of cuDNN is observed, not guessed). As
root, it runs only what no other account can write, and runs an account's own environment as that
account (gpuenv.doctor.trust).
Its report is verify's JSON (gpuenv/data/verify.schema.json); a run that printed none becomes a
report with one failing verify.run check, as for a host the playbooks could not check."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuenv.doctor import trust
from gpuenv.doctor.envs import Env, LibPath
from gpuenv.doctor.host import Host
from gpuenv.verify import bundle, model

# verify runs with any Python from 3.8 (its zipapp's floor).
MIN_PYTHON = (3, 8)
_HINT = "run the environment's Python by hand with the same command to see why; rebuild the environment if it is broken"


def build(dest: Path) -> Path:
    """The zipapp, written into dest (a temporary directory of doctor's)."""
    return bundle.build(dest)[0]


def library_path(env: Env, session: list[LibPath], shell: str) -> str:
    """LD_LIBRARY_PATH as a job in this environment sees it: its activation scripts' directories, then
    those every session gets (the profile files, then this shell's own value)."""
    dirs = [d for lp in env.lib_paths for d in lp.dirs] + [d for lp in session for d in lp.dirs]
    dirs += [d for d in shell.split(":") if d]
    return ":".join(dict.fromkeys(dirs))


def runnable(env: Env) -> str | None:
    """Why verify cannot run in this environment, or None when it can."""
    if not env.python:
        return f"{env.path} has no bin/python"
    if env.python_version and tuple(int(p) for p in env.python_version.split(".")) < MIN_PYTHON:
        return f"its Python {env.python_version} is older than 3.8, the oldest gpuenv verify runs with"
    return None


def plan(host: Host, env: Env, session: list[LibPath], cache: Mapping[str, list[str]]) -> tuple[trust.Plan, str]:
    """Who verify runs as in this environment (gpuenv.doctor.trust), and the LD_LIBRARY_PATH it gets:
    the one a session of that account gets."""
    shell = host.environ.get("LD_LIBRARY_PATH", "")
    if host.uid != 0:
        self_plan = trust.plan(host, env, [], cache)
        return self_plan, library_path(env, trust.session_for(self_plan, session), shell)
    as_root = trust.Plan(trust.ROOT, "", home=host.account_home(0) or "/root")
    root_path = library_path(env, trust.session_for(as_root, session), shell)
    chosen = trust.plan(host, env, [d for d in root_path.split(":") if d], cache)
    if chosen.how != trust.OWNER:
        return chosen, root_path
    if host.which("setpriv") is None:
        why = f"{chosen.why}, and setpriv (util-linux) is missing to run it as {chosen.account}"
        return trust.Plan(trust.READ, why), ""
    return chosen, library_path(env, trust.session_for(chosen, session), "")


def run(  # noqa: PLR0917 - one environment's run, all of it needed
    host: Host, env: Env, pyz: Path, how: trust.Plan, ld_path: str, timeout: float
) -> dict[str, Any]:
    """verify's report for one environment (never None: a run that failed is a failing report)."""
    environ = trust.environ_for(how, host.environ)
    if ld_path and how.how != trust.OWNER:
        environ["LD_LIBRARY_PATH"] = ld_path
    argv = trust.command_for(how, [env.python, str(pyz), "--json", "-", "--no-distributed"], ld_path)
    done = host.run(argv, timeout, environ)
    result: dict[str, Any] = (
        {"rc": None, "msg": f"{env.python}: no such file"}
        if done is None
        else {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
    )
    if done is not None and done.returncode == 124:
        result["stderr"] = f"verify ran past {timeout:g} s (--verify-timeout) and was stopped. {done.stderr}"
    return model.from_command(result, os.uname().nodename, f"gpuenv verify did not run in {env.path}", _HINT)


def check(report: dict[str, Any] | None, check_id: str) -> dict[str, Any] | None:
    """One check of a verify report, by id."""
    for entry in (report or {}).get("checks", []):
        if entry.get("id") == check_id:
            return dict(entry)
    return None
