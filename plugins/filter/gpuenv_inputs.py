"""Filters for the roles' checks of inventory values written into files, calling gpuenv.inputs
(tested in gpuenv/tests/test_inputs.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from gpuenv import inputs
except ImportError:  # ansible-playbook from a Python without gpuenv: use the repo's copy
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from gpuenv import inputs


def gpuenv_input_problems(values: dict[str, Any]) -> list[str]:
    """{variable: [value, form]} -> one sentence per value that does not have its form."""
    return inputs.problems(dict(values))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"gpuenv_input_problems": gpuenv_input_problems}
