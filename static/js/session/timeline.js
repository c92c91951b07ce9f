/* The conversation: messages (by id, idempotent), tool cards (by turn and call id), a Session
 * event or a goal round shown as what it is, long messages collapsed, and the live text of the
 * current model call.
 */
import { $, ApiError, RESULT_PREVIEW_CHARS, USERNAME, api, apiAll, boot, el, richText, state, statusBadge, timeElement, ui } from "./ctx.js";
import { roundLimit } from "./goal_notes.js";
import { quoted } from "./outer_loop.js";
import { files } from "./panels.js";
import { settleExtras } from "./turn_notes.js";

// --- conversation ---------------------------------------------------------------------------

export function nearBottom(node) {
  return node.scrollHeight - node.scrollTop - node.clientHeight < 80;
}

export function keepScrolled(update) {
  const stick = nearBottom(ui.scroller);
  update();
  ui.empty.hidden = ui.messages.children.length > 0 || ui.streamSlot.textContent.length > 0;
  if (stick) ui.scroller.scrollTop = ui.scroller.scrollHeight;
}

export function summarizeValue(value) {
  if (typeof value === "string") {
    const oneLine = value.replace(/\s+/g, " ").trim();
    return oneLine.length > 48 ? `${oneLine.slice(0, 40)}… (${value.length} chars)` : JSON.stringify(oneLine);
  }
  if (Array.isArray(value)) return value.length > 3 ? `[${value.length} items]` : JSON.stringify(value);
  if (value && typeof value === "object") return `{${Object.keys(value).length} keys}`;
  return String(value);
}

export function parseArguments(raw) {
  if (raw && typeof raw === "object") return raw;
  try {
    const parsed = JSON.parse(raw || "{}");
    return parsed && typeof parsed === "object" ? parsed : { value: parsed };
  } catch (exc) {
    return { _raw: String(raw) };
  }
}

export function argumentsSummary(args) {
  const parts = Object.entries(args).map(([key, value]) => `${key}=${summarizeValue(value)}`);
  const text = visibleControls(parts.join(", "));
  return text.length > 160 ? `${text.slice(0, 157)}…` : text;
}

// Direction controls (bidi overrides, embeddings, isolates, marks) in what a model sends would
// reorder what a person reads — "keep/\u202etxt.exe" shows as "keep/exe.txt". Where a person
// judges arguments (tool cards, approvals) they are shown by name instead.
export const DIRECTION_CONTROLS = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

export function visibleControls(text) {
  return String(text).replace(
    DIRECTION_CONTROLS,
    (ch) => `⟨U+${ch.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}⟩`
  );
}

/** Tool cards are keyed by (turn, call id): a model may reuse a call id in a later turn. */
export function cardKey(turn, callId) {
  return `${turn === null || turn === undefined ? "?" : turn}\u0000${callId}`;
}

/**
 * The turn an event belongs to: its own `turn_id` if it carries one, else the turn of the last
 * `turn.started` applied. Unknown for a replayed event older than the first `turn.started` in
 * the backlog (undefined: its card is already built from the messages); a live one then
 * belongs to the newest turn shown.
 */
export function eventTurn(data, live) {
  if (data && data.turn_id !== undefined && data.turn_id !== null) return data.turn_id;
  if (state.currentTurn !== null) return state.currentTurn;
  return live ? state.lastMessageTurn : undefined;
}

export function toolCard(turn, callId, tool, rawArguments) {
  const key = cardKey(turn, callId);
  let card = state.toolCards.get(key);
  if (!card) {
    card = el(
      "div",
      { className: "tool-card", dataset: { testid: "tool-card", tool, callId, state: "pending" } },
      el(
        "div",
        { className: "tool-head" },
        el("span", { className: "tool-icon", attrs: { "aria-hidden": "true" } }),
        el("code", { className: "tool-name", text: tool }),
        el("span", { className: "tool-args" }),
        el("span", { className: "tool-state", text: "queued" })
      ),
      el("p", { className: "tool-summary", attrs: { hidden: true } }),
      el(
        "div",
        { className: "tool-more" },
        el(
          "details",
          { className: "tool-arguments", attrs: { hidden: true } },
          el("summary", { text: "Arguments" }),
          el("pre", {})
        ),
        el("details", { className: "tool-result", attrs: { hidden: true } }, el("summary", { text: "Result" }), el("pre", {}))
      )
    );
    card.dataset.turn = turn === null || turn === undefined ? "" : String(turn);
    state.toolCards.set(key, card);
  }
  if (rawArguments !== undefined && !card.dataset.hasArguments) {
    const args = parseArguments(rawArguments);
    card.querySelector(".tool-args").textContent = argumentsSummary(args);
    const full = visibleControls(JSON.stringify(args, null, 2));
    card.querySelector(".tool-arguments pre").textContent =
      full.length > RESULT_PREVIEW_CHARS ? `${full.slice(0, RESULT_PREVIEW_CHARS)}\n…` : full;
    card.querySelector(".tool-arguments").hidden = false;
    card.dataset.hasArguments = "1";
  }
  return card;
}

export function setToolState(card, name, label) {
  card.dataset.state = name;
  card.querySelector(".tool-state").textContent = label;
}

export function toolStarted(data, turn) {
  const card = toolCard(turn, data.call_id, data.tool, data.arguments);
  if (card.dataset.ok === undefined && !state.waitingCalls.has(cardKey(turn, data.call_id))) setToolState(card, "running", "running…");
  placeOrphan(card);
}

export function toolEnded(data, turn) {
  state.waitingCalls.delete(cardKey(turn, data.call_id));
  const card = toolCard(turn, data.call_id, data.tool);
  card.dataset.ok = data.ok ? "true" : "false";
  setToolState(card, data.ok ? "ok" : "error", data.ok ? "ok" : "error");
  if (data.summary) {
    const summary = card.querySelector(".tool-summary");
    summary.textContent = data.summary;
    summary.hidden = false;
  }
  placeOrphan(card);
}

export function toolResult(message) {
  state.waitingCalls.delete(cardKey(message.turn, message.tool_call_id));
  const card = toolCard(message.turn, message.tool_call_id, message.tool_name || "tool");
  if (card.dataset.ok === undefined) {
    // Older than the replayed backlog: the result message alone tells ok/error.
    card.dataset.ok = message.is_error ? "false" : "true";
    setToolState(card, message.is_error ? "error" : "ok", message.is_error ? "error" : "ok");
    const firstLine = (message.content || "").split("\n", 1)[0];
    if (firstLine) {
      const summary = card.querySelector(".tool-summary");
      summary.textContent = firstLine.length > 160 ? `${firstLine.slice(0, 157)}…` : firstLine;
      summary.hidden = false;
    }
  }
  const result = card.querySelector(".tool-result");
  const content = message.content || "";
  result.querySelector("pre").textContent =
    content.length > RESULT_PREVIEW_CHARS ? `${content.slice(0, RESULT_PREVIEW_CHARS)}\n… (${content.length} chars)` : content;
  result.hidden = false;
  placeOrphan(card);
}

/** A card seen before its assistant message is shown waits in the stream slot. */
export function placeOrphan(card) {
  if (!card.isConnected) keepScrolled(() => ui.streamSlot.append(card));
}

/** "Agent", or who sent a user message: "You", or the colleague's name (a Session is the tenant's). */
export function authorLabel(message) {
  if (message.role === "assistant") return "Agent";
  if (message.role !== "user") return message.role;
  return message.author && message.author !== USERNAME ? message.author : "You";
}

/** Who a message is from, as shown above it: a task the MainSession handed over (its author is
 * the owner, but nobody typed it here) says so and links back. */
export function authorElement(message) {
  if (message.role === "user" && message.delegated_by) {
    return el(
      "span",
      { className: "message-author", dataset: { testid: "handed-over" } },
      "Handed over by ",
      el("a", { attrs: { href: `/sessions/${encodeURIComponent(message.delegated_by)}/` }, text: "the MainSession" })
    );
  }
  return el("span", { className: "message-author", text: authorLabel(message) });
}

export function messageShell(message, extraClass) {
  return el(
    "li",
    {
      className: `message message-${message.role}${extraClass ? " " + extraClass : ""}`,
      dataset: { testid: "message", role: message.role, id: message.id, turn: message.turn },
    },
    el(
      "div",
      { className: "message-meta" },
      authorElement(message),
      extraClass === "guidance" ? el("span", { className: "badge", text: "guidance" }) : null,
      timeElement(message.created_at, { clock: true })
    )
  );
}

// A sub-Session's result in its MainSession: `The sub-Session "<title>" (<id>) finished …`.
export const SESSION_EVENT_HEADER = "[Session event: not a message from the user]";
export const SUB_SESSION_REF = /^The sub-Session "(.*)" \(([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\) (.*)$/;
export const DELIVERED_FILE = /^- (from-[0-9a-f]{8}\/.+)$/;

/** A session event is the product telling this Session something (a sub-Session finished),
 * not the user speaking: a notice with a link to the sub-Session, its live title and status. */
export function sessionEventCard(message) {
  const lines = String(message.content || "").split("\n");
  if (lines[0].trim() === SESSION_EVENT_HEADER) lines.shift();
  while (lines.length && !lines[0].trim()) lines.shift();
  const ref = lines.length ? SUB_SESSION_REF.exec(lines[0]) : null;
  const head = el("p", { className: "session-event-lead" });
  let link = null;
  let status = null;
  if (ref) {
    lines.shift();
    const [, title, id, rest] = ref;
    link = el("a", {
      className: "session-event-link",
      dataset: { testid: "session-event-link", sessionId: id },
      attrs: { href: `/sessions/${encodeURIComponent(id)}/` },
      text: title || "Untitled session",
    });
    status = el("span", { className: "session-event-status" });
    head.append("Sub-Session ", link, " ", status, ` ${rest}`);
  } else {
    head.append("A Session event");
  }
  // Blocks as the report writes them (blank lines between), delivered files as buttons that
  // open them in the files panel.
  const body = el("div", { className: "session-event-body" });
  let list = null;
  let block = null;
  for (const line of lines) {
    const file = DELIVERED_FILE.exec(line);
    if (file) {
      block = null;
      if (!list) body.append((list = el("ul", { className: "session-event-files" })));
      list.append(
        el(
          "li",
          {},
          files
            ? el("button", {
                className: "link session-event-file",
                attrs: { type: "button", title: `Preview ${file[1]}` },
                text: file[1],
                on: { click: () => files.open(file[1]) },
              })
            : el("code", { text: file[1] })
        )
      );
      continue;
    }
    list = null;
    if (!line.trim()) {
      block = null;
      continue;
    }
    if (block) block.append("\n", richText(line));
    else body.append((block = el("p", {}, richText(line))));
  }
  const item = el(
    "li",
    {
      className: "message session-event",
      dataset: { testid: "message", role: message.role, kind: "session_event", id: message.id, turn: message.turn },
    },
    el(
      "div",
      { className: "session-event-card", dataset: { testid: "session-event" }, attrs: { role: "note", "aria-label": "Session event" } },
      el(
        "div",
        { className: "message-meta" },
        el("span", { className: "session-event-kicker", text: "Session event" }),
        el("span", { className: "muted", text: "from the product, not a message from you" }),
        timeElement(message.created_at, { clock: true })
      ),
      head,
      body.childNodes.length ? body : null
    )
  );
  if (ref) describeSubSession(ref[2], link, status);
  return item;
}

/** The sub-Session's current title and status (it may have been renamed or archived since). */
export function describeSubSession(id, link, status) {
  api(`/api/v1/sessions/${encodeURIComponent(id)}/`)
    .then((session) => {
      if (session.title) link.textContent = session.title;
      status.replaceWith(statusBadge(session.status));
    })
    .catch((exc) => {
      if (exc instanceof ApiError && exc.status === 404) {
        link.removeAttribute("href");
        link.dataset.gone = "true";
        status.textContent = "(no longer available)";
        status.className = "muted";
      }
    });
}

// A round's text, as the goal driver writes it (goal_driver._round_text).
export const ROUND_HEAD = /^Goal run, round (\d+) of (\d+)\.\s*$/;
export const ROUND_TAILS = ["\n\nWhat the product recorded after round ", "\n\nWork toward this goal."];

/**
 * A round of a goal run: the driver queued it in the name of the person who started the run, so
 * it is labelled "Goal run · round k of N", not shown as their bubble. It shows the goal and what
 * the product still found open; the whole text the agent got unfolds.
 */
export function goalRoundCard(message) {
  const text = String(message.content || "");
  const lines = text.split("\n");
  const head = ROUND_HEAD.exec(lines[0] || "");
  const round = message.goal_round.round || (head ? Number(head[1]) : "?");
  const limit = head ? Number(head[2]) : roundLimit(message.goal_round.goal_run_id);
  const body = head ? lines.slice(1).join("\n").trim() : text;
  let goal = null;
  let facts = [];
  let factsLead = "";
  let claimLine = "";
  if (body.startsWith("Goal:\n")) {
    const after = body.slice("Goal:\n".length);
    const cut = Math.max(...ROUND_TAILS.map((tail) => after.lastIndexOf(tail)));
    goal = cut >= 0 ? after.slice(0, cut) : after;
    const tail = cut >= 0 ? after.slice(cut).trim().split("\n") : [];
    if (tail.length && tail[0].startsWith("What the product recorded")) {
      factsLead = tail[0];
      facts = tail.slice(1).filter((line) => line.startsWith("- ")).map((line) => line.slice(2));
      // The agent's claim (update_goal) the records were weighed against, when the text names it.
      claimLine = tail.find((line) => /^You (said|did not say) the goal/.test(line)) || "";
    }
  }
  const who = message.author && message.author !== USERNAME ? `queued for ${message.author}` : "queued for you";
  const parts = [
    el(
      "div",
      { className: "message-meta" },
      el("span", {
        className: "goal-round-kicker",
        dataset: { testid: "goal-round-label" },
        text: `Goal run · round ${round}${limit ? ` of ${limit}` : ""}`,
      }),
      el("span", { className: "muted", text: `${who} by the goal driver` }),
      timeElement(message.created_at, { clock: true })
    ),
  ];
  if (goal !== null) parts.push(el("p", { className: "goal-round-goal" }, "Goal: ", quoted(goal)));
  if (factsLead) {
    parts.push(
      el("p", { className: "goal-round-facts-lead", text: factsLead }),
      el("ul", { className: "goal-round-facts", dataset: { testid: "goal-round-facts" } }, facts.map((fact) => el("li", { text: fact }))),
      claimLine
        ? el("p", { className: "goal-round-claim", dataset: { testid: "goal-round-claim" }, text: claimLine.replace(/^You /, "The agent ") })
        : null
    );
  }
  parts.push(
    el(
      "details",
      { className: "goal-round-text" },
      el("summary", { text: goal === null ? "The text sent to the agent" : "The whole text sent to the agent" }),
      el("div", { className: "goal-round-full" }, richText(text))
    )
  );
  return el(
    "li",
    {
      className: "message goal-round",
      dataset: { testid: "message", role: message.role, kind: "goal_round", round, id: message.id, turn: message.turn },
    },
    el("div", { className: "goal-round-card", dataset: { testid: "goal-round" }, attrs: { role: "note", "aria-label": `Goal run, round ${round}` } }, parts)
  );
}

// A message longer than this (characters or lines) shows its start, with "Show all".
export const LONG_MESSAGE_CHARS = 3000;
export const LONG_MESSAGE_LINES = 40;

/** A message's body; a long one collapsed to its start, with a button that shows it all. */
export function messageBody(content) {
  const body = el("div", { className: "message-body" }, richText(content));
  const lines = content.split("\n").length;
  if (content.length <= LONG_MESSAGE_CHARS && lines <= LONG_MESSAGE_LINES) return [body];
  body.classList.add("collapsed");
  const size = `${content.length.toLocaleString()} characters, ${lines.toLocaleString()} line${lines === 1 ? "" : "s"}`;
  const toggle = el("button", {
    className: "link small message-expand",
    text: `Show all (${size})`,
    dataset: { testid: "show-all" },
    attrs: { type: "button", "aria-expanded": "false" },
  });
  toggle.addEventListener("click", () => {
    const collapsed = body.classList.toggle("collapsed");
    toggle.textContent = collapsed ? `Show all (${size})` : "Show less";
    toggle.setAttribute("aria-expanded", collapsed ? "false" : "true");
  });
  return [body, toggle];
}

export function renderMessage(message) {
  if (message.role === "tool") {
    toolResult(message);
    return;
  }
  if (message.role === "user" && message.input_kind === "session_event") {
    ui.messages.append(sessionEventCard(message));
    return;
  }
  if (message.role === "user" && message.goal_round) {
    ui.messages.append(goalRoundCard(message));
    return;
  }
  const content = message.content || "";
  let extra = "";
  if (message.role === "user" && message.input_kind === "guidance") {
    extra = "guidance";
  } else if (message.role === "user" && message.delegated_by) {
    extra = "delegated";
  }
  const item = messageShell(message, extra);
  if (content) item.append(...messageBody(content));
  if (message.role === "assistant" && (message.tool_calls || []).length) {
    const tools = el("div", { className: "tool-cards" });
    for (const call of message.tool_calls) {
      let card = toolCard(message.turn, call.id, call.name, call.arguments);
      if (card.closest(".message")) {
        // Already under an earlier message (a turn-less history reusing the id): a new card.
        state.toolCards.delete(cardKey(message.turn, call.id));
        card = toolCard(message.turn, call.id, call.name, call.arguments);
      }
      tools.append(card);
    }
    item.append(tools);
  }
  ui.messages.append(item);
}

export function renderMessages(rows) {
  keepScrolled(() => {
    let assistantShown = false;
    for (const message of rows) {
      if (message.id <= state.lastMessageId) continue;
      renderMessage(message);
      state.lastMessageId = message.id;
      if (message.turn !== null && message.turn !== undefined) state.lastMessageTurn = message.turn;
      if (message.role === "assistant") assistantShown = true;
    }
    if (assistantShown) dropStaleStreams();
    settleExtras();
  });
}

export let messageFetch = null;
export let fetchAgain = false;
export function fetchNewMessages() {
  if (messageFetch) {
    fetchAgain = true;
    return messageFetch;
  }
  messageFetch = (async () => {
    do {
      fetchAgain = false;
      try {
        renderMessages(await apiAll(`${boot.api}messages/?after=${state.lastMessageId}&page_size=200`));
      } catch (exc) {
        await new Promise((resolve) => setTimeout(resolve, 1500));
        fetchAgain = true;
      }
    } while (fetchAgain);
    messageFetch = null;
  })();
  return messageFetch;
}

// --- live text of the current model call ------------------------------------------------------

export function streamFor(callId) {
  if (state.stream && state.stream.callId === callId) return state.stream;
  endStream();
  const body = el("div", { className: "message-body" });
  const node = el(
    "div",
    { className: "message message-assistant streaming", dataset: { testid: "stream" }, attrs: { "aria-live": "off" } },
    el("div", { className: "message-meta" }, el("span", { className: "message-author", text: "Agent" }), el("span", { className: "typing", text: "writing…" })),
    body
  );
  node.hidden = true; // shown with its first text
  ui.streamSlot.prepend(node);
  state.stream = { callId, node, body };
  return state.stream;
}

export function appendDelta(data) {
  const stream = streamFor(data.model_call_id);
  keepScrolled(() => {
    stream.body.append(document.createTextNode(data.text || ""));
    stream.node.hidden = !stream.body.textContent;
  });
}

/** The committed message replaces the live text: keep it until that message is rendered. */
export function endStream() {
  if (state.stream) state.staleStreams.push(state.stream.node);
  state.stream = null;
}

export function dropStaleStreams() {
  for (const node of state.staleStreams) node.remove();
  state.staleStreams = [];
}
