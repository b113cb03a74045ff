"""The compatibility data holds together: every value cites a source, tables are consistent, and
every profile passes the rules for every GPU it claims."""

from __future__ import annotations

import pytest

from gpuenv import versions
from gpuenv.checkspec import check_mapping
from gpuenv.compat import load
from gpuenv.rules import covers

DATA = load()


def _cited(node: object) -> list[str]:
    """Every `source` / `*_source` value anywhere in the raw data."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "source" or str(key).endswith("_source"):
                found.extend(value if isinstance(value, list) else [value])
            else:
                found.extend(_cited(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_cited(item))
    return found


def test_every_cited_source_exists() -> None:
    cited = _cited({k: v for k, v in DATA.raw.items() if k != "sources"})
    assert cited
    assert set(cited) <= set(DATA.sources), set(cited) - set(DATA.sources)


def test_every_source_has_a_title() -> None:
    for source in DATA.sources.values():
        assert source.title


def test_driver_minimums_never_decrease_with_the_toolkit() -> None:
    toolkits = DATA.known_toolkits()
    drivers = [versions.parse(DATA.toolkit_driver[t]) for t in toolkits]
    assert drivers == sorted(drivers)
    assert toolkits[0] == "11.0.2"
    assert toolkits[-1] == "13.2.2"


def test_torch_range_covers_1_12_to_2_14() -> None:
    assert "1.12" in DATA.torch
    assert "2.14" in DATA.torch
    assert DATA.torch_releases()[0] == "1.12.0"


@pytest.mark.parametrize("series", sorted(DATA.torch, key=versions.parse))
def test_torch_series_is_consistent(series: str) -> None:
    entry = DATA.torch[series]
    assert entry.pypi_default in entry.variants
    assert all(versions.major_minor(r) == series for r in entry.releases)
    for variant in entry.variants.values():
        # the cuDNN a variant ships must be a release built for that variant's CUDA major
        assert str(versions.major(variant.cuda)) in DATA.cudnn_cuda_majors(variant.cudnn), (series, variant.name)
        assert set(variant.ptx) <= set(variant.sass)


def test_conda_channel_stops_at_2_5() -> None:
    on_channel = [s for s, e in DATA.torch.items() if e.conda_pytorch_channel]
    assert max(on_channel, key=versions.parse) == "2.5"


def test_blackwell_kernels_start_with_2_7_cu128() -> None:
    first = min(
        (versions.parse(s), v.name) for s, e in DATA.torch.items() for v in e.variants.values() if covers(v, "12.0")
    )
    assert first == ((2, 7), "cu128")


@pytest.mark.parametrize(
    ("name", "cc"),
    [
        ("NVIDIA H100 80GB HBM3", "9.0"),
        ("Tesla V100-SXM2-16GB", "7.0"),
        ("NVIDIA A100-SXM4-80GB", "8.0"),
        ("NVIDIA GeForce RTX 3060 Ti", "8.6"),
        ("NVIDIA RTX 6000 Ada Generation", "8.9"),
        ("Quadro RTX 6000", "7.5"),
        ("NVIDIA L40S", "8.9"),
        ("Tesla P40", "6.1"),
        ("Tesla P4", "6.1"),
        ("Tesla T4", "7.5"),
        ("NVIDIA GeForce RTX 5090", "12.0"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "12.0"),
        ("rtx 4090", "8.9"),
    ],
)
def test_gpu_names_as_nvidia_smi_prints_them(name: str, cc: str) -> None:
    model = DATA.gpu_by_name(name)
    assert model is not None
    assert model.cc == cc


def test_a_longer_name_is_not_matched_by_a_shorter_model() -> None:
    assert DATA.gpu_by_name("NVIDIA A2000") is None  # not "A2"


@pytest.mark.parametrize("name", sorted(DATA.profiles))
def test_every_profile_passes_for_every_gpu_it_lists(name: str) -> None:
    profile = DATA.profiles[name]
    assert profile.gpus
    for cc in profile.gpus:
        result = check_mapping({"profile": name, "gpu": cc})
        assert result["exit_code"] == 0, (cc, result["errors"])
        assert not result["warnings"], (cc, result["warnings"])


def test_open_modules_floor_is_turings_first_compute_capability() -> None:
    # The driver role's flavor auto reads this floor; NVIDIA ties it to Turing's GSP.
    turing = next(g for g in DATA.generations if g.name == "turing")
    assert DATA.raw["driver"]["open_modules"]["min_cc"] == turing.cc_min == "7.5"


def test_every_torch_release_has_its_companions() -> None:
    # pytorch_env pins torchvision / torchaudio from this table; a release without a row would
    # leave them unpinned.
    companions = DATA.raw["torch_companions"]["releases"]
    for release in DATA.torch_releases():
        assert release in companions, release
        assert companions[release]["torchvision"], release
