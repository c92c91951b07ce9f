"""The Usage page's charts, drawn on the server as SVG geometry: no chart library, no CDN, and a
page that shows its figures with scripts off. A chart is a list of bars scaled to its largest
value; the template (workspace/usage.html) turns them into <rect>s with a <title> each."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, timedelta

WIDTH = 640
DAY_CHART_HEIGHT = 180
ROW_HEIGHT = 26
LABEL_WIDTH = 160
MAX_ROWS = 12  # the rest of a ranking shows in its table, not as bars


@dataclass
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str
    value: float
    text: str  # what the bar's <title> and the table say


@dataclass
class Chart:
    width: int
    height: int
    bars: list[Bar] = field(default_factory=list)
    # For the daily chart: cost as a line over the token bars ("x,y x,y …").
    line: str = ""
    peak_text: str = ""


def _tokens(row: dict) -> int:
    return row["prompt_tokens"] + row["completion_tokens"]


def every_day(rows: list[dict], first: date, last: date) -> list[dict]:
    """`rows` (group_by=day) with an empty row for each day of the period that has none: the
    chart's time axis is the period, not the days that happen to have calls."""
    by_day = {row["key"]: row for row in rows}
    empty = {"prompt_tokens": 0, "cached_prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0, "calls": 0}
    days = []
    day = first
    while day <= last:
        days.append(by_day.get(day.isoformat(), {"key": day.isoformat(), **empty}))
        day += timedelta(days=1)
    return days


def daily(rows: list[dict], currency: str) -> Chart:
    """Tokens per day as columns, cost per day as a line, both scaled to their own maximum
    (`rows`: one per day of the period, `every_day`)."""
    chart = Chart(WIDTH, DAY_CHART_HEIGHT)
    if not rows:
        return chart
    slot = WIDTH / len(rows)
    top_tokens = max(_tokens(r) for r in rows) or 1
    top_cost = max(r["cost"] for r in rows)
    points = []
    for index, row in enumerate(rows):
        height = DAY_CHART_HEIGHT * _tokens(row) / top_tokens
        x = index * slot
        if top_cost:
            y = DAY_CHART_HEIGHT - DAY_CHART_HEIGHT * row["cost"] / top_cost
            points.append(f"{round(x + slot / 2, 2)},{round(y, 2)}")
        if not row["calls"]:
            continue
        chart.bars.append(
            Bar(
                x=round(x + slot * 0.15, 2),
                y=round(DAY_CHART_HEIGHT - height, 2),
                width=round(slot * 0.7, 2),
                height=round(height, 2),
                label=row["key"],
                value=_tokens(row),
                text=f"{row['key']}: {_tokens(row):,} tokens, {row['cost']:.4f} {currency}",
            )
        )
    chart.line = " ".join(points)
    chart.peak_text = f"{top_tokens:,} tokens"
    return chart


def ranking(rows: list[dict], currency: str) -> Chart:
    """The largest consumers as horizontal bars: by cost when anything is priced, else by tokens."""
    shown = rows[:MAX_ROWS]
    chart = Chart(WIDTH, max(len(shown), 1) * ROW_HEIGHT)
    priced = any(r["cost"] for r in shown)

    def value(row):
        return row["cost"] if priced else _tokens(row)

    top = max((value(r) for r in shown), default=0) or 1
    for index, row in enumerate(shown):
        width = (WIDTH - LABEL_WIDTH) * value(row) / top
        chart.bars.append(
            Bar(
                x=LABEL_WIDTH,
                y=index * ROW_HEIGHT + 4,
                width=round(width, 2),
                height=ROW_HEIGHT - 8,
                label=row.get("title") or row["key"],
                value=value(row),
                text=f"{row.get('title') or row['key']}: {_tokens(row):,} tokens, {row['cost']:.4f} {currency}",
            )
        )
    return chart
