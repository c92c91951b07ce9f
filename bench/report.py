"""The printed table and the results file.

One row per figure, one column per database, the target last; a figure that misses its
target is printed with ✗ like any other.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from .figures import figure, render_value, target

RESULTS_DIR = Path(__file__).resolve().parent / "results"
PG_WITHIN = 1.5  # PostgreSQL + Redis within 1.5× of SQLite (issue #10)


def comparison_figures(results: dict) -> list[dict]:
    """PostgreSQL / SQLite ms per step for scenario 1, where both ran."""
    sqlite = _by_label(results, "sqlite", "steps")
    postgres = _by_label(results, "postgresql", "steps")
    rows = []
    for label, fig in sqlite.items():
        if "ms/step, mean" in label and label in postgres:
            ratio = _ratio(postgres[label]["value"], fig["value"])
            rows.append(
                figure(
                    f"{label.split(':')[0]}: PostgreSQL / SQLite", ratio, "×", target("<=", PG_WITHIN, "×")
                )
            )
    return rows


def render(results: dict, titles: dict[str, str], backend_labels: dict[str, str]) -> str:
    columns = list(backend_labels)
    lines: list[list[str]] = []
    for scenario, title in titles.items():
        lines.append([title])
        lines += _scenario_lines(results, scenario, columns)
    comparison = results.get("comparison", [])
    if comparison:
        # Only when both columns ran; the ratio sits in the PostgreSQL column it describes.
        lines.append(["PostgreSQL + Redis vs SQLite (scenario 1)"])
        lines += [["  " + f["label"], "", render_value(f), f["target"]["text"]] for f in comparison]
    return _table(["figure", *backend_labels.values(), "target"], lines)


def _scenario_lines(results: dict, scenario: str, columns: list[str]) -> list[list[str]]:
    """One line per figure; a column without figures says why (skipped, error) on the first line only."""
    rows = _rows(results, scenario, columns) or [("(no figures)", {})]
    lines = []
    for index, (label, cells) in enumerate(rows):
        goal = next((c["target"]["text"] for c in cells.values() if c.get("target")), "")
        values = [
            render_value(cells[col])
            if col in cells
            else _why_missing(results, col, scenario)
            if index == 0
            else ""
            for col in columns
        ]
        lines.append(["  " + label, *values, goal])
    return lines


def write(payload: dict) -> Path:
    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS_DIR / f"{stamp}.json"
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False))
    return path


def _rows(results: dict, scenario: str, columns: list[str]) -> list[tuple[str, dict]]:
    """Figure labels in the order a backend produced them, each with its figure per backend."""
    rows: dict[str, dict] = {}
    for column in columns:
        for label, fig in _by_label(results, column, scenario).items():
            rows.setdefault(label, {})[column] = fig
    return list(rows.items())


def _why_missing(results: dict, column: str, scenario: str) -> str:
    outcome = results.get(column, {}).get(scenario, {})
    return outcome.get("skipped") or outcome.get("error") or "—"


def _by_label(results: dict, column: str, scenario: str) -> dict[str, dict]:
    outcome = results.get(column, {}).get(scenario, {})
    return {fig["label"]: fig for fig in outcome.get("figures", [])}


def _ratio(numerator, denominator):
    return numerator / denominator if numerator is not None and denominator else None


def _table(header: list[str], lines: list[list[str]]) -> str:
    rows = [line for line in lines if len(line) > 1]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    widths = [min(width, 60) for width in widths]

    def fmt(row):
        return "  ".join(str(cell)[: widths[i]].ljust(widths[i]) for i, cell in enumerate(row)).rstrip()

    rule = "-" * len(fmt(["-" * w for w in widths]))
    out = [fmt(header), rule]
    for line in lines:
        out.append(line[0] if len(line) == 1 else fmt(line))
    return "\n".join(out)
