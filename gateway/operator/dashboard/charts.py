"""The overview's bar charts: the geometry of inline SVG (no script), drawn by ``templates/macros.html``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any


def _nice(peak: int) -> int:
    # The axis top: the peak rounded up to 1, 2 or 5 times a power of ten.
    if peak <= 0:
        return 1
    magnitude: int = 10 ** int(math.log10(peak))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= peak)


def chart(
    title: str, rows: Sequence[Mapping[str, Any]], field: str, color: str, bucket: timedelta
) -> dict[str, Any]:
    """The geometry of a bar chart with axes, labels and its total, one bar per bucket."""
    width, height, left, right, top, bottom = 400, 170, 34, 8, 8, 34
    base = height - bottom
    values = [int(r[field]) for r in rows]
    peak = max(values, default=0)
    axis_top = _nice(peak)
    step = (width - left - right) / max(len(rows), 1)
    hourly = bucket < timedelta(days=1)
    pattern = "%m-%d %H:%M" if hourly else "%Y-%m-%d"

    def label(t: datetime) -> str:
        return t.astimezone(UTC).strftime(pattern)

    bars = []
    for i, (row, value) in enumerate(zip(rows, values, strict=True)):
        h = (base - top) * value / axis_top
        bars.append(
            {
                "x": f"{left + i * step + 0.5:.1f}",
                "y": f"{base - h:.1f}",
                "w": f"{max(step - 1, 1):.1f}",
                "h": f"{h:.1f}",
                "label": label(row["bucket"]),
                "value": value,
            }
        )
    marks = [0, axis_top // 2, axis_top] if axis_top % 2 == 0 else [0, axis_top]
    yticks = [{"y": round(base - (base - top) * v / axis_top, 1), "label": v} for v in marks]
    xticks = []
    for i, anchor in ((0, "start"), (len(rows) // 2, "middle"), (len(rows) - 1, "end")):
        if rows and (i > 0 or anchor == "start"):
            x = left + i * step + (step / 2 if anchor == "middle" else 0 if anchor == "start" else step)
            xticks.append({"x": f"{x:.1f}", "anchor": anchor, "label": label(rows[i]["bucket"])})
    return {
        "title": title,
        "total": sum(values),
        "peak": peak,
        "per": "hour" if hourly else "day",
        "color": color,
        "width": width,
        "height": height,
        "left": left,
        "right": right,
        "top": top,
        "base": base,
        "bars": bars,
        "yticks": yticks,
        "xticks": xticks,
    }
