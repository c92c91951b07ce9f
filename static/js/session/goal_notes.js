/* The goal driver in the timeline: a run started, each round's decision, pauses and resumes,
 * and the questions MCP servers asked (input requests).
 */
import { note } from "./composer.js";
import { $, ApiError, USERNAME, api, el, excerpt, goalRun, names, state } from "./ctx.js";
import { GOAL_NAMES } from "./goals.js";
import { GOAL_EXCERPT_CHARS, noteItem, quoted } from "./outer_loop.js";
import { goalCard } from "./panels.js";
import { MEMORIES_API, eventNote } from "./turn_notes.js";

// --- the goal driver in the timeline -----------------------------------------------------------

export const { decisionText, formatTokens, formatDuration } = goalRun || {};
export const DECISION_ICONS = { continue: "↻", done: "✓", stop: "■" };

export const plural = (n, word) => `${n} ${word}${Number(n) === 1 ? "" : "s"}`;
export const byWhom = (name) => (name ? ` by ${name === USERNAME ? "you" : name}` : "");

/** A run's round limit: from its `goal.started`, else from the run the card shows. */
export function roundLimit(runId) {
  const key = String(runId);
  if (state.goalRuns.has(key)) return state.goalRuns.get(key);
  const run = goalCard && goalCard.current();
  return run && String(run.id) === key ? run.max_rounds : null;
}

/** `goal.started`: "Goal run started by alice: up to 3 rounds, 200 000 tokens, 1 h — “…”". */
export function goalStartedNote(seq, data, live) {
  state.goalRuns.set(String(data.goal_run_id), data.max_rounds);
  state.goalStarted = { seq, goal: String(data.goal || "") };
  eventNote(seq, data, live, () => {
    const limits = `up to ${plural(data.max_rounds, "round")}, ${formatTokens(data.token_budget)} tokens, ${formatDuration(data.wall_clock_seconds)}`;
    return noteItem(
      "goal-started",
      "goal-note",
      "◎",
      { goalRunId: data.goal_run_id },
      el("p", {}, `Goal run started${byWhom(data.by)}: ${limits} — `, quoted(data.goal || ""))
    );
  });
}

/**
 * Starting a run in a MainSession makes its goal the phase goal (and the session goal when there
 * was none) in the same commit: the run's note says so instead of a "Goals edited" note of its
 * own. Returns whether it did.
 */
export function goalSetByRun(seq, data, before) {
  const started = state.goalStarted;
  if (!started || started.seq !== seq - 1 || data.phase_goal !== started.goal) return false;
  const note = state.eventNotes.get(started.seq);
  if (!note) return false;
  state.eventNotes.set(seq, note); // a replay of this event makes no note either
  // The session goal is the run's only when it had none before (it may be an older one).
  const changed = ["session_goal", "phase_goal"].filter((field) => data[field] === started.goal && (!before || before[field] !== data[field]));
  if (changed.length && !note.querySelector(".goal-set")) {
    const names = changed.map((field) => GOAL_NAMES[field]).join(" and the ");
    note.querySelector(".turn-note-lines").append(el("p", { className: "goal-set muted", text: `It is now the ${names}.` }));
  }
  return true;
}

/** `goal.decided`, after a round (or a person's stop): what the driver decided and why. */
export function goalDecidedNote(seq, data, live) {
  const decision = String(data.decision || "");
  eventNote(seq, data, live, () =>
    noteItem(
      "goal-decided",
      "goal-note",
      DECISION_ICONS[decision] || "•",
      { decision, round: data.round, goalRunId: data.goal_run_id },
      el("p", { text: decisionText(decision, data.round, roundLimit(data.goal_run_id), data.reason, USERNAME) }),
      // A person's stop takes back a round queued and not started yet.
      data.withdrawn_input_id ? el("p", { className: "muted", text: "The round it had queued was taken back before it started." }) : null
    )
  );
}

/** `goal.paused` (after a recovery): a warning, and where to go on. */
export function goalPausedNote(seq, data, live) {
  eventNote(seq, data, live, () => {
    const reason = String(data.reason || "").trim();
    const withdrawn = data.withdrawn_input_id ? " The round it had queued was taken back; resuming queues it again." : "";
    return noteItem(
      "goal-paused",
      "goal-note goal-paused-note",
      "‖",
      { goalRunId: data.goal_run_id, reason: "paused" },
      el("p", { className: "goal-paused-lead", text: `Goal run paused${reason ? `: ${reason}` : ""}.` }),
      el("p", { className: "goal-paused-hint", text: `Nothing runs until someone resumes it: Resume (or Stop) is in the Goal run card.${withdrawn}` })
    );
  });
}

/** `input.requested`: "example asks: …" where the tool call is; the card holds the form. */
export function inputRequestedNote(seq, data, live) {
  const ask = window.xagent.inputRequests;
  const show = (text) => el("bdi", { text: ask ? ask.visibleControls(text) : String(text || "") });
  eventNote(seq, data, live, () =>
    noteItem(
      "input-requested-note",
      "input-note",
      "?",
      { requestId: data.request_id },
      el("p", {}, "The MCP server ", el("code", {}, show(data.server)), " asked: ", el("span", { className: "note-goal" }, "“", show(excerpt(String(data.message || ""), GOAL_EXCERPT_CHARS)), "”"))
    )
  );
}

export const INPUT_OUTCOMES = { accepted: "answered", declined: "declined", cancelled: "cancelled", expired: "expired (declined)" };

/** `input.answered`: how the server's question ended, and by whom. */
export function inputAnsweredNote(seq, data, live) {
  const status = String(data.status || { accept: "accepted", decline: "declined", cancel: "cancelled" }[data.action] || "");
  const by = data.by && !["timeout", "interrupt", "system"].includes(data.by) ? ` by ${data.by}` : data.by === "interrupt" ? " by the interrupt" : "";
  eventNote(seq, data, live, () =>
    noteItem(
      "input-answered-note",
      "input-note",
      status === "accepted" ? "✓" : "•",
      { requestId: data.request_id, status },
      el("p", { text: `Input request #${data.request_id} ${INPUT_OUTCOMES[status] || status}${by}.` })
    )
  );
}

/** `goal.resumed`: who resumed it. */
export function goalResumedNote(seq, data, live) {
  eventNote(seq, data, live, () =>
    noteItem("goal-resumed", "goal-note", "▶", { goalRunId: data.goal_run_id }, el("p", { text: `Goal run resumed${byWhom(data.by)}` }))
  );
}

export function recalledMemory(id) {
  const item = el(
    "li",
    { className: "recalled-memory", dataset: { testid: "recalled-memory", memoryId: id, state: "loading" } },
    el("span", { className: "muted", text: "Loading…" })
  );
  api(`${MEMORIES_API}${encodeURIComponent(id)}/`)
    .then((memory) => {
      item.dataset.state = "ok";
      item.replaceChildren(
        el("span", { className: "kind-badge", dataset: { kind: memory.kind }, text: memory.kind }),
        " ",
        el("span", { className: "recalled-text", text: memory.text })
      );
    })
    .catch((exc) => {
      const deleted = exc instanceof ApiError && exc.status === 404;
      item.dataset.state = deleted ? "deleted" : "error";
      item.replaceChildren(
        el("span", {
          className: deleted ? "muted" : "error",
          text: deleted ? "(deleted)" : `Could not be read: ${exc instanceof ApiError ? exc.describe() : exc}`,
        })
      );
    });
  return item;
}
