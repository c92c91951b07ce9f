/* The outer task loop in the timeline: the task as understood, orchestration (what was
 * attached and why), preparation failures and goal edits.
 */
import { $, USERNAME, el, excerpt, names, state } from "./ctx.js";
import { goalSetByRun } from "./goal_notes.js";
import { GOAL_FIELDS, GOAL_NAMES } from "./goals.js";
import { capabilitiesKey, eventNote } from "./turn_notes.js";

// --- the outer task loop in the timeline: understanding, orchestration, goals ------------------

export const PREPARATION_FAILURES = {
  task_relation_failed: "Task understanding failed",
  orchestration_failed: "Capability orchestration failed",
};
export const PHRASES = {
  new_task: ["Understood as a new task", true],
  continue_current: ["Continues the current task", false],
  change_within_session: ["New phase within the session", true],
  out_of_scope: ["Out of scope of this session — goals unchanged", false],
  uncertain: ["Uncertain how this relates to the task — goals unchanged", false],
};
export const GOAL_EXCERPT_CHARS = 120;

export function noteItem(testid, className, icon, dataset, ...lines) {
  return el(
    "li",
    { className: `turn-note event-note ${className}`, dataset: { testid, ...dataset }, attrs: { role: "status" } },
    el("span", { className: "turn-note-icon", attrs: { "aria-hidden": "true" }, text: icon }),
    el("div", { className: "turn-note-lines" }, lines.flat())
  );
}

/** A goal in a note: quoted, clipped (the whole text on hover). */
export function quoted(text) {
  const whole = String(text);
  // The goal in a <bdi>: a direction override inside it cannot flip the quotes or the sentence.
  return el(
    "span",
    { className: "note-goal", attrs: { title: whole.length > GOAL_EXCERPT_CHARS ? whole : null } },
    "“",
    el("bdi", { text: excerpt(whole, GOAL_EXCERPT_CHARS) }),
    "”"
  );
}

/** `task.understood`: how the outer loop read the message, at the turn it starts. */
export function taskUnderstoodNote(seq, data, live) {
  state.understoodSeq = seq;
  const relation = String(data.task_relation || "");
  rememberGoals(data);
  eventNote(seq, data, live, () => {
    const [lead, withGoal] = PHRASES[relation] || [`Understood (${relation || "unknown"})`, false];
    const line = el("p", {}, lead);
    if (withGoal && data.phase_goal) line.append(" — phase goal: ", quoted(data.phase_goal));
    return noteItem("task-understood", "understood-note", "◎", { relation, mode: data.mode || "" }, line);
  });
}

/** `orchestration.finished`: what it added (or that it found nothing), and what it refused.
 * The `capabilities.added` of the same commit (before it, perhaps with `memory.recalled` in
 * between) says the same, so its note gives way to this one. */
export function orchestrationNote(seq, data, live) {
  const key = capabilitiesKey(data.added);
  const since = state.understoodSeq !== null && state.understoodSeq < seq ? state.understoodSeq : seq - 4;
  for (let at = seq - 1; at > since; at -= 1) {
    const earlier = state.eventNotes.get(at);
    if (earlier && earlier.dataset.testid === "capabilities-note" && earlier.dataset.added === key) {
      earlier.remove();
      break;
    }
  }
  eventNote(seq, data, live, () => {
    const mode = data.mode ? ` (${data.mode})` : "";
    const added = [];
    for (const [key, word] of [
      ["skills", "skill"],
      ["toolsets", "tool set"],
      ["tools", "tool"],
    ]) {
      for (const name of names(data.added && data.added[key])) added.push([name, word]);
    }
    const candidates = data.candidates || {};
    const looked = ["skills", "toolsets", "tools"].reduce((sum, key) => sum + names(candidates[key]).length, 0);
    const refused = Array.isArray(data.refused) ? data.refused : [];
    const refusedNames = new Set(refused.map((item) => String(item.skill || item.name || "")));
    const addedNames = new Set(added.map(([name]) => name));
    // Chosen, neither added nor refused: the Session had it already (add-only).
    const already = ["skills", "toolsets", "tools"].flatMap((key) =>
      names(data.chosen && data.chosen[key]).filter((name) => !addedNames.has(name) && !refusedNames.has(name))
    );
    const lines = [];
    if (added.length) {
      const line = el("p", {}, `Orchestration${mode} added: `);
      added.forEach(([name, word], index) => line.append(index ? ", " : "", el("code", { text: name }), ` (${word})`));
      lines.push(line);
    } else if (already.length) {
      const line = el("p", {}, `Orchestration${mode} found nothing new to add: `);
      already.forEach((name, index) => line.append(index ? ", " : "", el("code", { text: name })));
      line.append(" already loaded.");
      lines.push(line);
    } else if (refused.length) {
      lines.push(el("p", { text: `Orchestration${mode} added nothing.` }));
    } else {
      lines.push(el("p", { text: `Orchestration${mode} found nothing to add${looked ? ` among ${looked} candidate${looked === 1 ? "" : "s"}` : ""}.` }));
    }
    for (const item of refused) {
      lines.push(el("p", { className: "note-refused" }, "Not added: ", el("code", { text: String(item.skill || item.name || "?") }), ` — ${item.reason || "refused"}`));
    }
    return noteItem("orchestration-note", "orchestration-note", "+", { mode: data.mode || "", added: added.map(([name]) => name).join(" ") }, lines);
  });
}

/** An outer-loop stage failed: a warning at its turn; the turn itself ran on. */
export function preparationFailedNote(seq, data, live) {
  eventNote(seq, data, live, () => {
    const lead = PREPARATION_FAILURES[data.code];
    return el(
      "li",
      {
        className: "turn-note preparation-note",
        dataset: { testid: "preparation-failed", code: data.code, reason: "blocked" },
        attrs: { role: "status" },
      },
      el("span", { className: "turn-note-icon", attrs: { "aria-hidden": "true" }, text: "⚠" }),
      el(
        "div",
        { className: "turn-note-lines" },
        el("p", { text: `${lead} — the turn ran anyway, with the goals and capabilities unchanged.` }),
        data.message
          ? el("details", { className: "note-details" }, el("summary", { text: "What went wrong" }), el("p", { text: String(data.message) }))
          : null
      )
    );
  });
}

/** The goals as the log last said (task.understood, goals.updated), to tell what an edit changed. */
export function rememberGoals(data) {
  const known = {};
  for (const field of GOAL_FIELDS) if (typeof data[field] === "string") known[field] = data[field];
  state.goalsSeen = { ...(state.goalsSeen || {}), ...known };
}

/** `goals.updated`: "Goals edited by alice", with what changed. */
export function goalsUpdatedNote(seq, data, live) {
  const before = state.goalsSeen;
  rememberGoals(data);
  if (goalSetByRun(seq, data, before)) return;
  eventNote(seq, data, live, () => {
    const changed = GOAL_FIELDS.filter((field) => typeof data[field] === "string" && (!before || before[field] !== data[field]));
    const lines = [el("p", { text: data.by ? `Goals edited by ${data.by === USERNAME ? "you" : data.by}` : "Goals edited" })];
    for (const field of changed) {
      const name = GOAL_NAMES[field].replace(/^./, (c) => c.toUpperCase());
      lines.push(data[field].trim() ? el("p", {}, `${name}: `, quoted(data[field])) : el("p", { text: `${name}: cleared` }));
    }
    return noteItem("goals-updated", "goals-note", "✎", { by: data.by || "" }, lines);
  });
}
