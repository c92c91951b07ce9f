"""A figure: one number of the report, with its unit and the target it is read against.

Figures travel as plain dicts (child → parent → results JSON), built only through `figure()`.
"""

from __future__ import annotations

OPERATORS = {"<=": "≤", ">=": "≥"}


def target(op: str, limit: float, unit: str = "") -> dict:
    return {"op": op, "limit": limit, "text": f"{OPERATORS[op]} {limit:g}{(' ' + unit) if unit else ''}"}


def figure(label: str, value: float | None, unit: str = "", goal: dict | None = None, note: str = "") -> dict:
    """`value` None means "not measured" (the note says why); it is printed, never dropped."""
    return {"label": label, "value": value, "unit": unit, "target": goal, "note": note}


def verdict(fig: dict) -> str:
    """✓ / ✗ against the target; blank when there is none or nothing was measured."""
    goal, value = fig.get("target"), fig.get("value")
    if goal is None or value is None:
        return ""
    met = value <= goal["limit"] if goal["op"] == "<=" else value >= goal["limit"]
    return "✓" if met else "✗"


def render_value(fig: dict) -> str:
    value = fig.get("value")
    if value is None:
        return fig.get("note") or "n/a"
    digits = 0 if abs(value) >= 1000 or float(value).is_integer() else 1 if abs(value) >= 10 else 2
    text = f"{value:,.{digits}f}{(' ' + fig['unit']) if fig.get('unit') else ''}"
    mark = verdict(fig)
    return f"{text} {mark}" if mark else text
