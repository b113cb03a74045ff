"""gpuenv's own Ansible modules (plugins/modules) document what they take: the DOCUMENTATION,
EXAMPLES and RETURN blocks are YAML that ansible-doc and ansible-lint can read, and every option in
the argument_spec is documented with its type (and nothing else is)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.conftest import load_plugin

REPO = Path(__file__).resolve().parents[1]
MODULES = sorted((REPO / "plugins/modules").glob("gpuenv_*.py"))


def load(path: Path) -> ModuleType:
    return load_plugin(str(path.relative_to(REPO)))


def test_there_are_modules() -> None:
    assert {p.stem for p in MODULES} >= {"gpuenv_apt_index", "gpuenv_cuda_tree"}


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_the_documentation_parses_and_names_every_option(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = load(path)
    doc = yaml.safe_load(mod.DOCUMENTATION)
    assert doc["module"] == path.stem
    yaml.safe_load(getattr(mod, "EXAMPLES", "") or "{}")
    assert isinstance(yaml.safe_load(mod.RETURN), dict)
    seen: dict[str, Any] = {}

    class Capture:
        def __init__(self, argument_spec: dict[str, Any], **_: Any) -> None:
            seen.update(argument_spec)
            raise SystemExit(0)

    monkeypatch.setattr(mod, "AnsibleModule", Capture)
    with pytest.raises(SystemExit):
        mod.main()
    assert set(doc["options"]) == set(seen)
    for name, spec in seen.items():
        assert doc["options"][name]["type"] == spec["type"], name
