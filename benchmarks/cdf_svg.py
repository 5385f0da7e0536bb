"""A latency CDF as a standalone SVG, with nothing but the standard library.

    write_cdf_svg(path, {"bare": [ms, ...], ...}, title)

One step line per series on a log-scaled x axis (ms), the fraction of round
trips on y, ticks at 1-2-5 per decade, the p50 in the legend. Used by
spawn_latency.py --plot, so the plot needs no matplotlib.
"""

from __future__ import annotations

import math
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 820, 500
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 60
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f")


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _ticks(lo: float, hi: float) -> list[float]:
    out = []
    for exp in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        for m in (1, 2, 5):
            t = m * 10.0**exp
            if lo <= t <= hi:
                out.append(t)
    return out


def write_cdf_svg(path: str, series: dict[str, list[float]], title: str) -> None:
    """Write the CDF of each non-empty series (values in ms, all > 0) to `path`."""
    series = {name: sorted(xs) for name, xs in series.items() if xs}
    if not series:
        raise ValueError("no samples to plot")
    lo = min(xs[0] for xs in series.values()) / 1.2
    hi = max(xs[-1] for xs in series.values()) * 1.2
    span = math.log10(hi) - math.log10(lo)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(ms: float) -> float:
        return LEFT + plot_w * (math.log10(ms) - math.log10(lo)) / span

    def y(frac: float) -> float:
        return TOP + plot_h * (1 - frac)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}"'
        f' font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>',
    ]
    for t in _ticks(lo, hi):
        parts.append(f'<line x1="{x(t):.1f}" y1="{TOP}" x2="{x(t):.1f}" y2="{TOP + plot_h}"'
                     ' stroke="#ddd"/>')
        parts.append(f'<text x="{x(t):.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">'
                     f"{t:g}</text>")
    for i in range(11):
        f = i / 10
        parts.append(f'<line x1="{LEFT}" y1="{y(f):.1f}" x2="{LEFT + plot_w}" y2="{y(f):.1f}"'
                     ' stroke="#eee"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y(f) + 4:.1f}" text-anchor="end">{f:.1f}</text>')
    parts.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none"'
                 ' stroke="black"/>')
    parts.append(f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 18}" text-anchor="middle">'
                 "round-trip latency (ms, log scale)</text>")
    parts.append(f'<text x="18" y="{TOP + plot_h / 2}" text-anchor="middle"'
                 f' transform="rotate(-90 18 {TOP + plot_h / 2})">fraction of round trips</text>')
    for k, (name, xs) in enumerate(series.items()):
        colour = COLOURS[k % len(COLOURS)]
        points = [f"{x(xs[0]):.1f},{y(0):.1f}"]
        for i, ms in enumerate(xs):
            points.append(f"{x(ms):.1f},{y(i / len(xs)):.1f}")
            points.append(f"{x(ms):.1f},{y((i + 1) / len(xs)):.1f}")
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6"'
                     f' points="{" ".join(points)}"/>')
        ly = TOP + 14 + 16 * k
        parts.append(f'<line x1="{LEFT + 10}" y1="{ly - 4}" x2="{LEFT + 30}" y2="{ly - 4}"'
                     f' stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<text x="{LEFT + 36}" y="{ly}">{escape(name)}'
                     f" (p50 {_median(xs):.1f} ms, n={len(xs)})</text>")
    parts.append("</svg>\n")
    with open(path, "w") as f:
        f.write("\n".join(parts))
