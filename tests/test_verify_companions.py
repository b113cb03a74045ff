"""verify's torch.companions with the real (CPU) torch: the companions stand in as small modules
over torch, because the test environment has no torchvision, torchaudio or numpy; the real ones
are imported and run on sandbox hosts (molecule/verify, molecule/pytorch_env)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from gpuenv.verify import base, torchenv


def _numpy() -> types.ModuleType:
    """A numpy whose arange is a real array torch.from_numpy cannot take: from_numpy is replaced
    by the fixture where the test wants torch's bridge to work."""
    module = types.ModuleType("numpy")
    module.__version__ = "2.4.6"  # type: ignore[attr-defined]
    module.arange = lambda n, dtype: torch.arange(n, dtype=torch.float32)  # type: ignore[attr-defined]
    return module


def _torchvision(version: str = "0.20.1", nms: Any = None) -> types.ModuleType:
    module = types.ModuleType("torchvision")
    module.__version__ = version  # type: ignore[attr-defined]

    def resize(image: torch.Tensor, size: list[int], antialias: bool) -> torch.Tensor:
        return torch.nn.functional.interpolate(image[None], size=size, mode="bilinear", antialias=antialias)[0]

    def python_nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float) -> torch.Tensor:
        keep: list[int] = []
        for i in scores.argsort(descending=True).tolist():
            a = boxes[i]
            if all(_iou(a, boxes[j]) <= threshold for j in keep):
                keep.append(i)
        return torch.tensor(keep)

    module.transforms = types.SimpleNamespace(functional=types.SimpleNamespace(resize=resize))  # type: ignore[attr-defined]
    module.ops = types.SimpleNamespace(nms=nms or python_nms)  # type: ignore[attr-defined]
    return module


def _iou(a: torch.Tensor, b: torch.Tensor) -> float:
    lo, hi = torch.maximum(a[:2], b[:2]), torch.minimum(a[2:], b[2:])
    inter = float((hi - lo).clamp(min=0).prod())
    area = float((a[2:] - a[:2]).prod() + (b[2:] - b[:2]).prod())
    return inter / (area - inter)


def _torchaudio() -> types.ModuleType:
    module = types.ModuleType("torchaudio")
    module.__version__ = "2.5.1"  # type: ignore[attr-defined]

    def resample(wave: torch.Tensor, orig: int, new: int) -> torch.Tensor:
        return torch.nn.functional.interpolate(wave[None], scale_factor=new / orig)[0]

    module.functional = types.SimpleNamespace(resample=resample)  # type: ignore[attr-defined]
    return module


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> dict[str, types.ModuleType]:
    """Put companions in sys.modules (the test fills the dict; what is absent does not import)."""
    modules: dict[str, types.ModuleType] = {}
    real_import = torchenv.importlib.import_module

    def import_module(name: str) -> types.ModuleType:
        if name in modules:
            return modules[name]
        if name in torchenv.COMPANIONS:
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name)

    monkeypatch.setattr(torchenv.importlib, "import_module", import_module)
    monkeypatch.setattr(torch, "from_numpy", lambda array: array)
    return modules


def _ctx(tmp_path: Path, companions: dict[str, str] | None) -> base.Context:
    facts = tmp_path / "facts.d"
    facts.mkdir(exist_ok=True)
    if companions is not None:
        (facts / "pytorch_env.fact").write_text(json.dumps({"name": "default", "companions": companions}))
    return base.Context(torch=torch, facts_dir=facts)


def test_declared_companions_that_import_and_run_pass(tmp_path: Path, installed: dict[str, Any]) -> None:
    installed.update(numpy=_numpy(), torchvision=_torchvision(), torchaudio=_torchaudio())
    check = torchenv.companions(_ctx(tmp_path, {"torchaudio": "2.5.1", "torchvision": "0.20.1"}))
    assert check.status == "pass", check
    assert check.observed == {"packages": "torchvision 0.20.1, torchaudio 2.5.1, numpy 2.4.6"}
    assert check.expected == {"packages": "torchvision 0.20.1, torchaudio 2.5.1"}


def test_a_declared_companion_missing_fails_with_the_rebuild(tmp_path: Path, installed: dict[str, Any]) -> None:
    installed.update(numpy=_numpy(), torchvision=_torchvision())
    check = torchenv.companions(_ctx(tmp_path, {"torchvision": "0.20.1", "torchaudio": "2.5.1"}))
    assert check.status == "fail"
    assert "torchaudio does not import" in check.summary
    assert "site.yml" in (check.hint or "")


def test_another_version_than_declared_fails(tmp_path: Path, installed: dict[str, Any]) -> None:
    installed.update(torchvision=_torchvision("0.19.1"))
    check = torchenv.companions(_ctx(tmp_path, {"torchvision": "0.20.1"}))
    assert check.status == "fail"
    assert "torchvision 0.19.1 where the environment declares 0.20.1" in check.summary


def test_a_local_version_label_is_the_same_release(tmp_path: Path, installed: dict[str, Any]) -> None:
    installed.update(torchvision=_torchvision("0.20.1+cu124"))
    assert torchenv.companions(_ctx(tmp_path, {"torchvision": "0.20.1"})).status == "pass"


def test_an_operator_that_gives_a_wrong_answer_fails(tmp_path: Path, installed: dict[str, Any]) -> None:
    installed.update(torchvision=_torchvision(nms=lambda boxes, scores, threshold: torch.tensor([0, 1, 2])))
    check = torchenv.companions(_ctx(tmp_path, {"torchvision": "0.20.1"}))
    assert check.status == "fail"
    assert "nms kept [0, 1, 2]" in check.summary


def test_an_operator_that_raises_fails_with_the_error(tmp_path: Path, installed: dict[str, Any]) -> None:
    def broken(*_: Any) -> Any:
        raise RuntimeError("Couldn't load custom C++ ops")

    installed.update(torchvision=_torchvision(nms=broken))
    check = torchenv.companions(_ctx(tmp_path, {"torchvision": "0.20.1"}))
    assert check.status == "fail"
    assert "Couldn't load custom C++ ops" in check.summary


def test_torch_without_numpy_support_fails(
    tmp_path: Path, installed: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_numpy(array: Any) -> Any:
        raise RuntimeError("Numpy is not available")

    monkeypatch.setattr(torch, "from_numpy", no_numpy)
    installed.update(numpy=_numpy())
    check = torchenv.companions(_ctx(tmp_path, {}))
    assert check.status == "fail"
    assert "torch cannot use numpy" in check.summary


def test_a_module_that_breaks_at_import_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = torchenv.importlib.import_module

    def import_module(name: str) -> Any:
        if name == "torchvision":
            raise OSError("libc10.so: cannot open shared object file")
        if name in torchenv.COMPANIONS:
            raise ModuleNotFoundError(name)
        return real_import(name)

    monkeypatch.setattr(torchenv.importlib, "import_module", import_module)
    check = torchenv.companions(_ctx(tmp_path, {"torchvision": "0.20.1"}))
    assert check.status == "fail"
    assert "torchvision fails at import (OSError: libc10.so" in check.summary


def test_an_environment_without_companions_skips(tmp_path: Path, installed: dict[str, Any]) -> None:
    check = torchenv.companions(_ctx(tmp_path, {}))
    assert check.status == "skip"
    assert "none of torchvision" in check.summary


def test_without_a_record_what_imports_is_still_run(tmp_path: Path, installed: dict[str, Any]) -> None:
    installed.update(torchvision=_torchvision(nms=lambda *_: torch.tensor([1])))
    check = torchenv.companions(_ctx(tmp_path, None))
    assert check.status == "fail"
    assert check.expected is None


def test_the_real_modules_where_this_environment_has_them(tmp_path: Path) -> None:
    """The check against what this Python really has: numpy, torchvision and torchaudio where
    installed (on a host with them it runs their real operators), a skip where none is."""
    present = [name for name in torchenv.COMPANIONS if _importable(name)]
    check = torchenv.companions(_ctx(tmp_path, {}))
    if not present:
        assert check.status == "skip"
    else:
        assert check.status == "pass", check


def _importable(name: str) -> bool:
    return name in sys.modules or __import__("importlib.util").util.find_spec(name) is not None
