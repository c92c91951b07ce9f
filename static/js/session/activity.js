/* The activity log: every event, newest last, in a few words.
 */
import { decisionStatus } from "./approvals.js";
import { $, MAX_LOG_ENTRIES, clockTime, el, names, statusLabel, ui } from "./ctx.js";
import { nearBottom } from "./timeline.js";
import { capabilityParts } from "./turn_notes.js";

// --- activity log ---------------------------------------------------------------------------

export function eventDetail(event) {
  const d = event.data || {};
  switch (event.type) {
    case "session.status":
      return d.reason ? `${d.status} — ${d.reason}` : d.status;
    case "turn.ended":
      return d.detail ? `${d.reason} — ${d.detail}` : d.reason;
    case "message.committed":
      return `${d.role} #${d.message_id}`;
    case "tool.started":
      return d.tool;
    case "tool.ended":
      return `${d.tool} ${d.ok ? "ok" : "error"}${d.summary ? " — " + d.summary : ""}`;
    case "model.ended":
      return d.error ? `${d.finish_reason || "error"} — ${d.error}` : d.finish_reason;
    case "input.queued":
      return d.kind;
    case "file.changed":
      return `${d.op} ${d.path}${d.by ? " by " + d.by : ""}`;
    case "compaction.started":
      return `${d.messages || "?"} messages, ~${d.tokens_before || "?"} tokens`;
    case "compaction.discarded":
      return d.reason || "";
    case "compaction.committed":
      return `${d.method}${d.reason ? " — " + d.reason : ""} (~${d.tokens_before} → ${d.tokens_after} tokens)`;
    case "delivery.recorded":
      return `${d.checks_ok ? "checks ok" : "checks failed"}${d.unresolved ? `, ${d.unresolved} unresolved` : ""}`;
    case "approval.requested":
      return `${d.tool} (${d.risk}) #${d.approval_id}`;
    case "approval.decided":
      return `#${d.approval_id} ${decisionStatus(d.decision)}${d.by ? " by " + d.by : ""}`;
    case "input.requested":
      return `${d.server} #${d.request_id}`;
    case "input.answered":
      return `#${d.request_id} ${d.action}${d.by ? " by " + d.by : ""}`;
    case "plan.updated":
      return d.plan ? d.plan.title : "";
    case "error":
      return `${d.code}: ${d.message}`;
    case "session.recovered":
      return d.next ? `next: ${d.next}` : "";
    case "capabilities.added":
      return capabilityParts(d).map(({ label, names }) => `${label} ${names.join(", ")}`).join("; ");
    case "task.understood":
      return `${statusLabel(d.task_relation)}${d.mode ? ` → ${d.mode}` : ""}`;
    case "orchestration.finished": {
      const added = capabilityParts(d.added).map(({ label, names }) => `${label} ${names.join(", ")}`).join("; ");
      return `${d.mode || ""}: ${added || "nothing added"}`;
    }
    case "goals.updated":
      return d.by ? `by ${d.by}` : "";
    case "memory.recalled": {
      const ids = Array.isArray(d.memory_ids) ? d.memory_ids : [];
      return `${ids.length} memor${ids.length === 1 ? "y" : "ies"}${ids.length ? ` (#${ids.join(", #")})` : ""}`;
    }
    case "goal.started":
      return `up to ${d.max_rounds} rounds — ${d.goal}`;
    case "goal.decided":
      return `round ${d.round}: ${d.decision} — ${d.reason}`;
    case "goal.paused":
      return d.reason || "";
    case "goal.resumed":
      return d.by ? `by ${d.by}` : "";
    default:
      return "";
  }
}

export function logEvent(event) {
  const detail = eventDetail(event);
  ui.log.append(
    el(
      "li",
      { className: "event", dataset: { type: event.type, seq: event.seq } },
      el("span", { className: "event-seq", text: `#${event.seq}` }),
      el("span", { className: "event-type", text: event.type }),
      el("span", { className: "event-detail", text: detail, attrs: { title: detail || null } }),
      el("time", { className: "event-time", attrs: { datetime: event.ts }, text: clockTime(event.ts) })
    )
  );
  while (ui.log.children.length > MAX_LOG_ENTRIES) ui.log.firstElementChild.remove();
  ui.logCount.textContent = `${event.seq} events`;
  const box = ui.log;
  if (nearBottom(box)) box.scrollTop = box.scrollHeight;
}
