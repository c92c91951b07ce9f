"""The scripted demo model: what runs when no LLM is configured (no API key anywhere).

It is clearly labelled "demo model" in the API and UI. It plays the support weekly report
task (SCENARIOS S1, and the clean-up of S2 when asked) through the *real* loop — plan, read,
write, reopen, complete — by reading the conversation it is sent, exactly as a model would: its
next move depends only on the request's messages. It finds the results of its own calls by
`tool_call_id`, stops at the first call that failed and says which one and why, and never
claims a report it did not make. The KPIs it writes (and quotes) are computed from the CSV text
that `fs_read` returned to it. Any other request gets an honest explanation that this is a demo
model.

A failed call is recognised from the result text alone, since a tool message on the wire carries
no error flag: ToolService words every refusal as "error in <stage> (<code>): <message>", and a
call that never ran (rejected or expired approval, interrupt) starts with "Not run:" or
"Interrupted:". Results the demo relies on are also checked for their success shape.
"""

from __future__ import annotations

import csv
import io
import json
import re
import statistics
import time
import uuid
from collections import Counter
from dataclasses import dataclass

from .base import Cancelled, CancelSignal, ModelResult
from .config import EffectiveModel

# A line of the offered Skills (engine.skills_text) for a support report Skill.
OFFERED_REPORT_SKILL = re.compile(r"^- (support-[a-z0-9-]*report[a-z0-9-]*): ", re.MULTILINE)
REPORT_TRIGGER = re.compile(r"\b(report|kpi|tickets?)\b", re.IGNORECASE)
STREAM_CHUNK_DELAY_S = 0.02
SOURCE_FILE = "tickets.csv"
REPORT_FILE = "report.html"
KPIS_FILE = "kpis.csv"
CLEANUP_FILE = "draft_to_delete.md"
DEMO_SIGNATURE = " (Produced by the scripted demo model.)"
PLAN_TASKS = [
    "Read tickets.csv",
    "Compute the weekly KPIs and write report.html and kpis.csv",
    "Reopen both files and check them",
]

# How ToolService and the runtime word a call that failed or never ran (see the module docstring).
FAILED_RESULT = re.compile(r"^(?:error in [\w.-]+ \([\w.-]+\):\s*|(?=Not run:)|(?=Interrupted:))")
WRITE_OK = re.compile(r"^(?:created|modified) ")
DELETE_OK = re.compile(r"^deleted [1-9]\d* files?:")
READ_LINE = re.compile(r"^\s*(\d+)\t(.*)$")
READ_MORE = re.compile(r"call fs_read with offset=(\d+) to continue")


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


@dataclass(frozen=True)
class _Call:
    """One tool call the demo made, with its result as the messages show it (None: no result)."""

    id: str
    name: str
    arguments: dict
    result: str | None

    @property
    def path(self) -> str | None:
        return self.arguments.get("path")

    @property
    def failed(self) -> bool:
        return self.result is None or FAILED_RESULT.match(self.result) is not None

    @property
    def error(self) -> str:
        """The reason a failed call gives, in one line, without ToolService's stage prefix."""
        if self.result is None:
            return "no result was recorded for the call"
        line = " ".join(FAILED_RESULT.sub("", self.result, count=1).split())
        return line if len(line) <= 300 else line[:299] + "…"


def _calls_since(messages: list[dict], start: int) -> list[_Call]:
    """The tool calls of the assistant messages after `start`, each matched to its result by id."""
    later = messages[start + 1 :]
    results = {m.get("tool_call_id"): m.get("content") or "" for m in later if m["role"] == "tool"}
    calls = []
    for message in later:
        if message["role"] != "assistant":
            continue
        for spec in message.get("tool_calls") or []:
            function = spec.get("function") or spec  # the wire shape, or the stored one
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except (TypeError, ValueError):
                arguments = {}
            calls.append(
                _Call(
                    id=spec["id"],
                    name=function.get("name", ""),
                    arguments=arguments if isinstance(arguments, dict) else {},
                    result=results.get(spec["id"]),
                )
            )
    return calls


def _failure(call: _Call | None, success: re.Pattern | None = None) -> str:
    """Why `call` did not do its job ("" when it did): no call or result, a failed call, or a
    result without the shape a success has."""
    if call is None:
        return "the call was not made"
    if call.failed:
        return call.error
    if success is not None and not success.match(call.result):
        return "unexpected result: " + call.error
    return ""


def _last(calls: list[_Call], name: str, path: str | None = None) -> _Call | None:
    for call in reversed(calls):
        if call.name == name and (path is None or call.path == path):
            return call
    return None


def _read_text(calls: list[_Call]) -> tuple[str, int | None]:
    """The file text fs_read returned over one or more pages (lines come numbered), and the
    offset to read next when the last page says there is more."""
    lines: dict[int, str] = {}
    for call in calls:
        for line in (call.result or "").split("\n"):
            numbered = READ_LINE.match(line)
            if numbered:
                lines[int(numbered.group(1))] = numbered.group(2)
    more = READ_MORE.search(calls[-1].result or "") if calls else None
    text = "\n".join(lines[n] for n in sorted(lines))
    return text, int(more.group(1)) if more else None


def _call(name: str, arguments: dict) -> dict:
    # Unique per call, like a real model's ids: the UI and the audit trail key on them.
    return {"id": f"call_{uuid.uuid4().hex}", "name": name, "arguments": json.dumps(arguments)}


def _headline(kpis: dict) -> str:
    return (
        f"{kpis['tickets_total']} tickets from {kpis['period_start']} to {kpis['period_end']}, "
        f"{kpis['tickets_resolved']} resolved (resolution rate {kpis['resolution_rate_pct']}%), "
        f"average first response {kpis['avg_first_response_minutes']} minutes, "
        f"average CSAT {kpis['avg_csat']} out of 5"
    )


# How the demo's answer opens when the report is written and checked (its goal-run claim reads it).
REPORT_DONE = "The weekly support report is in"


class DemoModelProvider:
    def __init__(self, model: EffectiveModel):
        self.model = model

    def complete(
        self, messages, tools, *, purpose: str, on_delta=None, cancel: CancelSignal | None = None
    ) -> ModelResult:
        if purpose == "summary":
            return self._say(json.dumps(self._summary(messages)), None, cancel)
        if purpose == "task_relation":
            return self._say(json.dumps(self._task_relation(messages)), None, cancel)
        if purpose == "orchestrate":
            return self._say(json.dumps(self._orchestrate(messages)), None, cancel)
        task_start = self._task_start(messages)
        if task_start is None:
            return self._say(self._explain(), on_delta, cancel)
        request = messages[task_start].get("content") or ""
        calls = _calls_since(messages, task_start)
        skill = self._offered_skill(messages, tools)
        if skill and not calls:
            # As a model would: a Skill offered for this very task is loaded before starting it.
            text, tool_calls = (
                f"Loading the {skill} skill first: it describes this report.",
                [_call("skills_load", {"skills": [skill]})],
            )
        else:
            text, tool_calls = self._next_move(request, calls)
            if not tool_calls and self._claims_goal(tools, calls):
                # In a goal run's round, as the seed asks: the claim first, the closing answer after.
                done = text.startswith(REPORT_DONE)
                reason = (
                    f"{REPORT_FILE} and {KPIS_FILE} are written and reopened"
                    if done
                    else text.split(". ")[0].rstrip(".")
                )
                return self._tools(
                    [_call("update_goal", {"status": "complete" if done else "blocked", "reason": reason})],
                    "",
                    on_delta,
                    cancel,
                )
        if tool_calls:
            return self._tools(tool_calls, text, on_delta, cancel)
        return self._say(text + DEMO_SIGNATURE, on_delta, cancel)

    @staticmethod
    def _claims_goal(tools, calls: list[_Call]) -> bool:
        """update_goal is offered (a goal run's round) and this round has not used it yet."""
        offered = {(tool.get("function") or {}).get("name") for tool in tools or []}
        return "update_goal" in offered and not any(call.name == "update_goal" for call in calls)

    def _next_move(self, request: str, calls: list[_Call]) -> tuple[str, list[dict]]:
        """What to do next given the calls made for this request so far: (text, tool calls)."""
        plan = _last(calls, "plan_create")
        if plan is None:
            return "I'll plan the report first.", [
                _call("plan_create", {"title": "Support weekly KPI report", "tasks": PLAN_TASKS})
            ]

        reads = [c for c in calls if c.name == "fs_read" and c.path == SOURCE_FILE]
        if not reads:
            return "Reading the tickets.", [_call("fs_read", {"path": SOURCE_FILE})]
        if reads[-1].failed:
            return (
                f"I could not read {SOURCE_FILE}: {reads[-1].error}. I have not written a report. "
                f"Upload {SOURCE_FILE} to the workspace and ask again."
            ), []
        source, next_offset = _read_text(reads)
        if next_offset is not None:
            return "", [_call("fs_read", {"path": SOURCE_FILE, "offset": next_offset})]
        try:
            rows = list(csv.DictReader(io.StringIO(source)))
            kpis = compute_kpis(rows) if rows else None
        except (KeyError, ValueError, TypeError, csv.Error) as exc:
            missing = f" (missing column {exc})" if isinstance(exc, KeyError) else ""
            return (
                f"I read {SOURCE_FILE} but could not compute the KPIs from it{missing}. I have not "
                "written a report. It needs the columns ticket_id, opened_at, channel, category, status, "
                "first_response_minutes, resolution_hours and csat."
            ), []
        if kpis is None:
            return f"{SOURCE_FILE} holds no tickets, so I have not written a report.", []

        outputs = {REPORT_FILE: report_html(kpis), KPIS_FILE: kpis_csv(kpis)}
        writes = {path: _last(calls, "fs_write", path) for path in outputs}
        if all(call is None for call in writes.values()):
            return f"Computed the KPIs for {kpis['tickets_total']} tickets; writing the report.", [
                _call("fs_write", {"path": path, "content": content}) for path, content in outputs.items()
            ]
        problems = [
            f"could not write {path}: {_failure(call, WRITE_OK)}"
            for path, call in writes.items()
            if _failure(call, WRITE_OK)
        ]
        if problems:
            written = [path for path, call in writes.items() if not _failure(call, WRITE_OK)]
            return self._unfinished(kpis, problems, written), []

        rereads = {path: _last(calls, "fs_read", path) for path in outputs}
        if all(call is None for call in rereads.values()):
            return "Reopening both files to check them.", [
                _call("fs_read", {"path": path}) for path in outputs
            ]
        expected = {
            REPORT_FILE: f"<td>{kpis['tickets_total']}</td>",
            KPIS_FILE: f"tickets_total,{kpis['tickets_total']}",
        }
        problems = []
        for path, call in rereads.items():
            if _failure(call):
                problems.append(f"could not reopen {path}: {_failure(call)}")
            elif expected[path] not in call.result:
                problems.append(f"reopened {path} and it does not hold the figures I wrote")
        if problems:
            return self._unfinished(kpis, problems, list(outputs)), []

        notes = []
        if plan.failed:
            notes.append(f"I could not keep a plan ({plan.error}).")
        else:
            completions = [c for c in calls if c.name == "task_complete"]
            if not completions:
                summaries = [
                    f"Read {kpis['tickets_total']} tickets from {SOURCE_FILE}",
                    f"Wrote {REPORT_FILE} and {KPIS_FILE}",
                    f"Reopened {REPORT_FILE} and {KPIS_FILE}; both hold the computed figures",
                ]
                return "", [
                    _call("task_complete", {"task_id": task_id, "summary": summary})
                    for task_id, summary in zip(self._task_ids(plan), summaries, strict=True)
                ]
            not_marked = [c for c in completions if c.failed]
            if not_marked:
                notes.append(f"I could not mark every plan task done ({not_marked[0].error}).")

        if CLEANUP_FILE in request:
            cleanup = _last(calls, "fs_delete_files")
            if cleanup is None:
                return f"Removing the scratch file {CLEANUP_FILE} as asked.", [
                    _call("fs_delete_files", {"paths": [CLEANUP_FILE]})
                ]
            if _failure(cleanup, DELETE_OK):
                notes.append(f"I did not delete {CLEANUP_FILE}: {_failure(cleanup, DELETE_OK)}")
            else:
                notes.append(f"I deleted {CLEANUP_FILE}.")

        answer = (
            f"{REPORT_DONE} **{REPORT_FILE}** (headline KPIs, tickets by channel and by "
            f"category) and **{KPIS_FILE}** (the same figures, one metric per row); I reopened both files "
            f"after writing them. Headline numbers: {_headline(kpis)}."
        )
        return " ".join([answer, *notes]), []

    @staticmethod
    def _unfinished(kpis: dict, problems: list[str], written: list[str]) -> str:
        text = (
            f"The report is not finished. I read {SOURCE_FILE} ({kpis['tickets_total']} tickets), but I "
            + "; and I ".join(problems)
            + "."
        )
        if written:
            text += f" Written: {', '.join(written)}."
        return text + " Fix the problem and ask again."

    @staticmethod
    def _task_ids(plan: _Call) -> list[str]:
        """The ids plan_create gave the tasks (its result is the plan as JSON)."""
        try:
            ids = [str(task["id"]) for task in json.loads(plan.result or "")["tasks"]]
        except (ValueError, TypeError, KeyError):
            ids = []
        return ids if len(ids) == len(PLAN_TASKS) else [f"t{i}" for i in range(1, len(PLAN_TASKS) + 1)]

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
    def _summary(messages) -> dict:
        """A continuity state for a `summary` call (CONTRACT shape), made from the request alone:
        the goals it was given and the lines of the transcript that name calls."""
        text = messages[-1].get("content") or "" if messages else ""
        head, _, transcript = text.partition("\n\nMessages to compress, oldest first:\n")
        try:
            goals = json.loads(head).get("goals") or {}
        except ValueError:
            goals = {}
        calls = [line[:200] for line in transcript.splitlines() if "| calls:" in line]
        requests = [line[7:500] for line in transcript.splitlines() if line.startswith("[user] ")]
        return {
            "goal": goals.get("phase_goal") or goals.get("session_goal") or "",
            "deliverables": [],
            "progress": [f"{len(transcript.splitlines())} earlier messages compacted by the demo model."]
            + calls[-10:],
            "decisions": [],
            "constraints": [],
            "open_questions": [],
            "next_actions": [],
            "artifacts": [],
            "active_user_request": requests[-1] if requests else "",
        }

    @staticmethod
    def _task_relation(messages) -> dict:
        """The four-field answer (CONTRACT), as a rule of thumb: the first task is new, a message
        starting "continue" continues it, one sharing no word with the goals is out of scope,
        anything else is a new phase of the same goal; the message's own words are the recall
        terms."""
        try:
            asked = json.loads(messages[-1].get("content") or "{}")
        except ValueError:
            asked = {}
        text = str(asked.get("message") or "")
        words = list(dict.fromkeys(w for w in re.findall(r"[a-z0-9]{4,}", text.lower())))[:8]
        goals = f"{asked.get('session_goal') or ''} {asked.get('current_phase_goal') or ''}".lower()
        if not asked.get("current_phase_goal"):
            relation = "new_task"
        elif re.match(r"\s*(continue|go on|keep going)\b", text, flags=re.IGNORECASE):
            relation = "continue_current"
        elif not any(word in goals for word in words):
            relation = "out_of_scope"  # shares no word with the goals
        else:
            relation = "change_within_session"
        return {
            "task_relation": relation,
            "skill_recall_terms": words,
            "tool_recall_terms": words,
            "memory_recall_terms": words,
        }

    @staticmethod
    def _orchestrate(messages) -> dict:
        """Choose the best-ranked candidate Skill, nothing else (the demo has no tool sets to add)."""
        try:
            candidates = json.loads(messages[-1].get("content") or "{}").get("candidates") or {}
        except (ValueError, AttributeError):
            candidates = {}
        skills = [s["name"] for s in candidates.get("skills") or []][:1]
        return {"skills": skills, "toolsets": [], "tools": []}

    @staticmethod
    def _offered_skill(messages, tools) -> str | None:
        """The name of a Skill offered (not yet loaded) for the support report, if the request
        offers one and skills_load is among the tools."""
        names = {(t.get("function") or {}).get("name") for t in tools or ()}
        if "skills_load" not in names or not messages or messages[0].get("role") != "system":
            return None
        offered = OFFERED_REPORT_SKILL.search(messages[0].get("content") or "")
        return offered.group(1) if offered else None

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
