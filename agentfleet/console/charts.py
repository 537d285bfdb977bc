"""Charts as inline SVG, drawn here from numbers: no JavaScript library, nothing fetched, readable without
scripts. Every label is escaped; the numbers are the only input."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

WIDTH, HEIGHT, PAD = 640, 180, 28
COLOURS = ("#2f6fde", "#d9534f", "#3a9d5d", "#e0a100")


def _scale(top: float) -> float:
    return top if top > 0 else 1.0  # all zero: bars of no height, and the axis still says 0


def bars(title: str, labels: Sequence[str], values: Sequence[float], *, unit: str = "",
         stacked: Sequence[float] | None = None) -> Markup:
    """A bar per value; ``stacked``: a second value per bar drawn over its base in the second colour (failed runs
    within all runs)."""
    highest = max(values, default=0.0)
    top = _scale(highest)
    n = max(len(values), 1)
    step = (WIDTH - 2 * PAD) / n
    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
             f'<text x="{PAD}" y="14" class="chart-title">{escape(title)}</text>',
             f'<text x="{WIDTH - PAD}" y="14" text-anchor="end" class="chart-axis">max {_fmt(highest)}{escape(unit)}'
             '</text>']
    base = HEIGHT - PAD
    for i, v in enumerate(values):
        h = (HEIGHT - 2 * PAD) * v / top
        x = PAD + i * step
        tip = f"{labels[i] if i < len(labels) else ''}: {_fmt(v)}{unit}"
        parts.append(f'<rect x="{x + 1:.1f}" y="{base - h:.1f}" width="{max(step - 2, 1):.1f}" height="{h:.1f}" '
                     f'fill="{COLOURS[0]}"><title>{escape(tip)}</title></rect>')
        if stacked is not None and i < len(stacked) and stacked[i]:
            hs = (HEIGHT - 2 * PAD) * stacked[i] / top
            parts.append(f'<rect x="{x + 1:.1f}" y="{base - hs:.1f}" width="{max(step - 2, 1):.1f}" '
                         f'height="{hs:.1f}" fill="{COLOURS[1]}"><title>{escape(f"failed: {stacked[i]:g}")}</title>'
                         '</rect>')
    parts += [*_x_labels(labels, step), "</svg>"]
    return Markup("".join(parts))


def lines(title: str, labels: Sequence[str], series: dict[str, Sequence[float]], *, unit: str = "") -> Markup:
    """One polyline per series over shared x labels, with a legend."""
    highest = max((v for vs in series.values() for v in vs), default=0.0)
    top = _scale(highest)
    n = max(max((len(vs) for vs in series.values()), default=0), 2)
    step = (WIDTH - 2 * PAD) / (n - 1)
    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
             f'<text x="{PAD}" y="14" class="chart-title">{escape(title)}</text>',
             f'<text x="{WIDTH - PAD}" y="14" text-anchor="end" class="chart-axis">max {_fmt(highest)}{escape(unit)}'
             '</text>']
    for k, (name, values) in enumerate(series.items()):
        colour = COLOURS[k % len(COLOURS)]
        points = " ".join(f"{PAD + i * step:.1f},{HEIGHT - PAD - (HEIGHT - 2 * PAD) * v / top:.1f}"
                          for i, v in enumerate(values))
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>')
        parts.append(f'<text x="{PAD + 8 + 110 * k}" y="{HEIGHT - 4}" fill="{colour}" class="chart-axis">'
                     f'{escape(name)}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _x_labels(labels: Sequence[str], step: float) -> list[str]:
    if not labels:
        return []
    every = max(1, len(labels) // 6)
    return [f'<text x="{PAD + i * step:.1f}" y="{HEIGHT - PAD + 14}" class="chart-axis">{escape(label)}</text>'
            for i, label in enumerate(labels) if i % every == 0]


def _fmt(value: float) -> str:
    if value and abs(value) < 0.01:
        return f"{value:.2g}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")
