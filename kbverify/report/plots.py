"""SVG plots for the HTML report: fast_p curves over p, and claimed against measured speedup.

Plain SVG strings with no script, no font and no external reference, so the page that holds them stays
self-contained. Each function reads the report summary (`kbverify.report.summary.summarize`) and nothing else.
"""

from __future__ import annotations

import html
import math

from kbverify.core.stats import positive

CLAIMED = "claimed"
PASSED = "passed"
_PALETTE = ("#1b6ca8", "#c0392b", "#2e8b57", "#8e44ad", "#d68910", "#17a2b8")
CLAIMED_COLOUR = "#7f8c8d"
_W, _H = 520, 360
_M = {"left": 56, "right": 16, "top": 16, "bottom": 64}


def protocol_colours(protocols) -> dict[str, str]:
    """One colour per protocol, in order, shared by the curves and the scatter plot."""
    return {name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(protocols)}


def _h(text) -> str:
    return html.escape(str(text), quote=True)


def _times(value: float | None) -> str:
    if value is None:
        return "–"
    digits = 2 if value < 10 else 1 if value < 100 else 0
    return f"{value:.{digits}f}×"


def _svg_open(label: str) -> list[str]:
    # Inline SVG in HTML needs no namespace declaration; leaving it out keeps the page free of any URL.
    return [f'<svg width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
            f'role="img" aria-label="{_h(label)}" font-family="system-ui,sans-serif" font-size="11">',
            f'<rect width="{_W}" height="{_H}" fill="#fff"/>']


def _legend(items: list[tuple[str, str, bool]], y: float) -> list[str]:
    out, x = [], _M["left"]
    for label, colour, dashed in items:
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        out.append(f'<line x1="{x}" y1="{y}" x2="{x + 18}" y2="{y}" stroke="{colour}" stroke-width="2.5"{dash}/>')
        out.append(f'<text x="{x + 23}" y="{y + 4}">{_h(label)}</text>')
        x += 32 + 7 * len(label)
    return out


def svg_fast_p_curves(summary: dict, colours: dict[str, str]) -> str:
    """fast_p(p) step curves for every protocol, and the claimed curve, on one plot."""
    curves = []
    for name in summary["protocols"]:
        curve = summary["by_protocol"][name]["curve"]
        curves.append((name, colours[name], False, curve["measured"], curve["n"]))
    if summary["claimed"]["n"] and summary["protocols"]:
        first = summary["by_protocol"][summary["protocols"][0]]["curve"]
        curves.append((CLAIMED, CLAIMED_COLOUR, True, first["claimed"], first["n"]))
    values = [v for *_, speedups, _ in curves for v in speedups]
    # Long tails (a 368× claim) would flatten the interesting range: cut the axis near the 90th percentile.
    top = sorted(values)[int(0.9 * (len(values) - 1))] if values else 2.0
    p_max = min(10.0, max(2.5, math.ceil(top * 1.1 * 2) / 2))
    plot_w, plot_h = _W - _M["left"] - _M["right"], _H - _M["top"] - _M["bottom"]

    def sx(p: float) -> float:
        return _M["left"] + plot_w * p / p_max

    def sy(share: float) -> float:
        return _M["top"] + plot_h * (1 - share)

    out = _svg_open("fast_p over p")
    step = 0.5 if p_max <= 5 else 1.0
    for i in range(int(p_max / step) + 1):
        p = i * step
        out.append(f'<line x1="{sx(p):.1f}" y1="{sy(0):.1f}" x2="{sx(p):.1f}" y2="{sy(1):.1f}" stroke="#eceff2"/>')
        out.append(f'<text x="{sx(p):.1f}" y="{sy(0) + 14:.1f}" text-anchor="middle">{p:g}</text>')
    for share in (0, 0.25, 0.5, 0.75, 1):
        out.append(f'<line x1="{sx(0):.1f}" y1="{sy(share):.1f}" x2="{sx(p_max):.1f}" y2="{sy(share):.1f}" '
                   f'stroke="#eceff2"/>')
        out.append(f'<text x="{sx(0) - 6:.1f}" y="{sy(share) + 4:.1f}" text-anchor="end">{int(share * 100)}%</text>')
    out.append(f'<rect x="{sx(0):.1f}" y="{sy(1):.1f}" width="{plot_w}" height="{plot_h}" fill="none" '
               f'stroke="#9aa5b1"/>')
    out.append(f'<text x="{sx(p_max / 2):.1f}" y="{sy(0) + 30:.1f}" text-anchor="middle">p (speedup threshold)</text>')
    out.append(f'<text transform="translate(14 {sy(0.5):.1f}) rotate(-90)" text-anchor="middle">fast_p</text>')
    for name, colour, dashed, speedups, n in curves:
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        points = _step_points(speedups, n, p_max)
        path = " ".join(f"{sx(p):.1f},{sy(share):.1f}" for p, share in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2.2"{dash}>'
                   f'<title>{_h(name)}</title></polyline>')
    out += _legend([(name, colour, dashed) for name, colour, dashed, *_ in curves], _H - 14)
    out.append("</svg>")
    return "\n".join(out)


def _step_points(speedups: list[float], n: int, p_max: float) -> list[tuple[float, float]]:
    """Corners of fast_p(p) = #{s > p} / n on [0, p_max]; it drops just after each speedup value."""
    if n == 0:
        return [(0.0, 0.0), (p_max, 0.0)]
    values = sorted(speedups)
    points, p = [], 0.0
    share = sum(v > 0 for v in values) / n
    points.append((0.0, share))
    for v in values:
        if v >= p_max:
            break
        if v <= p:
            continue
        points.append((v, share))
        share = sum(x > v for x in values) / n
        points.append((v, share))
        p = v
    points.append((p_max, share))
    return points


def svg_claimed_vs_measured(summary: dict, colours: dict[str, str]) -> str:
    """Claimed against measured speedup, log–log, one point per verdict that has a claim."""
    points = _claim_points(summary)
    lo, hi = _log_range([c for c, *_ in points] + [m for _, m, *_ in points if m is not None] or [0.5, 2.0])
    plot_w, plot_h = _W - _M["left"] - _M["right"], _H - _M["top"] - _M["bottom"] - 18
    span = math.log10(hi) - math.log10(lo)

    def sx(v: float) -> float:
        return _M["left"] + plot_w * (math.log10(v) - math.log10(lo)) / span

    def sy(v: float) -> float:
        return _M["top"] + plot_h * (1 - (math.log10(v) - math.log10(lo)) / span)

    strip_y = _M["top"] + plot_h + 12
    out = _svg_open("claimed against measured speedup") + _log_grid(sx, sy, lo, hi, strip_y)
    out.append(f'<rect x="{sx(lo):.1f}" y="{sy(hi):.1f}" width="{plot_w}" height="{plot_h}" fill="none" '
               f'stroke="#9aa5b1"/>')
    out.append(f'<line x1="{sx(lo):.1f}" y1="{sy(lo):.1f}" x2="{sx(hi):.1f}" y2="{sy(hi):.1f}" stroke="#9aa5b1" '
               f'stroke-dasharray="4 3"/>')
    out.append(f'<line x1="{sx(lo):.1f}" y1="{sy(1):.1f}" x2="{sx(hi):.1f}" y2="{sy(1):.1f}" stroke="#9aa5b1"/>')
    out.append(f'<text x="{sx(lo) + 4:.1f}" y="{strip_y + 3:.1f}" fill="#5b6875" font-size="9">failed, not timed'
               f'</text>')
    out.append(f'<text x="{sx(math.sqrt(lo * hi)):.1f}" y="{_H - 22}" text-anchor="middle">claimed speedup</text>')
    out.append(f'<text transform="translate(14 {sy(math.sqrt(lo * hi)):.1f}) rotate(-90)" text-anchor="middle">'
               f'measured speedup</text>')
    for claimed, measured, passed, protocol, label in points:
        colour = colours.get(protocol, CLAIMED_COLOUR)
        x = sx(min(max(claimed, lo), hi))
        if measured is None:
            out.append(f'<path d="M{x - 3:.1f},{strip_y - 3:.1f}l6,6m0,-6l-6,6" stroke="{colour}" stroke-width="1.4">'
                       f'<title>{_h(label)}</title></path>')
            continue
        y = sy(min(max(measured, lo), hi))
        fill = colour if passed else "#fff"
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.6" fill="{fill}" fill-opacity="0.75" stroke="{colour}" '
                   f'stroke-width="1.3"><title>{_h(label)}</title></circle>')
    out += _legend([(name, colours[name], False) for name in summary["protocols"]], _H - 6)
    out.append("</svg>")
    return "\n".join(out)


def _claim_points(summary: dict) -> list[tuple]:
    """(claimed, measured | None, passed, protocol, label) for every verdict with a claim."""
    points = []
    for record in summary["verdicts"]:
        claimed = record.get("claimed_speedup")
        if not positive(claimed):
            continue
        measured = record.get("speedup") if positive(record.get("speedup")) else None
        label = (f"{record['task_name']} · {record['protocol']}: claimed {_times(claimed)}, "
                 f"measured {_times(measured)}, {record['status']}")
        points.append((claimed, measured, record["status"] == PASSED, record["protocol"], label))
    return points


def _log_range(values: list[float]) -> tuple[float, float]:
    """Whole decades around every value and 1×."""
    lo = 10 ** math.floor(math.log10(min(min(values), 1.0) * 0.999))
    hi = 10 ** math.ceil(math.log10(max(max(values), 1.0) * 1.001))
    while hi / lo < 100:  # at least two decades, or the grid is a single square
        if lo > 0.01:
            lo /= 10
        else:
            hi *= 10
    return lo, hi


def _log_grid(sx, sy, lo: float, hi: float, strip_y: float) -> list[str]:
    """Minor and decade lines both ways, decades labelled (the x labels below the failed strip)."""
    out = []
    decade = lo
    while decade <= hi * 1.0001:
        for minor in range(2, 10):
            v = decade * minor
            if v < hi:
                out.append(f'<line x1="{sx(v):.1f}" y1="{sy(lo):.1f}" x2="{sx(v):.1f}" y2="{sy(hi):.1f}" '
                           f'stroke="#f3f5f7"/>')
                out.append(f'<line x1="{sx(lo):.1f}" y1="{sy(v):.1f}" x2="{sx(hi):.1f}" y2="{sy(v):.1f}" '
                           f'stroke="#f3f5f7"/>')
        out.append(f'<line x1="{sx(decade):.1f}" y1="{sy(lo):.1f}" x2="{sx(decade):.1f}" y2="{sy(hi):.1f}" '
                   f'stroke="#e1e6eb"/>')
        out.append(f'<line x1="{sx(lo):.1f}" y1="{sy(decade):.1f}" x2="{sx(hi):.1f}" y2="{sy(decade):.1f}" '
                   f'stroke="#e1e6eb"/>')
        out.append(f'<text x="{sx(decade):.1f}" y="{strip_y + 20:.1f}" text-anchor="middle">{decade:g}×</text>')
        out.append(f'<text x="{sx(lo) - 6:.1f}" y="{sy(decade) + 4:.1f}" text-anchor="end">{decade:g}×</text>')
        decade *= 10
    return out
