"""Callback plugin: says how to fix a run whose Python lacks the gpuenv package.

gpuenv's filters, its preflight and its other callbacks call the gpuenv package, which must be
importable by the Python that runs Ansible: scripts/setup installs it into the repository's .venv,
a site installs it with pip, and pull mode's unit puts its checkout on PYTHONPATH. Without it Ansible
skips each plugin with a warning and the first task that uses one fails with "No filter named ...",
which does not say what to do; this plugin (which imports nothing of gpuenv's) says it once, at the
start of the run.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: gpuenv_package
type: aggregate
short_description: says how to fix a Python that lacks the gpuenv package gpuenv's plugins call
description:
  - At the start of a run, checks that the Python running Ansible can import the gpuenv package,
    and where it cannot, says so with the ways to make it importable.
requirements:
  - enabled in ansible.cfg (callbacks_enabled)
"""


def missing_package_message(python: str) -> str | None:
    """What to do when the gpuenv package cannot be imported by this Python; None when it can."""
    if importlib.util.find_spec("gpuenv") is not None:
        return None
    return (
        f"gpuenv's plugins need the gpuenv package, and the Python running Ansible ({python}) cannot import it,"
        " so every gpuenv filter and callback is skipped and the first task that uses one fails. Run"
        " ./scripts/setup and use the repository's .venv/bin/ansible-playbook, or install the repository into"
        " that Python (pip install /path/to/gpuenv), or put the repository on PYTHONPATH."
    )


class CallbackModule(CallbackBase):  # type: ignore[misc]  # Ansible's base class is untyped
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpuenv_package"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook: Any) -> None:
        message = missing_package_message(sys.executable)
        if message:
            self._display.error(message)
