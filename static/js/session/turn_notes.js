/* Notes in the timeline about a turn: why it failed, a compaction, a recovery, capabilities
 * attached, memories recalled; each placed after its turn's messages and rebuilt from the log.
 */
import { note } from "./composer.js";
import { $, USERNAME, boot, el, names, state, ui } from "./ctx.js";
import { recalledMemory } from "./goal_notes.js";
import { eventTurn, keepScrolled } from "./timeline.js";

// --- timeline extras: failure notes and delivery cards ----------------------------------------

export const FAILED_TURN_REASONS = {
  error: "The turn ended with an error",
  blocked: "The turn was stopped",
  max_tokens: "The model hit its output limit",
};

/**
 * Notes and cards belong to a turn: each sits after the last message of its turn (or of an
 * earlier one), in the order it was made, however late the messages around it arrive.
 */
export function addExtra(node, turn, order) {
  node.dataset.turn = turn === null || turn === undefined ? "" : String(turn);
  node.dataset.order = String(order !== undefined ? order : (state.extraOrder += 1));
  node.classList.add("timeline-extra");
  keepScrolled(() => {
    ui.messages.append(node);
    settleExtras();
  });
}

export function settleExtras() {
  const extras = [...ui.messages.querySelectorAll(":scope > .timeline-extra")];
  if (!extras.length) return;
  const turnOf = (node) => (node.dataset.turn === "" ? Infinity : Number(node.dataset.turn));
  extras.sort((a, b) => turnOf(a) - turnOf(b) || Number(a.dataset.order) - Number(b.dataset.order));
  for (const node of extras) node.remove();
  const messages = [...ui.messages.children];
  for (const node of extras) {
    const turn = turnOf(node);
    // A note about a point inside the turn (a compaction) goes after the last message it covers.
    const after = node.dataset.afterMessage ? Number(node.dataset.afterMessage) : NaN;
    let anchor = null;
    for (const message of messages) {
      const own = message.dataset.turn === undefined || message.dataset.turn === "" ? NaN : Number(message.dataset.turn);
      if (Number.isNaN(own) || own > turn) continue;
      if (!Number.isNaN(after) && own === turn && Number(message.dataset.id) > after) continue;
      anchor = message;
    }
    if (turn === Infinity) anchor = messages[messages.length - 1] || null;
    // After the anchor and after the extras already placed behind it (same turn, made earlier).
    let before = anchor ? anchor.nextSibling : ui.messages.firstChild;
    while (before && before.classList && before.classList.contains("timeline-extra")) before = before.nextSibling;
    ui.messages.insertBefore(node, before);
  }
}

/** A turn that failed says so in the conversation, where the user reads, not only in the header. */
export function turnFailed(turn, reason, lead, detail) {
  if (turn === undefined) turn = state.lastMessageTurn;
  const key = String(turn === null || turn === undefined ? "?" : turn);
  let note = state.turnNotes.get(key);
  if (!note) {
    note = el(
      "li",
      { className: "turn-note", dataset: { testid: "turn-error", reason }, attrs: { role: "status" } },
      el("span", { className: "turn-note-icon", attrs: { "aria-hidden": "true" }, text: "⚠" }),
      el("div", { className: "turn-note-lines" })
    );
    note.details = new Set();
    state.turnNotes.set(key, note);
    addExtra(note, turn);
  }
  // "model call failed: X" then "turn ended with an error: model call failed: X": say it once.
  if (detail && [...note.details].some((known) => known.includes(detail) || detail.includes(known))) return;
  if (!detail && note.details.size) return;
  note.details.add(detail);
  if (reason !== "error") note.dataset.reason = note.dataset.reason === "error" ? "error" : reason;
  else note.dataset.reason = "error";
  note.querySelector(".turn-note-lines").append(el("p", { text: detail ? `${lead}: ${detail}` : `${lead}.` }));
}

/** A compaction in the timeline: what was compacted, how, and what it saved (ARCHITECTURE §5). */
export function compactionNote(turn, data) {
  const trimmed = data.method === "trim";
  const saved = data.tokens_before && data.tokens_after ? ` (about ${data.tokens_before} → ${data.tokens_after} tokens)` : "";
  const text = trimmed
    ? `Context trimmed without a summary${saved}: ${data.reason || "the summary failed"}. Earlier steps are listed by name; the task goes on.`
    : `Context compacted: earlier steps were summarized so the task fits the model's window${saved}. Nothing was deleted; the goals are unchanged.`;
  const note = el(
    "li",
    {
      className: "turn-note compaction-note",
      dataset: { testid: "compaction-note", method: data.method || "summary", afterMessage: data.covers_to_id || "" },
      attrs: { role: "status" },
    },
    el("span", { className: "turn-note-icon", attrs: { "aria-hidden": "true" }, text: "⇣" }),
    el("div", { className: "turn-note-lines" }, el("p", { text }))
  );
  addExtra(note, turn);
}

/** `session.recovered`: a runner was lost (a worker stopped) and another took the Session over.
 * Says what it found and kept, which calls were closed and why, and what runs next. */
export function sessionRecovered(data, turn) {
  const list = (value) => (Array.isArray(value) ? value : []);
  const restored = list(data.restored);
  const interrupted = list(data.interrupted_calls);
  const rerun = list(data.rerun_calls);
  const lostAnswers = list(data.interrupted_model_calls).length;
  const lines = [el("p", { className: "recovered-lead", text: "Recovered: the worker running this Session stopped, and another took over." })];
  if (restored.length) lines.push(el("p", { text: `Restored: ${restored.map(String).join("; ")}.` }));
  if (lostAnswers) {
    lines.push(el("p", { text: `${lostAnswers} model answer${lostAnswers === 1 ? " was" : "s were"} cut off and not kept.` }));
  }
  if (rerun.length) {
    lines.push(el("p", { text: `Run again (safe to repeat): ${rerun.map((call) => `${call.tool} (${call.call_id})`).join(", ")}.` }));
  }
  if (interrupted.length) {
    lines.push(
      el("p", { text: "Not run again (they may or may not have taken effect):" }),
      el("ul", {}, interrupted.map((call) => el("li", { text: `${call.tool} (${call.call_id}): ${call.reason}` })))
    );
  }
  if (data.next) lines.push(el("p", { className: "recovered-next", text: `Next: ${data.next}.` }));
  const card = el(
    "li",
    {
      className: "turn-note",
      dataset: { testid: "session-recovered", reason: "recovered", afterMessage: data.after_message_id || "" },
      attrs: { role: "status" },
    },
    el("span", { className: "turn-note-icon", attrs: { "aria-hidden": "true" }, text: "↻" }),
    el("div", { className: "turn-note-lines" }, lines)
  );
  addExtra(card, turn === undefined ? state.lastMessageTurn : turn);
}

export const MEMORIES_API = "/api/v1/memories/";

/** What a `capabilities.added` event (or the session's `capabilities`) attached, by kind, as words. */
export function capabilityParts(data) {
  const parts = [];
  for (const [key, one, many] of [
    ["skills", "skill", "skills"],
    ["toolsets", "tool set", "tool sets"],
    ["tools", "tool", "tools"],
  ]) {
    const list = names(data && data[key]);
    if (list.length) parts.push({ key, label: list.length === 1 ? one : many, names: list });
  }
  return parts;
}

/**
 * The turn of a note about a point in the conversation: the event's own turn, else the turn
 * being applied, else the turn of the message it follows (a replayed event older than the
 * backlog's first `turn.started`), else the newest one shown for a live event.
 */
export function pointTurn(data, live, afterMessage) {
  const turn = eventTurn(data, false);
  if (turn !== undefined) return turn;
  if (afterMessage !== null) {
    let found;
    for (const message of ui.messages.querySelectorAll(":scope > [data-testid=message]")) {
      if (Number(message.dataset.id) > afterMessage) break;
      if (message.dataset.turn !== undefined && message.dataset.turn !== "") found = Number(message.dataset.turn);
    }
    if (found !== undefined) return found;
  }
  return live ? state.lastMessageTurn : undefined;
}

/** A note for one logged event, placed after the last message committed before it; a replay
 * of the same event (same seq) never makes a second one. */
export function eventNote(seq, data, live, build) {
  if (state.eventNotes.has(seq)) return null;
  // The event says where it happened when it can (`after_message_id`); else the last message
  // committed before it in the applied log.
  const afterMessage = Number.isInteger(data.after_message_id) ? data.after_message_id : state.lastCommitted;
  let turn = pointTurn(data, live, afterMessage);
  // Live, before any message is shown: the top of the conversation, where a reload puts it too.
  if (turn === null && afterMessage === null && !ui.messages.querySelector(":scope > [data-testid=message]")) turn = -1;
  if (turn === undefined) {
    // The whole log was replayed and no message came before it: the top of the conversation.
    if (afterMessage === null && boot.backlogFrom === 0) turn = -1;
    // Older than the replayed backlog shows: where it happened is not known, so no note.
    else if (!live) return null;
  }
  const note = build();
  note.dataset.seq = String(seq);
  if (afterMessage !== null) note.dataset.afterMessage = String(afterMessage);
  state.eventNotes.set(seq, note);
  addExtra(note, turn);
  return note;
}

/** What was attached, as one comparable string (an orchestration note finds its own by it). */
export function capabilitiesKey(data) {
  return ["skills", "toolsets", "tools"].map((key) => [...names(data && data[key])].sort().join(",")).join("|");
}

/** `capabilities.added`: "Loaded skill research-guide" where it happened in the conversation. */
export function capabilitiesNote(seq, data, live) {
  const parts = capabilityParts(data);
  if (!parts.length) return;
  eventNote(seq, data, live, () => {
    const line = el("p", {}, "Loaded ");
    parts.forEach(({ label, names: list }, index) => {
      if (index) line.append(index === parts.length - 1 ? " and " : ", ");
      line.append(`${label} `);
      list.forEach((name, at) => line.append(at ? ", " : "", el("code", { text: name })));
    });
    return el(
      "li",
      {
        className: "turn-note event-note capabilities-note",
        dataset: { testid: "capabilities-note", skills: names(data.skills).join(" "), added: capabilitiesKey(data) },
        attrs: { role: "status" },
      },
      el("span", { className: "turn-note-icon", attrs: { "aria-hidden": "true" }, text: "+" }),
      el("div", { className: "turn-note-lines" }, line)
    );
  });
}

/** `memory.recalled`: "Recalled 2 memories", unfolding to their texts (read when first opened;
 * one deleted since shows as such). */
export function memoryRecalledNote(seq, data, live) {
  const ids = names(data.memory_ids);
  if (!ids.length) return;
  const count = `${ids.length} memor${ids.length === 1 ? "y" : "ies"}`;
  if (boot.owner && boot.owner !== USERNAME) {
    // Someone else's memories: that they were recalled is the Session's, what they say is not.
    eventNote(seq, data, live, () =>
      el(
        "li",
        {
          className: "turn-note event-note memory-note",
          dataset: { testid: "memory-recalled", memoryIds: ids.join(" ") },
          attrs: { role: "status" },
        },
        el("span", { className: "turn-note-icon", attrs: { "aria-hidden": "true" }, text: "✦" }),
        el("div", {
          className: "turn-note-lines",
          dataset: { testid: "memory-recalled-summary" },
          text: `Recalled ${ids.length} of ${boot.owner}'s memories for this task (private to them)`,
        })
      )
    );
    return;
  }
  eventNote(seq, data, live, () => {
    const list = el("ul", { className: "recalled-memories", dataset: { testid: "recalled-memories" } });
    const details = el(
      "details",
      { className: "memory-recall" },
      el("summary", {
        dataset: { testid: "memory-recalled-summary" },
        text: `Recalled ${count} for this task`,
      }),
      list,
      el("p", { className: "memory-recall-foot muted" }, el("a", { attrs: { href: "/memories/" }, text: "Manage your memories" }))
    );
    let read = false;
    details.addEventListener("toggle", () => {
      if (!details.open || read) return;
      read = true;
      list.replaceChildren(...ids.map((id) => recalledMemory(id)));
    });
    return el(
      "li",
      {
        className: "turn-note event-note memory-note",
        dataset: { testid: "memory-recalled", memoryIds: ids.join(" ") },
        attrs: { role: "status" },
      },
      el("span", { className: "turn-note-icon", attrs: { "aria-hidden": "true" }, text: "✦" }),
      el("div", { className: "turn-note-lines" }, details)
    );
  });
}

/** `quota.exceeded`: the Session waits, parked as `queued`, until the limit is raised or a new
 * period begins. The card names the limit, what was used and who can raise it. */
export function quotaExceededNote(seq, data, live) {
  const unit = data.unit === "cost" ? ` ${data.currency || ""}`.trimEnd() : " tokens";
  const amount = (value) =>
    data.unit === "cost" ? Number(value).toFixed(4) : Number(value).toLocaleString("en");
  const whose = data.scope === "tenant" ? "Your organisation's" : "Your";
  eventNote(seq, data, live, () =>
    el(
      "li",
      {
        className: "turn-note event-note quota-note",
        dataset: { testid: "quota-exceeded" },
        attrs: { role: "status" },
      },
      el("span", { className: "turn-note-icon", attrs: { "aria-hidden": "true" }, text: "‖" }),
      el(
        "div",
        { className: "turn-note-lines" },
        el("strong", {
          dataset: { testid: "quota-exceeded-limit" },
          text: `${whose} ${data.period === "day" ? "daily" : "monthly"} quota of ${amount(data.limit)}${unit} is spent (${amount(data.used)}${unit} used).`,
        }),
        el("div", {
          className: "muted",
          text: `The task waits and goes on by itself when ${data.raised_by || "an owner or admin of the tenant"} raises the limit, or when the next ${data.period || "period"} begins. Messages you send meanwhile are kept.`,
        })
      )
    )
  );
}
