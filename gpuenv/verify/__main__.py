"""`python -m gpuenv.verify`, and the zipapp's entry point (bundle writes a __main__ that calls it)."""

from __future__ import annotations

import sys

from gpuenv.verify.cli import main

if __name__ == "__main__":
    sys.exit(main())
