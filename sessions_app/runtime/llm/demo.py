"""The scripted demo model: what runs when no LLM is configured (no API key anywhere).

It is clearly labelled "demo model" in the API and UI. It plays the support weekly report
task (SCENARIOS S1) through the *real* loop — plan, read, write, validate, complete — by
reading the conversation it is sent, exactly as a model would: its next move depends only on
the request's messages, and the KPIs it writes are computed from the CSV text that `fs_read`
returned to it. Any other request gets an honest explanation that this is a demo model.
"""

from __future__ import annotations

import csv
import io
import json
import re
import statistics
import time
from collections import Counter

from .base import Cancelled, CancelSignal, ModelResult
from .config import EffectiveModel

REPORT_TRIGGER = re.compile(r"\b(report|kpi|tickets?)\b", re.IGNORECASE)
STREAM_CHUNK_DELAY_S = 0.02
CLEANUP_FILE = "draft_to_delete.md"
REPORT_READY = (
    "The weekly support report is ready: **report.html** (headline KPIs, tickets by channel and by category) "
    "and **kpis.csv** (the same figures, one metric per row). Both files were reopened and validated."
)
DEMO_SIGNATURE = " (Produced by the scripted demo model.)"
PLAN_TASKS = [
    "Read tickets.csv",
    "Compute the weekly KPIs and write report.html and kpis.csv",
    "Reopen both files and validate them",
]


def compute_kpis(rows: list[dict]) -> dict:
    """The weekly KPIs of the support report, from parsed CSV rows."""
    resolved = [r for r in rows if r["status"] == "resolved"]
    first_response = [float(r["first_response_minutes"]) for r in rows if r["first_response_minutes"]]
    resolution = [float(r["resolution_hours"]) for r in resolved if r["resolution_hours"]]
    csat = [int(r["csat"]) for r in resolved if r["csat"]]
    opened = sorted(r["opened_at"][:10] for r in rows)
    return {
        "period_start": opened[0] if opened else "",
        "period_end": opened[-1] if opened else "",
        "tickets_total": len(rows),
        "tickets_resolved": len(resolved),
        "tickets_open": sum(1 for r in rows if r["status"] == "open"),
        "tickets_escalated": sum(1 for r in rows if r["status"] == "escalated"),
        "resolution_rate_pct": round(100 * len(resolved) / len(rows), 1) if rows else 0.0,
        "avg_first_response_minutes": round(statistics.mean(first_response), 1) if first_response else 0.0,
        "median_first_response_minutes": round(statistics.median(first_response), 1)
        if first_response
        else 0.0,
        "avg_resolution_hours": round(statistics.mean(resolution), 1) if resolution else 0.0,
        "avg_csat": round(statistics.mean(csat), 2) if csat else 0.0,
        "by_channel": dict(sorted(Counter(r["channel"] for r in rows).items())),
        "by_category": dict(sorted(Counter(r["category"] for r in rows).items())),
    }


def kpis_csv(kpis: dict) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["metric", "value"])
    for key, value in kpis.items():
        if isinstance(value, dict):
            for sub, count in value.items():
                writer.writerow([f"{key}.{sub}", count])
        else:
            writer.writerow([key, value])
    return out.getvalue()


def report_html(kpis: dict) -> str:
    def rows(mapping):
        return "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in mapping.items())

    headline = {
        "Tickets": kpis["tickets_total"],
        "Resolved": kpis["tickets_resolved"],
        "Open": kpis["tickets_open"],
        "Escalated": kpis["tickets_escalated"],
        "Resolution rate (%)": kpis["resolution_rate_pct"],
        "Avg first response (min)": kpis["avg_first_response_minutes"],
        "Median first response (min)": kpis["median_first_response_minutes"],
        "Avg resolution (h)": kpis["avg_resolution_hours"],
        "Avg CSAT (1-5)": kpis["avg_csat"],
    }
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Support weekly report</title>
<style>body{{font-family:system-ui,sans-serif;margin:2rem;color:#1d232b}}table{{border-collapse:collapse;margin:1rem 0}}
td,th{{border:1px solid #dde3ea;padding:.3rem .8rem;text-align:left}}</style></head>
<body>
<h1>Support weekly report</h1>
<p>Week {kpis["period_start"]} to {kpis["period_end"]}. Source: tickets.csv.</p>
<h2>Headline KPIs</h2>
<table id="kpis"><tr><th>KPI</th><th>Value</th></tr>{rows(headline)}</table>
<h2>Tickets by channel</h2>
<table id="by-channel"><tr><th>Channel</th><th>Tickets</th></tr>{rows(kpis["by_channel"])}</table>
<h2>Tickets by category</h2>
<table id="by-category"><tr><th>Category</th><th>Tickets</th></tr>{rows(kpis["by_category"])}</table>
</body></html>
"""


def _strip_read_output(text: str) -> str:
    """Recover file text from an fs_read result (which may number its lines)."""
    lines = text.splitlines()
    numbered = re.compile(r"^\s*\d+[\t|:]\s?")
    if lines and all(numbered.match(line) or not line.strip() for line in lines[: min(5, len(lines))]):
        lines = [numbered.sub("", line, count=1) for line in lines]
    start = next((i for i, line in enumerate(lines) if line.startswith("ticket_id,")), None)
    return "\n".join(lines[start:]) if start is not None else "\n".join(lines)


def _call(index: int, name: str, arguments: dict) -> dict:
    return {"id": f"demo_{name}_{index}", "name": name, "arguments": json.dumps(arguments)}


class DemoModelProvider:
    def __init__(self, model: EffectiveModel):
        self.model = model

    def complete(
        self, messages, tools, *, purpose: str, on_delta=None, cancel: CancelSignal | None = None
    ) -> ModelResult:
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
        task_start = self._task_start(messages)
        if task_start is None or last_user is None:
            return self._say(self._explain(), on_delta, cancel)
        stage = sum(1 for m in messages[task_start:] if m["role"] == "assistant")
        tool_results = [m for m in messages[task_start:] if m["role"] == "tool"]
        if stage == 0:
            return self._tools(
                [_call(0, "plan_create", {"title": "Support weekly KPI report", "tasks": PLAN_TASKS})],
                "I'll plan the report first.",
                on_delta,
                cancel,
            )
        if stage == 1:
            return self._tools(
                [_call(1, "fs_read", {"path": "tickets.csv"})], "Reading the tickets.", on_delta, cancel
            )
        if stage == 2:
            read = tool_results[-1]["content"] if tool_results else ""
            try:
                rows = list(csv.DictReader(io.StringIO(_strip_read_output(read))))
                kpis = compute_kpis(rows)
            except (KeyError, ValueError, csv.Error):
                return self._say(
                    "I could not parse tickets.csv (demo model): " + read[:300], on_delta, cancel
                )
            return self._tools(
                [
                    _call(2, "fs_write", {"path": "report.html", "content": report_html(kpis)}),
                    _call(3, "fs_write", {"path": "kpis.csv", "content": kpis_csv(kpis)}),
                ],
                f"Computed the KPIs for {kpis['tickets_total']} tickets; writing the report.",
                on_delta,
                cancel,
            )
        if stage == 3:
            return self._tools(
                [_call(4, "fs_read", {"path": "report.html"}), _call(5, "fs_read", {"path": "kpis.csv"})],
                "Validating both files.",
                on_delta,
                cancel,
            )
        if stage == 4:
            return self._tools(
                [
                    _call(6 + i, "task_complete", {"task_id": f"t{i + 1}", "summary": title})
                    for i, title in enumerate(PLAN_TASKS)
                ],
                "",
                on_delta,
                cancel,
            )
        wants_cleanup = CLEANUP_FILE in (messages[task_start].get("content") or "")
        if stage == 5 and wants_cleanup:
            return self._tools(
                [_call(9, "fs_delete_files", {"paths": [CLEANUP_FILE]})],
                f"Removing the scratch file {CLEANUP_FILE} as asked.",
                on_delta,
                cancel,
            )
        if wants_cleanup:
            outcome = tool_results[-1]["content"] if tool_results else ""
            cleanup = (
                f" I deleted {CLEANUP_FILE}."
                if outcome.startswith("deleted")
                else f" I did not delete {CLEANUP_FILE}: {outcome[:200]}"
            )
            return self._say(REPORT_READY + cleanup + DEMO_SIGNATURE, on_delta, cancel)
        return self._say(REPORT_READY + DEMO_SIGNATURE, on_delta, cancel)

    @staticmethod
    def _task_start(messages) -> int | None:
        for i in range(len(messages) - 1, -1, -1):
            m = messages[i]
            if (
                m["role"] == "user"
                and REPORT_TRIGGER.search(m.get("content") or "")
                and not m["content"].startswith("[Guidance")
            ):
                return i
        return None

    @staticmethod
    def _explain() -> str:
        return (
            "I am the scripted demo model (no LLM is configured: set OPENAI_API_KEY or add a model "
            "configuration in admin). I can play one task: upload tickets.csv and ask for the weekly "
            "support KPI report."
        )

    def _stream(self, text: str, on_delta, cancel) -> None:
        for start in range(0, len(text), 12):
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            if on_delta is not None:
                on_delta(text[start : start + 12])
            time.sleep(STREAM_CHUNK_DELAY_S)

    def _usage(self, messages_text: str, output: str) -> dict:
        return {"prompt_tokens": (len(messages_text) + 3) // 4, "completion_tokens": (len(output) + 3) // 4}

    def _say(self, text, on_delta, cancel) -> ModelResult:
        self._stream(text, on_delta, cancel)
        return ModelResult(text=text, finish_reason="stop", usage=self._usage("", text))

    def _tools(self, calls, text, on_delta, cancel) -> ModelResult:
        if text:
            self._stream(text, on_delta, cancel)
        arguments = "".join(c["arguments"] for c in calls)
        return ModelResult(
            text=text, tool_calls=calls, finish_reason="tool_calls", usage=self._usage("", arguments + text)
        )
