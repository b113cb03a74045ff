"""Parsers for what read-only probes on a host print. Pure functions, tested on saved real output."""

from __future__ import annotations

# nvidia-smi prints these instead of a value when a field does not apply or is unknown.
_NO_VALUE = {"[N/A]", "[Not Supported]", "N/A", ""}


def parse_nvidia_smi_gpus(text: str) -> list[dict[str, str]]:
    """Parse `nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader` into [{name, cc}].

    A GPU whose compute capability is not printed gets cc "" and is looked up by name later.
    """
    gpus = []
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line:
            continue
        name, _, cc = line.rpartition(",")
        if not name:  # a line without a comma: only a name
            name, cc = cc, ""
        cc = cc.strip()
        gpus.append({"name": name.strip(), "cc": "" if cc in _NO_VALUE else cc})
    return gpus
