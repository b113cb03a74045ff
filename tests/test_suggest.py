"""gpuenv suggest over mixed fleets.

Every answer is checked twice: (a) the printed stack file (and every alternative's stack) goes through
check-spec's own checker (checkspec.check_file / check_mapping) and must be compatible; (b) each value
is compared with what the data's rows give by hand, and the comment above it names those rows
(gpuenv/data/compat.yaml). An independent oracle then proves "newest": it tries every driver branch,
toolkit of the build's CUDA major and Python on every newer torch build, and none may pass cleanly.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuenv import cli, versions
from gpuenv.checkspec import check_file, check_mapping
from gpuenv.compat import load
from gpuenv.rules import check
from gpuenv.stack import parse_stack
from gpuenv.suggest.search import GPU_INHERENT

DATA = load()


def suggest(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["suggest", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def suggest_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code, out, _ = suggest(capsys, *args, "--json")
    result: dict[str, Any] = json.loads(out)
    assert result["exit_code"] == code
    return result


def accepted_by_check_spec(tmp_path: Path, text: str) -> list[dict[str, Any]]:
    """Each YAML document of the text output saved as a file and judged by check-spec: all compatible."""
    results = []
    for i, document in enumerate(text.split("\n---\n")):
        path = tmp_path / f"stack{i}.yml"
        path.write_text(document)
        result = check_file(path)
        assert result["exit_code"] == 0, (document, result["errors"])
        results.append(result)
    return results


def every_alternative_accepted(result: dict[str, Any]) -> None:
    for alt in result["alternatives"]:
        for entry in alt["stacks"]:
            document = entry["document"]
            verdict = check_mapping(document["gpu_stack"], backend=document.get("pytorch_env_backend"))
            assert verdict["exit_code"] == 0, (alt["title"], verdict["errors"])


def stack_of(result: dict[str, Any], index: int = 0) -> dict[str, Any]:
    stack: dict[str, Any] = result["stacks"][index]["document"]["gpu_stack"]
    return stack


def bound(result: dict[str, Any], choice: str, rule: str, index: int = 0) -> dict[str, Any]:
    found = [b for b in result["stacks"][index]["bounds"] if b["choice"] == choice and b["rule"] == rule]
    assert found, (choice, rule, result["stacks"][index]["bounds"])
    return found[0]


# Errors that depend only on the torch build and the GPUs (with no system cuDNN, gpu-cudnn-sm75 is about
# torch's own): once one fires, no driver, toolkit or Python can mend that build.
BUILD_ONLY = {"gpu-torch-arch", "gpu-cudnn-sm75"}


def no_newer_clean_build(
    stack: dict[str, Any],
    gpus: list[str],
    *,
    os: str | None = None,
    driver: str | None = None,
    python: str | None = None,
) -> None:
    """The oracle: on every torch build newer than the answer, try every driver branch in the data (or the
    fixed one), every toolkit of the build's own CUDA major and every Python the release supports, with
    no system cuDNN (none can only remove findings); none may pass without avoidable warnings."""
    answer = (versions.parse(stack["torch"]), versions.parse(versions.cuda_from_variant(stack["torch_variant"]) or ""))
    branches = sorted({versions.driver_branch(v) for v in DATA.toolkit_driver.values()} | {470, 580})
    drivers = [driver] if driver else [str(b) for b in branches]
    build_only = BUILD_ONLY | ({"torch-python"} if python else set())  # a pinned Python: the release decides
    tried = 0
    for release in DATA.torch_releases():
        series = DATA.torch_series(release)
        assert series is not None
        for variant in series.variants.values():
            if (versions.parse(release), versions.parse(variant.cuda)) <= answer:
                continue
            low, high = versions.parse(series.python_min)[1], versions.parse(series.python_max)[1]
            pythons = [python] if python else [f"3.{m}" for m in range(low, high + 1)]
            toolkits = [t for t in DATA.known_toolkits() if versions.major(t) == versions.major(variant.cuda)]
            for toolkit, d, py in itertools.product(toolkits, drivers, pythons):
                raw = {
                    "gpu": gpus,
                    "driver": d,
                    "cuda": toolkit,
                    "cudnn": "none",
                    "python": py,
                    "torch": release,
                    "torch_variant": variant.name,
                    **({"os": os} if os else {}),
                }
                report = check(parse_stack(raw, DATA), DATA)
                tried += 1
                clean = not report.errors and all(w.rule in GPU_INHERENT for w in report.warnings)
                assert not clean, f"a newer clean stack exists: {raw}"
                if any(f.rule in build_only for f in report.errors):
                    break
    assert tried > 0 or answer == (versions.parse("2.14.1"), versions.parse("13.2"))


def test_pascal_and_hopper(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = suggest(capsys, "--gpu", "Tesla P100-PCIE-16GB", "--gpu", "H100", "--os", "debian12")
    assert code == 0
    accepted_by_check_spec(tmp_path, out)
    result = suggest_json(capsys, "--gpu", "Tesla P100-PCIE-16GB", "--gpu", "H100", "--os", "debian12")
    assert yaml.safe_load(out) == result["stacks"][0]["document"]  # the text is the file, comments aside
    stack = stack_of(result)
    # torch 2.14.1: the newest release in torch."2.14".releases. Its cu126 build is the newest that keeps
    # Pascal: torch."2.14".variants.cu126.sass lists 6.0, cu130 and cu132 start at 7.5.
    assert (stack["torch"], stack["torch_variant"]) == ("2.14.1", "cu126")
    assert "6.0" in bound(result, "torch_variant", "gpu-torch-arch")["reason"]
    # CUDA 12.6.3: the newest 12.6 row of cuda.toolkit_driver (torch's own CUDA 12.6).
    assert stack["cuda"] == "12.6.3"
    # cuDNN 9.10.2.21: what torch 2.14+cu126 ships (variants.cu126.cudnn), below 9.11 (cudnn.min_cc_from,
    # CC 7.5) so Pascal keeps it, in cudnn.builds."12", and support 9.10.2/major 12 lists CUDA 12.0-12.9.
    assert stack["cudnn"] == "9.10.2.21"
    # Driver 580: gpu.generations pascal last_driver_branch "580" (nv_driver_deprecation); CUDA 12.6.3
    # needs 560.35.05, so 580 fully supports it.
    assert stack["driver"] == "580"
    assert bound(result, "driver", "gpu-driver-eol")["sources"] == ["nv_driver_deprecation"]
    # Python 3.11: os.debian12.python.versions is ["3.11"] (venv backend), within torch 2.14's 3.10-3.14.
    assert stack["python"] == "3.11"
    assert "debian_python_bookworm" in bound(result, "python", "os-python")["sources"]
    # One stack per group: Hopper alone gets the newest build, torch 2.14.1+cu132 (sass 9.0), CUDA 13.2.2
    # (the newest 13.2 row) and driver 595 (595.71.05, the newest branch in cuda.toolkit_driver; Hopper
    # has no last branch), cuDNN 9.24.0.43 (variants.cu132.cudnn, in cudnn.builds."13").
    groups = {
        s["group"]: s["document"]["gpu_stack"]
        for a in result["alternatives"]
        if a["kind"] == "per-group"
        for s in a["stacks"]
    }
    assert groups["hopper"] == {
        "gpu": ["H100"],
        "os": "debian12",
        "driver": "595",
        "cuda": "13.2.2",
        "cudnn": "9.24.0.43",
        "python": "3.11",
        "torch": "2.14.1",
        "torch_variant": "cu132",
    }
    assert groups["pascal"]["torch_variant"] == "cu126"
    # Keeping Debian 12's own driver (os.debian12.driver_branch 535): torch 2.7.1+cu118, the newest build
    # whose runtime 535 fully supports (CUDA 11.8 needs 520.61.05; every 12.x build of 2.8+ needs >= 560).
    keep = next(a for a in result["alternatives"] if a["kind"] == "keep-driver")
    assert keep["stacks"][0]["document"]["gpu_stack"]["torch_variant"] == "cu118"
    assert keep["sources"] == ["debian_packages"]
    every_alternative_accepted(result)
    no_newer_clean_build(stack, ["P100", "H100"], os="debian12")


def test_volta_and_blackwell(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = suggest(capsys, "--gpu", "Tesla V100-SXM2-16GB", "--gpu", "NVIDIA GeForce RTX 5090")
    assert code == 0
    accepted_by_check_spec(tmp_path, out)
    result = suggest_json(capsys, "--gpu", "Tesla V100-SXM2-16GB", "--gpu", "NVIDIA GeForce RTX 5090")
    stack = stack_of(result)
    # torch 2.10.0+cu128: torch."2.10".variants.cu128.sass has 7.0 (Volta) and 12.0 (Blackwell); in 2.11,
    # cu128 starts at 7.5, cu126 lacks 12.0 and cu130 lacks 7.0 (pt_build_cuda).
    assert (stack["torch"], stack["torch_variant"]) == ("2.10.0", "cu128")
    assert "2.11.0" in bound(result, "torch", "gpu-torch-arch")["reason"]
    # CUDA 12.8.1 (newest 12.8 row), driver 580 (volta last_driver_branch; 12.8.1 needs 570.124.06 and
    # Blackwell's min_driver is 570.26), cuDNN 9.10.2.21 (cu128's, below 9.11 for Volta), Python 3.14
    # (torch 2.10's max; no OS given).
    assert stack == {
        "gpu": ["Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 5090"],
        "driver": "580",
        "cuda": "12.8.1",
        "cudnn": "9.10.2.21",
        "python": "3.14",
        "torch": "2.10.0",
        "torch_variant": "cu128",
    }
    # Per group: Volta keeps torch 2.14.1 with cu126 (sass 7.0); Blackwell gets cu132.
    groups = {
        s["group"]: s["document"]["gpu_stack"]
        for a in result["alternatives"]
        if a["kind"] == "per-group"
        for s in a["stacks"]
    }
    assert (groups["volta"]["torch"], groups["volta"]["torch_variant"]) == ("2.14.1", "cu126")
    assert (groups["blackwell"]["torch"], groups["blackwell"]["torch_variant"]) == ("2.14.1", "cu132")
    every_alternative_accepted(result)
    no_newer_clean_build(stack, ["V100", "RTX 5090"])


def test_fixed_driver_branch(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ("--gpu", "RTX 3060", "--gpu", "V100", "--driver", "535")
    code, out, _ = suggest(capsys, *args)
    assert code == 0
    accepted_by_check_spec(tmp_path, out)
    result = suggest_json(capsys, *args)
    stack = stack_of(result)
    # Driver 535 fully supports a CUDA runtime up to 12.2 (12.2.0: 535.54.03); every build of torch 2.8 and
    # newer is CUDA 12.6+ (needs 560.28.03: only a minor-version-compatibility warning, nv_mvc) or 13
    # (floor 580.65.06: an error). torch 2.7's cu118 (runtime 11.8: 520.61.05) has sass 7.0 and 8.6.
    assert (stack["torch"], stack["torch_variant"], stack["driver"]) == ("2.7.1", "cu118", "535")
    # CUDA 11.8.0 (its own, 520.61.05), cuDNN 9.1.0.70 (cu118's; cudnn.builds."11" has it; support 9.0.0 to
    # 9.10.2, major 11: CUDA 11.0-11.8), Python 3.13 (torch 2.7's max).
    assert (stack["cuda"], stack["cudnn"], stack["python"]) == ("11.8.0", "9.1.0.70", "3.13")
    kinds = {a["kind"]: a["stacks"][0]["document"]["gpu_stack"] for a in result["alternatives"]}
    # Newest torch against keeping the driver: without --driver, torch 2.14.1+cu126 on 580 (Volta's last).
    assert (kinds["without-driver"]["torch"], kinds["without-driver"]["driver"]) == ("2.14.1", "580")
    # The same torch on 535 is accepted only with the minor-version-compatibility warning.
    warned = next(a for a in result["alternatives"] if a["kind"] == "warnings")["stacks"][0]
    assert {w["rule"] for w in warned["warnings"]} == {"driver-torch-cuda"}
    every_alternative_accepted(result)
    no_newer_clean_build(stack, ["RTX 3060", "V100"], driver="535")


def test_python_pin_on_a_mixed_fleet(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ("--gpu", "RTX 3060", "--gpu", "NVIDIA H100 80GB HBM3", "--python", "3.9")
    code, out, _ = suggest(capsys, *args)
    assert code == 0
    accepted_by_check_spec(tmp_path, out)
    result = suggest_json(capsys, *args)
    stack = stack_of(result)
    # torch."2.8".python is 3.9-3.13; 2.9 and newer start at 3.10 (pt_release_matrix). Of 2.8's builds
    # cu129 is the newest (sass 8.6 and 9.0), with its own CUDA 12.9.1 (575.57.08), driver 595 (the newest
    # branch; Ampere and Hopper have no last one) and cuDNN 9.10.2.21 (support 12.0-12.9).
    assert stack == {
        "gpu": ["RTX 3060", "NVIDIA H100 80GB HBM3"],
        "driver": "595",
        "cuda": "12.9.1",
        "cudnn": "9.10.2.21",
        "python": "3.9",
        "torch": "2.8.0",
        "torch_variant": "cu129",
    }
    assert "Python 3.9" in bound(result, "torch", "torch-python")["reason"]
    without = next(a for a in result["alternatives"] if a["kind"] == "without-python")["stacks"][0]
    assert without["document"]["gpu_stack"]["torch"] == "2.14.1"
    every_alternative_accepted(result)
    no_newer_clean_build(stack, ["RTX 3060", "H100"], python="3.9")


def test_no_single_stack_gives_one_per_group(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Kepler (3.7) ends at driver R470 (gpu.generations kepler) and at torch builds with sass 3.7 (none
    # after 2.7's cu118); Blackwell needs driver 570.26 (min_driver) and sass 10.0/12.0 (2.7 cu128 on).
    args = ("--gpu", "3.7", "--gpu", "RTX 5090")
    code, out, _ = suggest(capsys, *args)
    assert code == 0
    documents = accepted_by_check_spec(tmp_path, out)
    assert len(documents) == 2
    result = suggest_json(capsys, *args)
    assert result["verdict"] == "per-group"
    groups = {s["group"]: s["document"]["gpu_stack"] for s in result["stacks"]}
    # Kepler: on R470 only runtimes up to 11.4 are fully supported (11.4.0: 470.42.01); of the builds with
    # sass 3.7, torch 1.12's cu113 (465.19.01) is the newest such. CUDA 11.3.1, Python 3.10 (1.12's max).
    # System cuDNN none: cu113's own 8.3.2.44 would need cudnn_tarball_url (cudnn.archives 8.3.1-8.9.7).
    assert groups["kepler"] == {
        "gpu": ["3.7"],
        "driver": "470",
        "cuda": "11.3.1",
        "cudnn": "none",
        "python": "3.10",
        "torch": "1.12.1",
        "torch_variant": "cu113",
    }
    assert (groups["blackwell"]["torch"], groups["blackwell"]["torch_variant"]) == ("2.14.1", "cu132")
    rules = {p["rule"] for p in result["problems"]}
    assert {"gpu-torch-arch"} <= rules  # each group's stack has no kernels for the other group


def test_no_stack_under_the_constraints_exits_1_with_the_reason_per_bound(capsys: pytest.CaptureFixture[str]) -> None:
    # Blackwell needs driver 570.26 (gpu.generations blackwell min_driver): 535 cannot run it.
    result = suggest_json(capsys, "--gpu", "RTX 5090", "--driver", "535")
    assert (result["verdict"], result["exit_code"]) == ("none", 1)
    assert "gpu-driver-too-old" in {p["rule"] for p in result["problems"]}
    assert any(p["reason"].startswith("without --driver 535: torch 2.14.1+cu132") for p in result["problems"])
    code, out, _ = suggest(capsys, "--gpu", "RTX 5090", "--driver", "535")
    assert code == 1
    assert "No stack passes every rule" in out
    assert "[gpu-driver-too-old;" in out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--gpu", "RTX 9999"], "'RTX 9999' is not a model gpuenv knows; give its compute capability"),
        (["--gpu", "H100", "--python", "3.x"], "--python '3.x' is not a Python version"),
        (["--gpu", "H100", "--cuda", "12"], "--cuda '12' is not a CUDA release"),
        (["--gpu", "H100", "--cuda", "10.2"], "--cuda 10.2 is not in gpuenv's data; use a CUDA release from 11.0.2"),
        (["--gpu", "H100", "--torch", "~=2.5"], "'~=2.5' is not a version bound"),
        (["--gpu", "H100", "--torch", "==2.5.7"], "torch 2.5 has 2.5.0, 2.5.1"),
        (["--gpu", "H100", "--driver", "5x"], "--driver '5x' is not a driver branch"),
        (["--gpu", "H100", "--max-driver-branch", "53"], "--max-driver-branch '53' is not a driver branch"),
        (["--gpu", "H100", "--os", "win11"], "--os 'win11' is not an OS gpuenv knows; use one of debian12"),
        ([], "no GPU given: name them with --gpu"),
    ],
)
def test_bad_input_exits_2_with_a_fix(capsys: pytest.CaptureFixture[str], args: list[str], says: str) -> None:
    code, out, err = suggest(capsys, *args)
    assert code == 2
    assert out == ""
    assert says in err
    result = suggest_json(capsys, *args)
    assert result["verdict"] == "invalid"
    assert any(says in p for p in result["problems"])


def test_backend_conda_is_written_beside_gpu_stack(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # With conda, os-python does not apply: Ubuntu 22.04 ships 3.10 only, yet Python 3.14 is chosen.
    code, out, _ = suggest(capsys, "--gpu", "L40S", "--os", "ubuntu2204", "--backend", "conda")
    assert code == 0
    document = yaml.safe_load(out)
    assert document["pytorch_env_backend"] == "conda"
    assert document["gpu_stack"]["python"] == "3.14"
    accepted_by_check_spec(tmp_path, out)
    # The venv backend builds from the OS's python3.10 (os.ubuntu2204.python.versions) ...
    result = suggest_json(capsys, "--gpu", "L40S", "--os", "ubuntu2204", "--no-system-cudnn", "--torch", "<2.6")
    stack = stack_of(result)
    assert (stack["python"], stack["cudnn"], stack["torch"]) == ("3.10", "none", "2.5.1")
    assert any("excludes torch 2.6.0" in b["reason"] for b in result["stacks"][0]["bounds"])


def test_the_search_stays_small(capsys: pytest.CaptureFixture[str]) -> None:
    """Pruning: a fleet answer judges a few hundred stacks at most (about 0.1 ms each), alternatives
    included, not the tens of thousands of the full product."""
    for args in (
        ["--gpu", "P100", "--gpu", "H100", "--os", "debian12"],
        ["--gpu", "3.7", "--gpu", "12.0"],
        ["--gpu", "RTX 3060", "--gpu", "V100", "--driver", "535"],
    ):
        result = suggest_json(capsys, *args)
        assert result["checks"] < 400, (args, result["checks"])
        assert result["seconds"] < 2.0, (args, result["seconds"])


def test_cuda_pin_keeps_the_toolkit_and_picks_a_build_of_its_major(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ("--gpu", "RTX 4090", "--cuda", "12.4", "--os", "debian13")
    code, out, _ = suggest(capsys, *args)
    assert code == 0
    accepted_by_check_spec(tmp_path, out)
    result = suggest_json(capsys, *args)
    stack = stack_of(result)
    # --cuda 12.4 means 12.4.1, the newest 12.4 row of cuda.toolkit_driver. torch 2.14.1's cu130 and cu132
    # builds are CUDA 13: beside a 12.4 toolkit they warn (toolkit-torch-major, pt_cpp_extension), so its
    # cu126 build is the newest clean one; cuDNN 9.10.2.21 is cu126's (support 12.0-12.9 has 12.4); Python
    # 3.13 is what os.debian13.python ships; driver 595 the newest branch (Ada has no last one).
    assert stack == {
        "gpu": ["RTX 4090"],
        "os": "debian13",
        "driver": "595",
        "cuda": "12.4.1",
        "cudnn": "9.10.2.21",
        "python": "3.13",
        "torch": "2.14.1",
        "torch_variant": "cu126",
    }
    assert bound(result, "torch_variant", "toolkit-torch-major")["sources"] == ["pt_cpp_extension"]
    # Keeping Debian 13's own driver (os.debian13.driver_branch 550) with the 12.4 toolkit: runtimes up to
    # 12.4 (550.54.14); torch 2.7 and newer have no 12.x build below 12.6 and cu118 is another major, so
    # torch 2.6.0+cu124 (sass 8.6 runs on 8.9).
    keep = next(a for a in result["alternatives"] if a["kind"] == "keep-driver")["stacks"][0]
    kept = keep["document"]["gpu_stack"]
    assert (kept["torch"], kept["torch_variant"], kept["driver"], kept["cuda"]) == ("2.6.0", "cu124", "550", "12.4.1")
    every_alternative_accepted(result)


def test_the_documented_example_is_what_suggest_prints(capsys: pytest.CaptureFixture[str], repo: Path) -> None:
    """docs/commands.md's example is a real run; it must not drift from what the command prints (the
    time on the last line aside)."""
    readme = (repo / "docs/commands.md").read_text()
    command = '$ gpuenv suggest --gpu "RTX 3060" --gpu V100 --max-driver-branch 535 --os debian12\n'
    assert command in readme
    shown = readme.split(command, 1)[1].split("\n```", 1)[0].splitlines()
    code, out, _ = suggest(
        capsys, "--gpu", "RTX 3060", "--gpu", "V100", "--max-driver-branch", "535", "--os", "debian12"
    )
    assert code == 0
    printed = out.splitlines()
    assert shown[:-1] == printed[:-1]
    assert shown[-1].split(" in ")[0] == printed[-1].split(" in ")[0]  # "# 219 stacks checked"


def test_no_toolkit_proposes_the_driver_and_torch_s_wheels_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--no-toolkit: no system CUDA toolkit and no system cuDNN (cuda: none), the driver judged against
    torch's CUDA runtime alone; the file is one check-spec accepts."""
    args = ("--gpu", "RTX 3060", "--gpu", "V100", "--driver", "535", "--no-toolkit")
    code, out, _ = suggest(capsys, *args)
    assert code == 0
    assert "#   constraints: --driver 535 --no-toolkit" in out
    accepted_by_check_spec(tmp_path, out)
    result = suggest_json(capsys, *args)
    stack = stack_of(result)
    assert (stack["cuda"], stack["cudnn"], stack["driver"]) == ("none", "none", "535")
    assert (stack["torch"], stack["torch_variant"]) == ("2.7.1", "cu118")  # as with a toolkit: torch's runtime binds
    assert bound(result, "cuda", None)["reason"].startswith("--no-toolkit: torch's wheels bring their own CUDA 11.8")
    every_alternative_accepted(result)


def test_no_toolkit_with_a_toolkit_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = suggest(capsys, "--gpu", "RTX 3060", "--no-toolkit", "--cuda", "12.4")
    assert code == 2
    assert "--no-toolkit and --cuda 12.4 contradict each other" in err
