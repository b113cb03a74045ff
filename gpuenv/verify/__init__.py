"""gpuenv verify: prove on a host that the declared stack is the one that loads and runs.

A package of checks grouped by area (driver, torchenv, cuda_tree, host, compute, nvml, distributed;
their order in plan), each declared once with its id (base.Checks.add), on one report model
(model, which the playbooks use too), written by outputs, run by cli (with --drift, gpuenv.drift's
checks of the host against its records too). It needs only the
standard library and torch: the gpu_verify role ships it to the hosts as one file, a zipapp of this
package and the stdlib-only modules it imports (bundle), run with the environment's own Python.
Nothing is imported here, so that `gpuenv.verify.model` costs the filters nothing more.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """`gpuenv verify ...` (gpuenv.cli) and `python -m gpuenv.verify`: the command line."""
    from gpuenv.verify import cli  # noqa: PLC0415 - see the module's docstring

    return cli.main(argv)
