"""The benchmark charts: SVG bar charts drawn here and turned into PNG by Debian's chromium,
headless (scripts/setup installs it for the fleet report's test), so that the charts need no
plotting library."""

from __future__ import annotations

import html
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

WIDTH = 900
FONT = "DejaVu Sans, sans-serif"
COLORS = {"gpuenv": "#2b6cb0", "floor": "#a0aec0", "no-op": "#2b6cb0", "upstream": "#2f855a", "served": "#a0aec0"}
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def bar_chart(
    title: str,
    groups: list[tuple[str, list[tuple[str, float]]]],
    unit: str,
    *,
    target: tuple[float, str] | None = None,
    note: str = "",
) -> tuple[str, int]:
    """Horizontal grouped bars: one group per label, one bar per series. Returns (svg, height)."""
    series = [name for _, bars in groups[:1] for name, _ in bars]
    bar_h, gap, left, right, top = 22, 14, 170, 110, 60
    rows = sum(len(bars) for _, bars in groups)
    height = top + rows * bar_h + len(groups) * gap + 60
    peak = max([v for _, bars in groups for _, v in bars] + [target[0] if target else 0] + [1e-9])
    scale = (WIDTH - left - right) / peak
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="{FONT}">',
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
        f'<text x="20" y="30" font-size="18" font-weight="bold">{html.escape(title)}</text>',
    ]
    for i, name in enumerate(series):
        x = left + i * 150
        out.append(f'<rect x="{x}" y="40" width="14" height="14" fill="{COLORS.get(name, "#4a5568")}"/>')
        out.append(f'<text x="{x + 20}" y="52" font-size="13">{html.escape(name)}</text>')
    y = top + 10
    for label, bars in groups:
        group_top = y
        for name, value in bars:
            w = max(value * scale, 1)
            out.append(
                f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h - 4}" fill="{COLORS.get(name, "#4a5568")}"/>'
            )
            out.append(f'<text x="{left + w + 6:.1f}" y="{y + bar_h - 9}" font-size="12">{value:g} {unit}</text>')
            y += bar_h
        mid = (group_top + y) / 2 + 4
        out.append(f'<text x="{left - 10}" y="{mid:.1f}" font-size="13" text-anchor="end">{html.escape(label)}</text>')
        y += gap
    if target:
        tx = left + target[0] * scale
        out.append(
            f'<line x1="{tx:.1f}" y1="{top}" x2="{tx:.1f}" y2="{y}" stroke="#c53030" stroke-width="2" '
            'stroke-dasharray="6,4"/>'
        )
        out.append(f'<text x="{tx + 4:.1f}" y="{y + 14}" font-size="12" fill="#c53030">{html.escape(target[1])}</text>')
    if note:
        out.append(f'<text x="20" y="{height - 12}" font-size="11" fill="#4a5568">{html.escape(note)}</text>')
    out.append("</svg>")
    return "\n".join(out), height


def to_png(svg: str, height: int, dest: Path) -> Path:
    chromium = shutil.which("chromium")
    if chromium is None:
        raise RuntimeError("chromium is missing: ./scripts/setup installs it (the charts are rendered with it)")
    with tempfile.TemporaryDirectory(prefix="gpuenv-chart-") as tmp:
        page = Path(tmp) / "chart.html"
        page.write_text(f"<!doctype html><html><body style='margin:0'>{svg}</body></html>")
        dest.unlink(missing_ok=True)
        subprocess.run(  # noqa: S603
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={tmp}/profile",
                f"--window-size={WIDTH},{height}",
                f"--screenshot={dest}",
                page.as_uri(),
            ],
            capture_output=True,
            timeout=120,
            check=True,
        )
    return dest


def render_all(results: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs: dict[str, Path] = {}
    pairs = results.get("pairs")
    if pairs:
        med = pairs["stages_median"]
        groups = [
            (stage, [("gpuenv", med["gpuenv"][stage]), ("floor", med["floor"][stage])]) for stage in med["gpuenv"]
        ]
        groups.append(("whole run", [("gpuenv", pairs["gpuenv_median_s"]), ("floor", pairs["floor_median_s"])]))
        svg, h = bar_chart(
            "Fresh host to verified stack: gpuenv beside the floor (median seconds)",
            groups,
            "s",
            note=f"{len(pairs['runs'])} pair(s), alternating; ratio of medians {pairs['ratio_of_medians']}",
        )
        pngs["stages"] = to_png(svg, h, out_dir / "stages.png")
    fanout = results.get("fanout")
    if fanout:
        sizes = fanout["sizes"]
        one = sizes["1"]["wall_s"]
        groups = [(f"{n} host{'s' if n != '1' else ''}", [("no-op", sizes[n]["wall_s"])]) for n in sizes]
        svg, h = bar_chart(
            "Fleet fan-out: no-op site.yml with verify, by fleet size (seconds)",
            groups,
            "s",
            target=(2 * one, "target: 2 x the 1-host time"),
        )
        pngs["fanout"] = to_png(svg, h, out_dir / "fanout.png")
    nbytes = results.get("bytes")
    if nbytes:
        groups = [
            (
                f"{n} host{'s' if n != '1' else ''}",
                [
                    ("upstream", round(v["upstream_bytes"] / 1e9, 2)),
                    ("served", round(v.get("served_to_hosts_bytes", 0) / 1e9, 2)),
                ],
            )
            for n, v in nbytes.items()
        ]
        svg, h = bar_chart(
            "Bytes from upstream (Debian, PyPI) against bytes the hosts received (GB)",
            groups,
            "GB",
            note="upstream: what left the machine; served: what the download cache gave the hosts",
        )
        pngs["bytes"] = to_png(svg, h, out_dir / "bytes.png")
    return pngs
