"""The benchmark figures as a terminal table and as the Markdown section of docs/benchmarks.md."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def _table(head: list[str], body: Iterable[Iterable[Any]]) -> list[str]:
    """A Markdown table's lines."""
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(str(c) for c in row) + " |" for row in body),
    ]


def rows(results: dict[str, Any], targets: dict[str, float]) -> list[tuple[str, str, str, str]]:
    """(figure, measured, target, verdict) for every figure the run has."""

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    out: list[tuple[str, str, str, str]] = []
    pairs = results.get("pairs")
    if pairs:
        out.append(
            (
                "1. fresh host to verified stack",
                f"gpuenv {pairs['gpuenv_median_s']:.0f} s, floor {pairs['floor_median_s']:.0f} s "
                f"(median of {len(pairs['runs'])}); ratio {pairs['ratio_of_medians']:.2f}",
                f"ratio <= {targets['ratio']}",
                verdict(pairs["ratio_of_medians"] <= targets["ratio"]),
            )
        )
    noop = results.get("noop")
    if noop:
        out.append(
            (
                "2. no-op re-run, 1 host",
                f"{noop['median_s']:.1f} s, changed {'/'.join(map(str, noop['changed']))} ({noop['tasks']} tasks)",
                f"0 changed, < {targets['noop_s']:.0f} s",
                verdict(max(noop["changed"]) == 0 and noop["median_s"] < targets["noop_s"]),
            )
        )
    fanout = results.get("fanout")
    if fanout:
        sizes = fanout["sizes"]
        one, top = sizes["1"]["wall_s"], sizes[max(sizes, key=int)]["wall_s"]
        # The controller's CPU per host, from the least-squares fit over the fleet sizes: on a real
        # fleet each host's own share runs on its CPUs, the controller's is what grows with the fleet.
        per_host = _per_host_cpu(sizes)
        out.append(
            (
                "3. fleet fan-out, no-op + verify",
                ", ".join(f"{n}: {v['wall_s']:.1f} s" for n, v in sizes.items())
                + f" ({max(sizes, key=int)} hosts = {top / one:.2f} x 1 host); "
                + (
                    f"CPU per host: controller {per_host[0]:.1f} s, host {per_host[1]:.1f} s; "
                    if per_host
                    else "CPU not recorded; "
                )
                + f"changed {sum(v['changed'] for v in sizes.values())}",
                f"controller CPU < {targets['controller_cpu_per_host_s']:g} s per no-op host",
                verdict(
                    per_host is not None
                    and per_host[0] < targets["controller_cpu_per_host_s"]
                    and all(v["changed"] == 0 for v in sizes.values())
                ),
            )
        )
    ver = results.get("verify")
    if ver:
        out.append(
            (
                "4. gpuenv verify, no GPU",
                f"{ver['median_s']:.2f} s (median of {len(ver['runs'])})",
                f"< {targets['verify_s']:g} s",
                verdict(ver["median_s"] < targets["verify_s"]),
            )
        )
    nbytes = results.get("bytes")
    if nbytes and "1" in nbytes and "4" in nbytes:
        one_b, four_b = nbytes["1"]["upstream_bytes"], nbytes["4"]["upstream_bytes"]
        out.append(
            (
                "5. upstream bytes, cold",
                f"1 host {_gb(one_b)}, 4 hosts {_gb(four_b)} ({four_b / one_b:.3f} x)",
                f"4 hosts <= {targets['bytes_factor']:g} x 1 host",
                verdict(four_b <= targets["bytes_factor"] * one_b),
            )
        )
    spec = results.get("checkspec")
    if spec:
        worst = max(v["median_ms"] for v in spec.values())
        out.append(
            (
                "6. gpuenv check-spec",
                ", ".join(f"{k} {v['median_ms']:.0f} ms" for k, v in spec.items()) + " (median)",
                f"< {targets['checkspec_s']:g} s",
                verdict(worst < targets["checkspec_s"] * 1000),
            )
        )
    fleet = results.get("fleet")
    measured = {n: v for n, v in (fleet or {}).get("sizes", {}).items() if "skipped" not in v}
    if measured:
        worst = [v["further_max_ratio"] for v in measured.values() if v.get("further_max_ratio") is not None]
        out.append(
            (
                "8. one build for the fleet, full mode",
                "; ".join(
                    f"{n} hosts {v['wall_s']:.0f} s, the first's CPU {v['first_host_cpu_s']:.0f} s"
                    + (
                        f", a further host's at most {v['further_max_ratio']:.2f} x"
                        if v.get("further_max_ratio")
                        else ""
                    )
                    for n, v in measured.items()
                ),
                f"further host CPU <= {targets['further_host_cpu_ratio']:g} x the first's",
                verdict(bool(worst) and max(worst) <= targets["further_host_cpu_ratio"]),
            )
        )
    onboard = results.get("onboard")
    if onboard and pairs:
        out.append(
            (
                "7. bare host to a verified new member",
                f"site.yml {pairs['gpuenv_median_s']:.0f} s + onboard.yml {onboard['wall_s']:.1f} s "
                f"(verify as them: exit {onboard['verify_exit']})",
                "well under an hour",
                verdict(pairs["gpuenv_median_s"] + onboard["wall_s"] < 3600 and onboard["verify_exit"] == 0),
            )
        )
    return out


def _per_host_cpu(sizes: dict[str, dict[str, Any]]) -> tuple[float, float] | None:
    """Controller and host CPU seconds per host: the slope through the origin of CPU by fleet size."""
    points = [(int(n), v) for n, v in sizes.items() if "controller_cpu_s" in v and "hosts_cpu_s" in v]
    if not points:
        return None
    norm = sum(n * n for n, _ in points)
    return (
        sum(n * float(v["controller_cpu_s"]) for n, v in points) / norm,
        sum(n * float(v["hosts_cpu_s"]) for n, v in points) / norm,
    )


def _further_host_stages(sizes: dict[str, dict[str, Any]]) -> tuple[str, str, dict[str, float]] | None:
    """The largest measured fleet's first further host and its CPU by stage, where recorded."""
    measured = [(n, v) for n, v in sizes.items() if "skipped" not in v and v.get("stage_cpu_s")]
    if not measured:
        return None
    n, v = max(measured, key=lambda item: int(item[0]))
    further = [h for h in v["stage_cpu_s"] if h != v["first_host"]]
    return (n, further[0], v["stage_cpu_s"][further[0]]) if further else None


def table(results: dict[str, Any], targets: dict[str, float]) -> str:
    lines = rows(results, targets)
    widths = [max(len(r[i]) for r in [("figure", "measured", "target", ""), *lines]) for i in range(4)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    return "\n".join([fmt.format("figure", "measured", "target", ""), *(fmt.format(*r) for r in lines)])


def markdown(results: dict[str, Any], pngs: dict[str, str], targets: dict[str, float]) -> str:
    m = results["machine"]
    stack = results["stack"]
    plan = results["plan"]
    mode = plan["mode"]
    cmd = "bench/run" + (" --quick" if mode == "quick" else "")
    out = [
        f"## Provisioning benchmarks ({mode} run of `{cmd}`)",
        "",
        f"Taken {m['date']} on {m['cpus']} cores ({m['cpu']}), "
        f"{m['memory_gib']} GiB, {m['os']}, kernel {m['kernel']}, no GPU. Command, as root: `{cmd}` "
        f"(the whole run took {results.get('total_wall_s', 0) / 60:.0f} min).",
        "",
        f"Stack (`inventory/sandbox`, driver in {plan.get('driver_mode', 'full')} mode): driver {stack['driver']}, "
        f"CUDA {stack['cuda']}, "
        f"cuDNN {stack['cudnn']}, Python {stack['python']}, torch {stack['torch']}+{stack['torch_variant']} "
        f"(`{' '.join(results['requirements'])}`). Hosts: Debian 12 sandbox hosts"
        + (
            " with Debian's kernel package installed, as a workstation has (the driver's DKMS build is measured)"
            if plan.get("driver_mode", "full") == "full"
            else " without a kernel of their own (the driver's user space only: no DKMS build)"
        )
        + ", reached over SSH; Debian's packages and PyPI's files through the sandbox's download cache, "
        "NVIDIA's archives from the local mirror.",
        "",
        *_table(["figure", "measured", "target", ""], rows(results, targets)),
        "",
    ]
    pairs = results.get("pairs")
    if pairs:
        med = pairs["stages_median"]
        out += [
            "### 1. Fresh host to verified stack, gpuenv beside the floor",
            "",
            "Each pair boots two identical fresh hosts; `site.yml` provisions one, `bench/floor.sh` (the same "
            "packages and files by plain `apt-get`, `curl`, `sha256sum`, `tar`, `cp`, `pip`) the other; "
            "the pairs alternate which goes first. Caches are warm (the download cache, the mirror, the "
            "controller's copy of NVIDIA's archives).",
            "",
            *_table(
                ["stage", "gpuenv (median s)", "floor (median s)"],
                [
                    *([s, med["gpuenv"][s], med["floor"][s]] for s in med["gpuenv"]),
                    ["whole run", pairs["gpuenv_median_s"], pairs["floor_median_s"]],
                ],
            ),
            "",
            "Pairs: "
            + "; ".join(
                f"{i + 1}: gpuenv {p['gpuenv']['wall_s']:.0f} s, floor {p['floor']['wall_s']:.0f} s "
                f"({' first, '.join(p['order'])} second), ratio {p['ratio']:.2f}"
                for i, p in enumerate(pairs["runs"])
            )
            + f". Median of the ratios: {pairs['median_of_ratios']:.2f}.",
            "",
        ]
        if "stages" in pngs:
            out += [f"![time per stage, gpuenv beside the floor]({pngs['stages']})", ""]
    noop = results.get("noop")
    if noop:
        out += [
            "### 2. No-op re-run",
            "",
            "`site.yml` again on a host it has just provisioned (the cold 1-host run's, else pair 1's): "
            f"{', '.join(f'{w:.1f} s' for w in noop['runs'])}; "
            f"changed tasks {noop['changed']}"
            + (f" ({', '.join(noop['changed_tasks'])})" if noop["changed_tasks"] else "")
            + f". {noop['tasks']} tasks; CPU: controller {noop.get('controller_cpu_s', '-')} s, host "
            + f"{noop.get('hosts_cpu_s', '-')} s. By stage: "
            + ", ".join(f"{k} {v} s" for k, v in noop["stages"].items())
            + ". Slowest tasks: "
            + ", ".join(f"{t['name']} {t['wall_s']:.2f} s" for t in noop["slowest_tasks"])
            + "."
            + (
                " The controller's CPU, by task: "
                + ", ".join(f"{t['name']} {t['cpu_s']:.2f} s" for t in noop["cpu_tasks"])
                + "."
                if noop.get("cpu_tasks")
                else ""
            ),
            "",
        ]
        every = noop.get("every_stage")
        if every:
            out += [
                "The host matches the stamp its provisioning run left (roles/converged), so the stages are "
                "skipped and verify runs. The same host with every stage run (`-e converged_skip=false`, what a "
                "no-op cost before the stamp, and what a run costs after any change on the host): "
                f"{every['wall_s']:.1f} s, "
                f"changed {every['changed']}, {every['tasks']} tasks; CPU: controller {every['controller_cpu_s']} s, "
                f"host {every['hosts_cpu_s']} s.",
                "",
            ]
    fanout = results.get("fanout")
    if fanout:
        out += [
            "### 3. Fleet fan-out",
            "",
            "The provisioned host is snapshotted (`scripts/sandbox snapshot`) and 8 hosts boot from it, each with "
            "its own name, machine-id and SSH host keys. Then `site.yml`, verify included, on the first 1, 2, 4 "
            f"and 8 of them. The hosts share this machine's {results['machine']['cpus']} cores with the "
            "controller, so the wall time here is bound by the sum of both; the CPU columns split it: Ansible's "
            "own (ansible-playbook, its workers, ssh) and everything else the machine did meanwhile (the "
            "hosts' module runs and verify). On a real fleet each host's share runs on its own CPUs.",
            "",
            *_table(
                ["hosts", "wall (s)", "changed", "controller CPU (s)", "hosts' CPU (s)"],
                (
                    [
                        n + (" (the no-op run above)" if v.get("from_noop") else ""),
                        f"{v['wall_s']:.1f}",
                        v["changed"],
                        v.get("controller_cpu_s", "-"),
                        v.get("hosts_cpu_s", "-"),
                    ]
                    for n, v in fanout["sizes"].items()
                ),
            ),
            "",
        ]
        per_host = _per_host_cpu(fanout["sizes"])
        if per_host:
            out += [
                f"Per host, a no-op run costs the controller {per_host[0]:.1f} CPU seconds and the host "
                f"{per_host[1]:.1f} (least squares over the fleet sizes). Here both share "
                f"{results['machine']['cpus']} cores, so {max(fanout['sizes'], key=int)} hosts take about "
                f"{max(fanout['sizes'], key=int)} x {per_host[0] + per_host[1]:.0f} / {results['machine']['cpus']} "
                "seconds whatever Ansible does. On a fleet, where each host's share runs on its own CPUs, the "
                f"controller's share is what grows: {per_host[0]:.1f} s per host over the controller's cores "
                "(an estimate from these figures, not a measurement of a real fleet).",
                "",
            ]
        if "fanout" in pngs:
            out += [f"![no-op wall time by fleet size]({pngs['fanout']})", ""]
    fleet = results.get("fleet")
    if fleet:
        out += [
            "### 8. One build for the fleet",
            "",
            "Fresh identical hosts (Debian's kernel package installed, as a workstation has) provisioned by one "
            "`site.yml` run, the driver in full mode, each fleet size starting with empty caches of built modules "
            "environments and unpacked cuDNNs (`nvidia_driver_build_cache_dir`, `pytorch_env_build_cache_dir`, "
            "`cudnn_build_cache_dir`). The first host builds the driver's module with DKMS and the PyTorch "
            "environment, unpacks cuDNN's tarball, and hands all three to the controller's cache; the others wait "
            "for them, install the module without compiling, unpack the environment instead of installing its "
            "wheels and copy cuDNN's unpacked files instead of decompressing its tarball. Each host's own CPU "
            "seconds are counted (every process under its systemd-nspawn, with what they reaped): on this "
            f"machine's {results['machine']['cpus']} cores the wall time is the sum of all hosts' work, so the CPU "
            "figures are the ones to judge by.",
            "",
            *_table(
                [
                    "hosts",
                    "wall (s)",
                    "changed",
                    "controller CPU (s)",
                    "built by",
                    "environment built by (its tar)",
                    "cuDNN unpacked by (its tar)",
                    "first host's CPU (s)",
                    "each further host's CPU (s)",
                    "worst further / first",
                ],
                (
                    [n, v["skipped"], "", "", "", "", "", "", "", ""]
                    if "skipped" in v
                    else [
                        n,
                        f"{v['wall_s']:.0f}",
                        v["changed"],
                        v["controller_cpu_s"],
                        ", ".join(v["built_by"]) or "none",
                        ", ".join(v.get("env_built_by") or ["none"])
                        + (f" ({v['env_entry_gb']:.1f} GB)" if v.get("env_entry_gb") else ""),
                        ", ".join(v.get("cudnn_built_by") or ["none"])
                        + (f" ({v['cudnn_entry_gb']:.1f} GB)" if v.get("cudnn_entry_gb") else ""),
                        f"{v['first_host_cpu_s']:.0f}",
                        ", ".join(f"{c:.0f}" for h, c in v["hosts_cpu_s"].items() if h != v["first_host"]) or "-",
                        f"{v['further_max_ratio']:.2f}" if v.get("further_max_ratio") is not None else "-",
                    ]
                    for n, v in fleet["sizes"].items()
                ),
            ),
            "",
        ]
        split = _further_host_stages(fleet["sizes"])
        if split:
            n, host, stages = split
            out += [
                f"Where a further host's CPU goes ({host} of the {n}-host run, by the windows of `site.yml`'s "
                "stages; the first host's background DKMS build falls in the windows of the stages beside it): "
                + ", ".join(f"{stage} {cpu:.0f} s" for stage, cpu in sorted(stages.items(), key=lambda i: -i[1]))
                + ".",
                "",
            ]
        size = fleet["sizes"][split[0]] if split else {}
        if size.get("further_host_tasks"):
            out += [
                f"Its costliest tasks (by their windows, from samples {size['sample_s']:.0f} s apart: a short task's "
                "figure is an estimate): "
                + ", ".join(f"{name} {cpu:.1f} s" for name, cpu in size["further_host_tasks"])
                + ".",
                "",
            ]
    ver = results.get("verify")
    if ver:
        out += [
            "### 4. gpuenv verify without a GPU",
            "",
            f"`gpuenv-verify --json` over SSH on the provisioned host: {', '.join(f'{w:.2f} s' for w in ver['runs'])} "
            f"(counts {ver['counts']}). Slowest checks: "
            + ", ".join(f"{c['id']} {c['seconds']} s" for c in ver["slowest_checks"])
            + ".",
            "",
        ]
    nbytes = results.get("bytes")
    if nbytes:
        out += [
            "### 5. Bytes from upstream",
            "",
            "A cold fleet: every phase starts the download cache with an empty directory, then provisions "
            "the hosts together. Upstream is what left the machine: the cache's own fetches (its "
            "`upstream.jsonl`) plus anything the hosts fetched around it (the sandbox NAT's counter). NVIDIA's "
            "archives come from the controller's copy (`cuda_toolkit_fetch: controller`), filled from the local "
            "mirror once; the mirror column counts what the mirror served during the run (its manifests, and "
            "archives the controller did not have yet). The mirror's own origin, PyPI's nvidia wheels, was "
            "fetched when the mirror was built, before this run.",
            "",
            *_table(
                [
                    "hosts",
                    "upstream",
                    "of which around the cache",
                    "served to the hosts",
                    "from the NVIDIA mirror",
                    "wall",
                ],
                (
                    [
                        n,
                        _gb(v["upstream_bytes"]),
                        _gb(v["direct_bytes"]),
                        _gb(v["served_to_hosts_bytes"]),
                        _gb(v["mirror_served_bytes"]),
                        f"{v['wall_s']:.0f} s",
                    ]
                    if not v.get("derived")
                    else [
                        n,
                        f"{_gb(v['upstream_bytes'])} (sb1's own requests in the {max(nbytes, key=int)}-host run: "
                        "the files it asked for once each, and its passed-through requests)",
                        "",
                        "",
                        "",
                        "",
                    ]
                    for n, v in nbytes.items()
                ),
            ),
            "",
        ]
        many = nbytes[max(nbytes, key=int)]
        if many.get("alone_bytes"):
            out += [
                f"What each host of the {many['hosts']}-host run alone would have fetched from upstream: "
                + ", ".join(f"{h} {_gb(b)}" for h, b in sorted(many["alone_bytes"].items()))
                + ".",
                "",
            ]
        if "bytes" in pngs:
            out += [f"![upstream bytes against bytes served]({pngs['bytes']})", ""]
    spec = results.get("checkspec")
    if spec:
        out += [
            "### 6. gpuenv check-spec",
            "",
            "A new process per run, as a user runs it:",
            "",
            *_table(
                ["stack", "runs", "min (ms)", "median (ms)", "max (ms)"],
                (
                    [k, v["runs"], f"{v['min_ms']:.0f}", f"{v['median_ms']:.0f}", f"{v['max_ms']:.0f}"]
                    for k, v in spec.items()
                ),
            ),
            "",
        ]
    if "phase_wall_s" in results:
        out += [
            "Phase wall times: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in results["phase_wall_s"].items()) + ".",
            "",
        ]
    return "\n".join(out)
