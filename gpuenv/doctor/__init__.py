"""gpuenv doctor: explain a GPU host that nobody provisioned (or that gpuenv did), without changing it.

It reads the host (host: every file under a root directory, every command through one runner, so that
the tests run it on fake host trees with saved real output), takes stock of the driver and the GPUs
(driver), the CUDA toolkits and cuDNN copies (cuda), the Python environments with torch and the
library paths they get (envs), runs gpuenv verify's checks in each environment with its own Python
(verifyrun), judges what it found with gpuenv's rules (findings), and prints it with the stack that
would replace the mess, from gpuenv suggest (report). run.examine ties them together.

Exit codes: 0 nothing wrong, 1 findings, 2 doctor could not run.
"""

from __future__ import annotations

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2
