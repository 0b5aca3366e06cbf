"""Minimal hand-written SVG charts (no matplotlib on the development VM).

line_chart / bar_chart take named series and return an SVG document as a string:
axes with ticks, axis labels, a title and a legend. Missing points (None) are skipped.
"""
import math
from xml.sax.saxutils import escape

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
W, H = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 80, 190, 40, 60


def _nice_ticks(lo, hi, n=5):
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    start = math.floor(lo / step) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 10))
        t += step
    return ticks


def _fmt(v):
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:g}"


def _frame(title, xlabel, ylabel, y_ticks, y0, y1):
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{LEFT + pw / 2}" y="22" text-anchor="middle" font-size="14">{escape(title)}</text>',
           f'<text x="{LEFT + pw / 2}" y="{H - 15}" text-anchor="middle">{escape(xlabel)}</text>',
           f'<text transform="translate(18,{TOP + ph / 2}) rotate(-90)" text-anchor="middle">'
           f'{escape(ylabel)}</text>']
    for t in y_ticks:
        y = TOP + ph - (t - y0) / (y1 - y0) * ph
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + pw}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    out.append(f'<line x1="{LEFT}" y1="{TOP + ph}" x2="{LEFT + pw}" y2="{TOP + ph}" stroke="black"/>')
    out.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + ph}" stroke="black"/>')
    return out


def _legend(names):
    out = []
    for i, name in enumerate(names):
        y = TOP + 10 + i * 18
        x = W - RIGHT + 15
        out.append(f'<rect x="{x}" y="{y - 9}" width="12" height="12" fill="{COLORS[i % len(COLORS)]}"/>')
        out.append(f'<text x="{x + 18}" y="{y + 1}">{escape(name)}</text>')
    return out


def _y_range(values, zero):
    vals = [v for v in values if v is not None]
    if not vals:
        return [0, 1], 0.0, 1.0
    lo = 0.0 if zero else min(vals)
    ticks = _nice_ticks(lo, max(vals))
    return ticks, ticks[0], ticks[-1] if ticks[-1] > ticks[0] else ticks[0] + 1


def line_chart(title, xlabel, ylabel, xs, series, log_x=False, zero=True):
    """xs: x values; series: {name: [y or None per x]}."""
    ticks, y0, y1 = _y_range([v for ys in series.values() for v in ys], zero)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    fx = (lambda v: math.log2(v)) if log_x else float
    x0, x1 = fx(min(xs)), fx(max(xs))
    span = (x1 - x0) or 1.0

    def px(x):
        return LEFT + 10 + (fx(x) - x0) / span * (pw - 20)

    def py(y):
        return TOP + ph - (y - y0) / (y1 - y0) * ph

    out = _frame(title, xlabel, ylabel, ticks, y0, y1)
    for x in xs:
        out.append(f'<text x="{px(x):.1f}" y="{TOP + ph + 16}" text-anchor="middle">{_fmt(x)}</text>')
    for i, (name, ys) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        pts = [(px(x), py(y)) for x, y in zip(xs, ys) if y is not None]
        if len(pts) > 1:
            path = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for a, b in pts:
            out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"/>')
    out += _legend(list(series))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def bar_chart(title, xlabel, ylabel, groups, series):
    """groups: category labels; series: {name: [y or None per group]}, drawn side by side."""
    ticks, y0, y1 = _y_range([v for ys in series.values() for v in ys], True)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    gw = pw / max(len(groups), 1)
    bw = gw * 0.8 / max(len(series), 1)
    out = _frame(title, xlabel, ylabel, ticks, y0, y1)
    for g, label in enumerate(groups):
        out.append(f'<text x="{LEFT + gw * (g + 0.5):.1f}" y="{TOP + ph + 16}" '
                   f'text-anchor="middle">{escape(str(label))}</text>')
        for i, ys in enumerate(series.values()):
            v = ys[g]
            if v is None:
                continue
            h = (v - y0) / (y1 - y0) * ph
            x = LEFT + gw * g + gw * 0.1 + i * bw
            out.append(f'<rect x="{x:.1f}" y="{TOP + ph - h:.1f}" width="{bw:.1f}" height="{h:.1f}" '
                       f'fill="{COLORS[i % len(COLORS)]}"/>')
    out += _legend(list(series))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def stack(charts):
    """One SVG document holding the given charts one above the other."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H * max(len(charts), 1)}">']
    for i, chart in enumerate(charts):
        out.append(f'<g transform="translate(0,{H * i})">')
        out.append(chart)
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"
