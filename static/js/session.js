/* One Session, live.
 *
 * Start-up follows "register, fetch state, replay": the page is rendered with the Session's
 * `last_event_seq` (snapshotSeq); the script then fetches the state (Session, messages,
 * plan) and opens the WebSocket with `after=<seq>`. Every event after the snapshot is
 * applied; handlers are idempotent (messages by id, tool cards by call id, plan and status
 * replaced), so an event already reflected in the fetched state does no harm. A short
 * backlog before the snapshot is replayed into the activity log and tool cards only.
 *
 * The status badge changes only on `session.status` events (initial value from the API):
 * it is never inferred from chat text. Reconnects resume from the last seq received, so
 * nothing is missed or applied twice.
 *
 * Approvals: pending ones are read from the API at start (`approvals/?status=pending`), new
 * ones arrive as `approval.requested` events (details then read from `/api/v1/approvals/{id}/`).
 * A decision goes out as a WebSocket `decide` frame (REST POST when the socket is down); the
 * card turns decided on the `ack`, on the `approval.decided` event or on a re-read, whichever
 * comes first — all three say the same thing, so the order does not matter.
 *
 * Input requests (MCP elicitation: a server's question during a tool call) are input_requests.js's
 * cards; this script feeds them the `input.requested` / `input.answered` events and puts a note in
 * the timeline for each.
 *
 * Goal runs: the Goal run card (goal_run.js) starts from the run the page was rendered with and
 * reads `…/goal-run/` again on every live `goal.*` (and `turn.ended` while the run is open); the timeline says what the driver did from the `goal.*` events
 * (like every note, rebuilt from the log on a reload), and a round's message (`goal_round`) is
 * shown as the driver's, not as a bubble the person typed.
 */
(function () {
  "use strict";
  const { api, apiAll, el, richText, statusLabel, statusReasonText, statusBadge, timeElement, clockTime, newIdempotencyKey, formatBytes, filesPanel, goalRun, ApiError } =
    window.xagent;

  const bootNode = document.getElementById("session-boot");
  if (!bootNode) return;
  const boot = JSON.parse(bootNode.textContent);
  const $ = (id) => document.getElementById(id);

  const INTERRUPTIBLE = new Set(["queued", "running", "preparing", "waiting_approval"]); // parked: cancels the approval
  const WORKING = new Set(["queued", "running", "preparing", "waiting_approval", "compressing"]);
  const FIRST_INPUT_NOTE_KEY = "xagent.firstInputFailed"; // set by home.js when the goal could not be queued
  const MAX_LOG_ENTRIES = 500;
  const RESULT_PREVIEW_CHARS = 20000;
  const ANSWER_EXCERPT_CHARS = 200; // of the final answer, in the delivery card
  const APPROVALS_API = "/api/v1/approvals/";
  const APPROVAL_TIMES_REFRESH_MS = 30000;

  const ui = {
    status: document.querySelector("[data-testid=session-status]"),
    statusText: document.querySelector("[data-testid=session-status] .status-text"),
    reason: $("status-reason"),
    title: $("session-title"),
    modelLabel: $("model-label"),
    modelBadge: $("model-badge"),
    phaseGoalState: $("phase-goal-state"),
    live: document.querySelector("[data-testid=live-indicator]"),
    liveText: document.querySelector("[data-testid=live-indicator] .live-text"),
    scroller: $("conversation-scroll"),
    messages: $("messages"),
    empty: $("conversation-empty"),
    streamSlot: $("stream-slot"),
    composer: $("composer"),
    input: $("composer-input"),
    guidance: $("guidance-toggle"),
    send: $("send-button"),
    interrupt: $("interrupt-button"),
    note: $("composer-note"),
    planEmpty: $("plan-empty"),
    planTitle: $("plan-title"),
    planTasks: $("plan-tasks"),
    planProgress: $("plan-progress"),
    log: $("event-log"),
    logCount: $("activity-count"),
    approvals: $("approvals"),
    approvalsNote: $("approvals-note"),
    capabilitiesEmpty: $("capabilities-empty"),
    capabilityGroups: $("capability-groups"),
    capabilitiesCount: $("capabilities-count"),
    children: $("children"),
    childrenList: $("children-list"),
    childrenCount: $("children-count"),
  };
  const USERNAME = ($("session-app") && $("session-app").dataset.username) || "";
  // Questions MCP servers ask during tool calls (input_requests.js).
  const inputPanel =
    window.xagent.inputRequests && $("input-requests")
      ? window.xagent.inputRequests.panel({ container: $("input-requests"), sessionApi: boot.api, onChange: () => updateDocumentTitle() })
      : null;

  const state = {
    lastSeq: boot.backlogFrom, // the WebSocket's `after`: highest seq received
    status: boot.status,
    lastMessageId: 0,
    toolCards: new Map(), // cardKey(turn, call_id) -> card element: call ids repeat across turns
    currentTurn: null, // turn id of the events being applied (from `turn.started`)
    lastMessageTurn: null, // turn of the newest message shown
    stream: null, // {callId, node, body}
    staleStreams: [], // stream bubbles to drop once their committed message is shown
    ws: null,
    attempts: 0,
    retryTimer: null,
    stopped: false,
    awaitingAck: [], // {kind, note, approvalId?} per client frame sent, answered in order by `ack`/`error` frames
    gapAt: null,
    approvalCards: new Map(), // approval id -> card element
    waitingCalls: new Map(), // cardKey -> true, while that call's approval is pending
    deliveryCards: new Map(), // delivery id -> card element
    turnNotes: new Map(), // turn id -> the timeline note of its failure
    extraOrder: 0, // creation order of timeline extras (delivery cards, failure notes)
    lastCommitted: null, // message id of the last `message.committed` applied: where a note of a later event goes
    eventNotes: new Map(), // seq -> timeline note made from that event (capabilities, recalled memories)
    capabilities: { skills: [], toolsets: [], tools: [] }, // attached beyond the default tools
    sources: new Map(), // "kind\0name" -> {by, at, servers}: who attached it (session detail's capability_sources)
    skillDescriptions: null, // skill name -> description, read once from /api/v1/skills/
    goalsSeen: null, // the goals as the applied log last said them (to tell what an edit changed)
    understoodSeq: null, // seq of the last `task.understood` applied: where a turn's orchestration began
    goalRuns: new Map(), // goal run id -> its round limit, from `goal.started` (the card's run otherwise)
    goalStarted: null, // {seq, goal} of the last `goal.started` applied: its `goals.updated` joins its note
    title: "",
  };

  // --- status, header -------------------------------------------------------------------------

  function setStatus(status, reason) {
    state.status = status;
    ui.status.dataset.status = status;
    ui.statusText.textContent = statusLabel(status);
    const reasonText = statusReasonText(status, reason);
    ui.reason.textContent = reasonText;
    ui.reason.hidden = !reasonText;
    ui.interrupt.disabled = !INTERRUPTIBLE.has(status);
    // The phase goal is what a turn works on; once no turn runs it is the last task, not a current one.
    if (ui.phaseGoalState) ui.phaseGoalState.hidden = !WORKING.has(status);
  }

  function showHeader(session) {
    const title = session.title || "Untitled session";
    ui.title.textContent = title;
    state.title = title;
    updateDocumentTitle();
    const label = session.model_label || "";
    const demo = label.toLowerCase().startsWith("demo model");
    ui.modelBadge.hidden = !demo;
    if (demo) ui.modelBadge.title = label;
    ui.modelLabel.textContent = demo ? label.slice("demo model".length).trim() : label ? `Model: ${label}` : "";
    showGoals(session);
  }

  /** Everything the page shows from the Session detail (a fresh read or a PATCH answer): header,
   * goals, capabilities with their sources, sub-Sessions. */
  function applySession(session) {
    if (!session) return;
    showHeader(session);
    if (Array.isArray(session.capability_sources)) applySources(session.capability_sources);
    if (session.capabilities) addCapabilities(session.capabilities);
    if (Array.isArray(session.children)) showChildren(session.children);
  }

  function updateDocumentTitle() {
    const title = state.title || ui.title.textContent || "Untitled session";
    const waiting = [...state.approvalCards.values()].some((card) => card.dataset.status === "pending");
    const asked = !waiting && inputPanel && inputPanel.pending();
    document.title = `${waiting ? "Approval needed · " : asked ? "Input needed · " : ""}${title} · xAgent workspace`;
  }

  let headerRefresh = null;
  let refreshAgain = false;
  /** Re-read the Session detail (title, goals, capability sources, sub-Sessions): one read at a
   * time, and one more after it when asked meanwhile, so the last change is never missed. The
   * status never comes from a re-read, only from events. */
  function refreshHeader() {
    if (headerRefresh) {
      refreshAgain = true;
      return;
    }
    headerRefresh = api(boot.api)
      .then(applySession)
      .catch(() => {})
      .finally(() => {
        headerRefresh = null;
        if (refreshAgain) {
          refreshAgain = false;
          refreshHeader();
        }
      });
  }

  // --- goals panel ----------------------------------------------------------------------------

  /**
   * The session goal and the phase goal, each edited in place by a person (PATCH `{field: value}`).
   * What is shown follows the owner: the PATCH answer, `goals.updated` and `task.understood`
   * events (another tab's or colleague's edit, the outer loop's transition) and re-reads. An open
   * editor is never overwritten: it says that the goal changed meanwhile instead.
   */
  const GOAL_FIELDS = ["session_goal", "phase_goal"];
  const GOAL_NAMES = { session_goal: "session goal", phase_goal: "phase goal" };
  const goalUi = {};
  for (const field of GOAL_FIELDS) {
    const root = document.querySelector(`.goal[data-field=${field}]`);
    if (!root) continue;
    goalUi[field] = {
      root,
      value: root.querySelector(".goal-value"),
      edit: root.querySelector(".goal-edit"),
      form: root.querySelector(".goal-editor"),
      input: root.querySelector(".goal-input"),
      conflict: root.querySelector(".goal-conflict"),
      error: root.querySelector(".goal-error"),
      save: root.querySelector("[data-testid=goal-save]"),
      cancel: root.querySelector("[data-testid=goal-cancel]"),
      editingFrom: null, // the value when the editor opened; null while closed
    };
  }

  function showGoal(field, value, by) {
    const goal = goalUi[field];
    if (!goal) return;
    const text = typeof value === "string" ? value : "";
    goal.root.dataset.empty = text.trim() ? "false" : "true";
    goal.value.textContent = text.trim() ? text : "not set yet";
    if (goal.editingFrom !== null && text !== goal.editingFrom && text !== goal.input.value) {
      const who = by ? (by === USERNAME ? "by you (in another tab)" : `by ${by}`) : "";
      goal.conflict.textContent = `This goal changed meanwhile${who ? " " + who : ""}: “${excerpt(text, 120) || "not set"}”. Saving replaces it.`;
      goal.conflict.hidden = false;
    }
  }

  function showGoals(data, by) {
    for (const field of GOAL_FIELDS) {
      if (data && typeof data[field] === "string") showGoal(field, data[field], by);
    }
  }

  function setGoalError(goal, text) {
    goal.error.textContent = text || "";
    goal.error.hidden = !text;
    if (text) goal.input.setAttribute("aria-invalid", "true");
    else goal.input.removeAttribute("aria-invalid");
  }

  function openGoalEditor(field) {
    const goal = goalUi[field];
    const current = goal.root.dataset.empty === "true" ? "" : goal.value.textContent;
    goal.editingFrom = current;
    goal.input.value = current;
    goal.conflict.hidden = true;
    setGoalError(goal, "");
    goal.root.dataset.editing = "true";
    goal.form.hidden = false;
    goal.value.hidden = true;
    goal.edit.hidden = true;
    goal.input.focus();
    goal.input.setSelectionRange(goal.input.value.length, goal.input.value.length);
  }

  function closeGoalEditor(field) {
    const goal = goalUi[field];
    goal.editingFrom = null;
    goal.root.dataset.editing = "false";
    goal.form.hidden = true;
    goal.value.hidden = false;
    goal.edit.hidden = false;
    goal.conflict.hidden = true;
    setGoalError(goal, "");
    goal.edit.focus();
  }

  async function saveGoal(field) {
    const goal = goalUi[field];
    if (goal.form.dataset.busy === "true") return;
    goal.form.dataset.busy = "true";
    goal.save.disabled = goal.cancel.disabled = true;
    goal.save.textContent = "Saving…";
    try {
      const session = await api(boot.api, { method: "PATCH", body: { [field]: goal.input.value } });
      closeGoalEditor(field);
      applySession(session);
    } catch (exc) {
      const detail = exc instanceof ApiError ? describeGoalError(exc, field, goal.input.value.length) : String(exc);
      setGoalError(goal, `Not saved: ${detail}`);
      goal.input.focus();
    } finally {
      goal.form.dataset.busy = "false";
      goal.save.disabled = goal.cancel.disabled = false;
      goal.save.textContent = "Save";
    }
  }

  /** The field's own problem in words ("Ensure the phase goal has no more than 10000 characters."). */
  function describeGoalError(exc, field, length) {
    const problems = exc.details && exc.details[field];
    if (!problems) return exc.describe();
    const said = [].concat(problems).join(" ").replace(/\bthis field\b/gi, `the ${GOAL_NAMES[field]}`);
    const tooLong = /no more than/.test(said) ? ` It has ${length}.` : "";
    return `${said.charAt(0).toUpperCase()}${said.slice(1)}${tooLong}`;
  }

  for (const [field, goal] of Object.entries(goalUi)) {
    goal.edit.addEventListener("click", () => openGoalEditor(field));
    goal.cancel.addEventListener("click", () => closeGoalEditor(field));
    goal.form.addEventListener("submit", (event) => {
      event.preventDefault();
      saveGoal(field);
    });
    goal.input.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.preventDefault();
        closeGoalEditor(field);
      } else if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        saveGoal(field);
      }
    });
  }

  // --- conversation ---------------------------------------------------------------------------

  function nearBottom(node) {
    return node.scrollHeight - node.scrollTop - node.clientHeight < 80;
  }

  function keepScrolled(update) {
    const stick = nearBottom(ui.scroller);
    update();
    ui.empty.hidden = ui.messages.children.length > 0 || ui.streamSlot.textContent.length > 0;
    if (stick) ui.scroller.scrollTop = ui.scroller.scrollHeight;
  }

  function summarizeValue(value) {
    if (typeof value === "string") {
      const oneLine = value.replace(/\s+/g, " ").trim();
      return oneLine.length > 48 ? `${oneLine.slice(0, 40)}… (${value.length} chars)` : JSON.stringify(oneLine);
    }
    if (Array.isArray(value)) return value.length > 3 ? `[${value.length} items]` : JSON.stringify(value);
    if (value && typeof value === "object") return `{${Object.keys(value).length} keys}`;
    return String(value);
  }

  function parseArguments(raw) {
    if (raw && typeof raw === "object") return raw;
    try {
      const parsed = JSON.parse(raw || "{}");
      return parsed && typeof parsed === "object" ? parsed : { value: parsed };
    } catch (exc) {
      return { _raw: String(raw) };
    }
  }

  function argumentsSummary(args) {
    const parts = Object.entries(args).map(([key, value]) => `${key}=${summarizeValue(value)}`);
    const text = visibleControls(parts.join(", "));
    return text.length > 160 ? `${text.slice(0, 157)}…` : text;
  }

  // Direction controls (bidi overrides, embeddings, isolates, marks) in what a model sends would
  // reorder what a person reads — "keep/\u202etxt.exe" shows as "keep/exe.txt". Where a person
  // judges arguments (tool cards, approvals) they are shown by name instead.
  const DIRECTION_CONTROLS = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

  function visibleControls(text) {
    return String(text).replace(
      DIRECTION_CONTROLS,
      (ch) => `⟨U+${ch.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}⟩`
    );
  }

  /** Tool cards are keyed by (turn, call id): a model may reuse a call id in a later turn. */
  function cardKey(turn, callId) {
    return `${turn === null || turn === undefined ? "?" : turn}\u0000${callId}`;
  }

  /**
   * The turn an event belongs to: its own `turn_id` if it carries one, else the turn of the last
   * `turn.started` applied. Unknown for a replayed event older than the first `turn.started` in
   * the backlog (undefined: its card is already built from the messages); a live one then
   * belongs to the newest turn shown.
   */
  function eventTurn(data, live) {
    if (data && data.turn_id !== undefined && data.turn_id !== null) return data.turn_id;
    if (state.currentTurn !== null) return state.currentTurn;
    return live ? state.lastMessageTurn : undefined;
  }

  function toolCard(turn, callId, tool, rawArguments) {
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

  function setToolState(card, name, label) {
    card.dataset.state = name;
    card.querySelector(".tool-state").textContent = label;
  }

  function toolStarted(data, turn) {
    const card = toolCard(turn, data.call_id, data.tool, data.arguments);
    if (card.dataset.ok === undefined && !state.waitingCalls.has(cardKey(turn, data.call_id))) setToolState(card, "running", "running…");
    placeOrphan(card);
  }

  function toolEnded(data, turn) {
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

  function toolResult(message) {
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
  function placeOrphan(card) {
    if (!card.isConnected) keepScrolled(() => ui.streamSlot.append(card));
  }

  /** "Agent", or who sent a user message: "You", or the colleague's name (a Session is the tenant's). */
  function authorLabel(message) {
    if (message.role === "assistant") return "Agent";
    if (message.role !== "user") return message.role;
    return message.author && message.author !== USERNAME ? message.author : "You";
  }

  /** Who a message is from, as shown above it: a task the MainSession handed over (its author is
   * the owner, but nobody typed it here) says so and links back. */
  function authorElement(message) {
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

  function messageShell(message, extraClass) {
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
  const SESSION_EVENT_HEADER = "[Session event: not a message from the user]";
  const SUB_SESSION_REF = /^The sub-Session "(.*)" \(([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\) (.*)$/;
  const DELIVERED_FILE = /^- (from-[0-9a-f]{8}\/.+)$/;

  /** A session event is the product telling this Session something (a sub-Session finished),
   * not the user speaking: a notice with a link to the sub-Session, its live title and status. */
  function sessionEventCard(message) {
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
  function describeSubSession(id, link, status) {
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
  const ROUND_HEAD = /^Goal run, round (\d+) of (\d+)\.\s*$/;
  const ROUND_TAILS = ["\n\nWhat the product recorded after round ", "\n\nWork toward this goal."];

  /**
   * A round of a goal run: the driver queued it in the name of the person who started the run, so
   * it is labelled "Goal run · round k of N", not shown as their bubble. It shows the goal and what
   * the product still found open; the whole text the agent got unfolds.
   */
  function goalRoundCard(message) {
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
  const LONG_MESSAGE_CHARS = 3000;
  const LONG_MESSAGE_LINES = 40;

  /** A message's body; a long one collapsed to its start, with a button that shows it all. */
  function messageBody(content) {
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

  function renderMessage(message) {
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

  function renderMessages(rows) {
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

  let messageFetch = null;
  let fetchAgain = false;
  function fetchNewMessages() {
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

  function streamFor(callId) {
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

  function appendDelta(data) {
    const stream = streamFor(data.model_call_id);
    keepScrolled(() => {
      stream.body.append(document.createTextNode(data.text || ""));
      stream.node.hidden = !stream.body.textContent;
    });
  }

  /** The committed message replaces the live text: keep it until that message is rendered. */
  function endStream() {
    if (state.stream) state.staleStreams.push(state.stream.node);
    state.stream = null;
  }

  function dropStaleStreams() {
    for (const node of state.staleStreams) node.remove();
    state.staleStreams = [];
  }

  // --- timeline extras: failure notes and delivery cards ----------------------------------------

  const FAILED_TURN_REASONS = {
    error: "The turn ended with an error",
    blocked: "The turn was stopped",
    max_tokens: "The model hit its output limit",
  };

  /**
   * Notes and cards belong to a turn: each sits after the last message of its turn (or of an
   * earlier one), in the order it was made, however late the messages around it arrive.
   */
  function addExtra(node, turn, order) {
    node.dataset.turn = turn === null || turn === undefined ? "" : String(turn);
    node.dataset.order = String(order !== undefined ? order : (state.extraOrder += 1));
    node.classList.add("timeline-extra");
    keepScrolled(() => {
      ui.messages.append(node);
      settleExtras();
    });
  }

  function settleExtras() {
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
  function turnFailed(turn, reason, lead, detail) {
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
  function compactionNote(turn, data) {
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
  function sessionRecovered(data, turn) {
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

  const MEMORIES_API = "/api/v1/memories/";
  const names = (value) => (Array.isArray(value) ? value.map(String).filter(Boolean) : []);

  /** What a `capabilities.added` event (or the session's `capabilities`) attached, by kind, as words. */
  function capabilityParts(data) {
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
  function pointTurn(data, live, afterMessage) {
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
  function eventNote(seq, data, live, build) {
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
  function capabilitiesKey(data) {
    return ["skills", "toolsets", "tools"].map((key) => [...names(data && data[key])].sort().join(",")).join("|");
  }

  /** `capabilities.added`: "Loaded skill research-guide" where it happened in the conversation. */
  function capabilitiesNote(seq, data, live) {
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
  function memoryRecalledNote(seq, data, live) {
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

  // --- the outer task loop in the timeline: understanding, orchestration, goals ------------------

  const PREPARATION_FAILURES = {
    task_relation_failed: "Task understanding failed",
    orchestration_failed: "Capability orchestration failed",
  };
  const PHRASES = {
    new_task: ["Understood as a new task", true],
    continue_current: ["Continues the current task", false],
    change_within_session: ["New phase within the session", true],
    out_of_scope: ["Out of scope of this session — goals unchanged", false],
    uncertain: ["Uncertain how this relates to the task — goals unchanged", false],
  };
  const GOAL_EXCERPT_CHARS = 120;

  function noteItem(testid, className, icon, dataset, ...lines) {
    return el(
      "li",
      { className: `turn-note event-note ${className}`, dataset: { testid, ...dataset }, attrs: { role: "status" } },
      el("span", { className: "turn-note-icon", attrs: { "aria-hidden": "true" }, text: icon }),
      el("div", { className: "turn-note-lines" }, lines.flat())
    );
  }

  /** A goal in a note: quoted, clipped (the whole text on hover). */
  function quoted(text) {
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
  function taskUnderstoodNote(seq, data, live) {
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
  function orchestrationNote(seq, data, live) {
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
  function preparationFailedNote(seq, data, live) {
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
  function rememberGoals(data) {
    const known = {};
    for (const field of GOAL_FIELDS) if (typeof data[field] === "string") known[field] = data[field];
    state.goalsSeen = { ...(state.goalsSeen || {}), ...known };
  }

  /** `goals.updated`: "Goals edited by alice", with what changed. */
  function goalsUpdatedNote(seq, data, live) {
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

  // --- the goal driver in the timeline -----------------------------------------------------------

  const { decisionText, formatTokens, formatDuration } = goalRun || {};
  const DECISION_ICONS = { continue: "↻", done: "✓", stop: "■" };

  const plural = (n, word) => `${n} ${word}${Number(n) === 1 ? "" : "s"}`;
  const byWhom = (name) => (name ? ` by ${name === USERNAME ? "you" : name}` : "");

  /** A run's round limit: from its `goal.started`, else from the run the card shows. */
  function roundLimit(runId) {
    const key = String(runId);
    if (state.goalRuns.has(key)) return state.goalRuns.get(key);
    const run = goalCard && goalCard.current();
    return run && String(run.id) === key ? run.max_rounds : null;
  }

  /** `goal.started`: "Goal run started by alice: up to 3 rounds, 200 000 tokens, 1 h — “…”". */
  function goalStartedNote(seq, data, live) {
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
  function goalSetByRun(seq, data, before) {
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
  function goalDecidedNote(seq, data, live) {
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
  function goalPausedNote(seq, data, live) {
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
  function inputRequestedNote(seq, data, live) {
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

  const INPUT_OUTCOMES = { accepted: "answered", declined: "declined", cancelled: "cancelled", expired: "expired (declined)" };

  /** `input.answered`: how the server's question ended, and by whom. */
  function inputAnsweredNote(seq, data, live) {
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
  function goalResumedNote(seq, data, live) {
    eventNote(seq, data, live, () =>
      noteItem("goal-resumed", "goal-note", "▶", { goalRunId: data.goal_run_id }, el("p", { text: `Goal run resumed${byWhom(data.by)}` }))
    );
  }

  function recalledMemory(id) {
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

  // --- capabilities card ------------------------------------------------------------------------

  const DEFAULT_TOOLS = new Set(names(boot.defaultTools));
  const CAPABILITY_GROUPS = [
    ["skills", "Skills"],
    ["toolsets", "Tool sets"],
    ["tools", "Extra tools"],
  ];

  const FRESH_MS = 2000; // how long a capability just added stays highlighted (app.css `flash`)
  const freshCapabilities = new Set(); // "kind\0name" added live in the last FRESH_MS

  /** Merge attached capabilities (the session's list or an event's additions): add-only.
   * Returns whether anything was new. */
  function addCapabilities(data, fresh = false) {
    const added = [];
    for (const [key] of CAPABILITY_GROUPS) {
      for (const name of names(data && data[key])) {
        if (key === "tools" && DEFAULT_TOOLS.has(name)) continue;
        if (state.capabilities[key].includes(name)) continue;
        state.capabilities[key].push(name);
        added.push(`${key}\u0000${name}`);
      }
    }
    if (fresh) {
      // A re-render soon after (the sources' re-read) keeps the highlight.
      for (const key of added) freshCapabilities.add(key);
      if (added.length) window.setTimeout(() => added.forEach((key) => freshCapabilities.delete(key)), FRESH_MS);
    }
    if (added.length) renderCapabilities();
    return added.length > 0;
  }

  const SOURCE_KINDS = { skill: "skills", toolset: "toolsets", tool: "tools" };

  /** Where each capability came from (`capability_sources` of the Session detail). */
  function applySources(rows) {
    const sources = new Map();
    const attached = { skills: [], toolsets: [], tools: [] };
    for (const row of rows) {
      const key = SOURCE_KINDS[row && row.kind];
      if (!key || !row.name) continue;
      sources.set(`${key}\u0000${row.name}`, { by: String(row.added_by || ""), at: row.added_at || "", servers: names(row.servers) });
      attached[key].push(String(row.name));
    }
    state.sources = sources;
    if (!addCapabilities(attached)) renderCapabilities();
  }

  /** "default", "chosen by orchestration", "loaded by the agent" or "added by alice". */
  function sourceLabel(by) {
    if (by === "default") return "default";
    if (by === "orchestrator") return "chosen by orchestration";
    if (by === "model") return "loaded by the agent";
    return by ? `added by ${by}` : "";
  }

  function sourceKind(by) {
    return ["default", "orchestrator", "model"].includes(by) ? by : "person";
  }

  function capabilitySource(key, name) {
    const source = state.sources.get(`${key}\u0000${name}`);
    if (!source) return null;
    const parts = [];
    const label = sourceLabel(source.by);
    if (label) {
      parts.push(
        el("span", {
          className: "capability-source",
          dataset: { testid: "capability-source", source: sourceKind(source.by) },
          attrs: { title: source.at ? `Added ${new Date(source.at).toLocaleString()}` : null },
          text: label,
        })
      );
    }
    if (source.servers.length) {
      parts.push(
        el("span", {
          className: "capability-servers muted",
          dataset: { testid: "capability-servers" },
          attrs: { title: "The MCP server these tools come from" },
          text: `MCP ${source.servers.length === 1 ? "server" : "servers"} ${source.servers.join(", ")}`,
        })
      );
    }
    return parts.length ? el("span", { className: "capability-meta" }, parts) : null;
  }

  function renderCapabilities() {
    const fresh = freshCapabilities;
    const groups = [];
    let total = 0;
    for (const [key, heading] of CAPABILITY_GROUPS) {
      const list = state.capabilities[key];
      if (!list.length) continue;
      total += list.length;
      groups.push(
        el(
          "div",
          { className: "capability-group", dataset: { kind: key } },
          el("h3", { text: heading }),
          el(
            "ul",
            { className: "capability-list", dataset: { testid: `capability-${key}` } },
            ...list.map((name) => {
              const description = key === "skills" && state.skillDescriptions ? state.skillDescriptions.get(name) : "";
              return el(
                "li",
                {
                  className: "capability",
                  dataset: { testid: "capability", kind: key, name, fresh: fresh.has(`${key}\u0000${name}`) ? "true" : null },
                },
                el("span", { className: "capability-line" }, el("code", { className: "capability-name", text: name }), capabilitySource(key, name)),
                description ? el("span", { className: "capability-description muted", dataset: { testid: "capability-description" }, text: description }) : null
              );
            })
          )
        )
      );
    }
    ui.capabilityGroups.replaceChildren(...groups);
    ui.capabilitiesEmpty.hidden = total > 0;
    ui.capabilitiesCount.textContent = total ? `${total} loaded` : "";
    if (state.capabilities.skills.length && !state.skillDescriptions) loadSkillDescriptions();
  }

  let skillsRead = null;
  function loadSkillDescriptions() {
    if (skillsRead) return;
    skillsRead = apiAll("/api/v1/skills/?page_size=200")
      .then((skills) => {
        state.skillDescriptions = new Map(skills.map((skill) => [String(skill.name), String(skill.description || "")]));
        renderCapabilities();
      })
      .catch(() => {}); // the names alone say enough
  }

  function excerpt(text, limit) {
    const oneLine = String(text || "").trim();
    return oneLine.length > limit ? `${oneLine.slice(0, limit - 1).trimEnd()}…` : oneLine;
  }

  /** What a parser found, one short line per fact (lists of rows or objects as their count). */
  function factLines(facts) {
    if (!facts || typeof facts !== "object") return [];
    const plain = (value) => value === null || ["string", "number", "boolean"].includes(typeof value);
    return Object.entries(facts).map(([key, value]) => {
      let shown;
      if (plain(value)) shown = String(value);
      else if (Array.isArray(value) && value.every(plain)) shown = value.length > 8 ? `${value.slice(0, 8).join(", ")}, … (${value.length})` : value.join(", ");
      else if (Array.isArray(value)) shown = `${value.length} item${value.length === 1 ? "" : "s"}`;
      else shown = `${Object.keys(value).length} field${Object.keys(value).length === 1 ? "" : "s"}`;
      return `${key.replace(/_/g, " ")}: ${shown}`;
    });
  }

  /**
   * The answer this delivery follows is the agent's message just above the card: here only its
   * opening (the whole text when unfolded), so the card does not repeat it.
   */
  function answerExcerpt(answer) {
    const plain = answer.replace(/\*\*([^*\n]+)\*\*/g, "$1").replace(/`([^`\n]+)`/g, "$1").replace(/\s+/g, " ").trim();
    const short = excerpt(plain, ANSWER_EXCERPT_CHARS);
    if (short === plain) {
      return el(
        "p",
        { className: "delivery-answer", dataset: { testid: "delivery-answer" } },
        el("span", { className: "delivery-answer-label", text: "Answer" }),
        el("span", { className: "delivery-answer-excerpt", dataset: { testid: "delivery-answer-excerpt" }, text: plain })
      );
    }
    return el(
      "details",
      { className: "delivery-answer", dataset: { testid: "delivery-answer" } },
      el(
        "summary",
        { attrs: { title: "Show the whole answer" } },
        el("span", { className: "delivery-answer-label", text: "Answer" }),
        el("span", { className: "delivery-answer-excerpt", dataset: { testid: "delivery-answer-excerpt" }, text: short })
      ),
      el("div", { className: "delivery-answer-full", dataset: { testid: "delivery-answer-full" } }, richText(answer))
    );
  }

  function deliveryCard(delivery) {
    const key = String(delivery.id);
    const checks = Array.isArray(delivery.checks) ? delivery.checks : [];
    const deliveredFiles = Array.isArray(delivery.files) ? delivery.files : [];
    const failures = Array.isArray(delivery.unresolved_failures) ? delivery.unresolved_failures : [];
    const decisions = Array.isArray(delivery.decisions) ? delivery.decisions : [];
    const failedChecks = checks.filter((check) => !check.ok).length;
    const ok = delivery.checks_ok !== undefined ? Boolean(delivery.checks_ok) && !failures.length : !failedChecks && !failures.length;
    // The server's word (one owner for the API and the page); older records are judged the same way.
    const outcome = delivery.outcome || (!ok ? "failed" : !deliveredFiles.length && !checks.length ? "nothing_delivered" : "delivered");
    const verdict = [];
    if (outcome === "nothing_delivered") verdict.push("nothing delivered: no file written, nothing to check");
    else if (!checks.length) verdict.push("no file checks");
    else if (failedChecks) verdict.push(`${failedChecks} of ${checks.length} check${checks.length === 1 ? "" : "s"} failed`);
    else verdict.push(`all ${checks.length} check${checks.length === 1 ? "" : "s"} passed`);
    if (failures.length) verdict.push(`${failures.length} unresolved tool failure${failures.length === 1 ? "" : "s"}`);
    if (decisions.length) verdict.push(`${decisions.length} call${decisions.length === 1 ? "" : "s"} not run by decision`);
    const icon = { delivered: "✓", nothing_delivered: "○", failed: "✗" }[outcome] || "○";

    const parts = [
      el(
        "header",
        { className: "delivery-head" },
        el("span", { className: "delivery-icon", attrs: { "aria-hidden": "true" }, text: icon }),
        el("h3", { className: "delivery-title", text: "Delivery" }),
        el("span", {
          className: "badge machine-badge",
          attrs: { title: "Checked by the product with real parsers after the turn — not the model's own claim" },
          text: "machine-checked",
        }),
        el("span", { className: "delivery-verdict", dataset: { testid: "delivery-verdict" }, text: verdict.join(" · ") }),
        el(
          "span",
          { className: "delivery-when muted" },
          delivery.turn_number ? `turn ${delivery.turn_number} · ` : "",
          delivery.created_at ? timeElement(delivery.created_at, { clock: true }) : ""
        )
      ),
      el("p", {
        className: "delivery-lead muted",
        text: "What the product found when it opened the files this turn produced. These are automatic checks, not the agent's words.",
      }),
    ];
    if (delivery.final_answer) parts.push(answerExcerpt(String(delivery.final_answer)));
    if (deliveredFiles.length) {
      parts.push(
        el("h4", { text: "Files" }),
        el(
          "ul",
          { className: "delivery-files", dataset: { testid: "delivery-files" } },
          ...deliveredFiles.map((file) =>
            el(
              "li",
              { dataset: { path: file.path } },
              files
                ? el("button", {
                    className: "link delivery-file",
                    attrs: { type: "button", title: `Preview ${file.path}` },
                    text: file.path,
                    on: { click: () => files.open(file.path) },
                  })
                : el("code", { text: file.path }),
              el("span", { className: "muted", text: ` ${formatBytes(file.size)}` }),
              file.sha256
                ? el("code", { className: "delivery-hash muted", attrs: { title: `sha256 ${file.sha256}` }, text: `sha256 ${String(file.sha256).slice(0, 12)}…` })
                : null
            )
          )
        )
      );
    }
    if (checks.length) {
      parts.push(
        el("h4", { text: "Checks" }),
        el(
          "ul",
          { className: "delivery-checks", dataset: { testid: "delivery-checks" } },
          ...checks.map((check) => {
            const facts = factLines(check.facts);
            return el(
              "li",
              { className: "delivery-check", dataset: { testid: "delivery-check", ok: check.ok ? "true" : "false", path: check.path } },
              el("span", { className: "check-mark", attrs: { "aria-hidden": "true" }, text: check.ok ? "✓" : "✗" }),
              el("span", { className: "visually-hidden", text: check.ok ? "passed: " : "failed: " }),
              el("code", { className: "check-path", text: check.path || "" }),
              el("span", { className: "check-name", text: check.check || "" }),
              check.detail ? el("span", { className: "check-detail", text: check.detail }) : null,
              facts.length
                ? el(
                    "details",
                    { className: "check-facts" },
                    el("summary", { text: "what the parser found" }),
                    el("ul", {}, ...facts.map((line) => el("li", { text: line })))
                  )
                : null
            );
          })
        )
      );
    }
    if (decisions.length) {
      const said = (decision) =>
        decision.decision === "denied"
          ? `Denied by the approval policy${decision.comment ? `: ${decision.comment}` : ""}`
          : `${decision.decision === "expired" ? "Expired without a decision" : `Rejected by ${decision.by || "a person"}`}${decision.comment ? `: ${decision.comment}` : ""}`;
      parts.push(
        el("h4", { text: "Decisions" }),
        el(
          "ul",
          { className: "delivery-decisions", dataset: { testid: "delivery-decisions" } },
          ...decisions.map((decision) =>
            el(
              "li",
              { dataset: { callId: decision.call_id, decision: decision.decision } },
              el("span", { className: "check-mark", attrs: { "aria-hidden": "true" }, text: "⊘" }),
              el("code", { text: decision.tool || "tool" }),
              el("span", { text: ` not run — ${said(decision)}` })
            )
          )
        )
      );
    }
    if (failures.length) {
      parts.push(
        el("h4", { className: "failures-heading", text: "Unresolved failures" }),
        el(
          "ul",
          { className: "delivery-failures", dataset: { testid: "delivery-failures" } },
          ...failures.map((failure) =>
            el(
              "li",
              { dataset: { callId: failure.call_id } },
              el("span", { className: "check-mark", attrs: { "aria-hidden": "true" }, text: "✗" }),
              el("code", { text: failure.tool || "tool" }),
              el("span", { text: ` ${failure.summary || "failed"}` })
            )
          )
        )
      );
    }
    const card = el(
      "li",
      { className: "delivery-card", dataset: { testid: "delivery-card", deliveryId: key, checksOk: ok ? "true" : "false", outcome } },
      ...parts
    );
    return card;
  }

  /** `order`: the place among its turn's notes, taken when `delivery.recorded` arrived (the card
   * is read after it): a note of a later event of the turn stays after it, as after a reload. */
  function showDelivery(delivery, order) {
    if (!delivery || delivery.id === undefined || delivery.id === null) return;
    const key = String(delivery.id);
    const fresh = deliveryCard(delivery);
    const known = state.deliveryCards.get(key);
    state.deliveryCards.set(key, fresh);
    if (known) {
      fresh.dataset.turn = known.dataset.turn;
      fresh.dataset.order = known.dataset.order;
      fresh.classList.add("timeline-extra");
      known.replaceWith(fresh);
    } else {
      addExtra(fresh, delivery.turn, order);
    }
  }

  function loadDelivery(id) {
    if (id === undefined || id === null) return;
    const order = (state.extraOrder += 1);
    api(`${boot.api}deliveries/${encodeURIComponent(id)}/`)
      .then((delivery) => showDelivery(delivery, order))
      .catch(() => {});
  }

  async function loadDeliveries() {
    try {
      for (const delivery of await apiAll(`${boot.api}deliveries/`)) showDelivery(delivery);
    } catch (exc) {
      // An older server without deliveries: the timeline simply has none.
    }
  }

  // --- sub-Sessions ---------------------------------------------------------------------------

  /**
   * The sub-Sessions this MainSession handed tasks to (`children` of the Session detail): read on
   * load, again when a `session_delegate` call ends or a turn starts or ends; their status pills
   * follow the tenant's status stream (`/ws/sessions/`) while the list is not empty.
   */
  const childRows = new Map(); // child id -> row element

  function showChildren(children) {
    if (!ui.children) return;
    const rows = children.map((child) => {
      const id = String(child.id);
      const row = el(
        "li",
        { className: "child-row", dataset: { testid: "child-session", id, status: child.status } },
        el("a", {
          className: "child-link",
          dataset: { testid: "child-link" },
          attrs: { href: `/sessions/${encodeURIComponent(id)}/` },
          text: child.title || "Untitled session",
        }),
        statusBadge(child.status)
      );
      return [id, row];
    });
    childRows.clear();
    for (const [id, row] of rows) childRows.set(id, row);
    ui.childrenList.replaceChildren(...rows.map(([, row]) => row));
    ui.children.hidden = rows.length === 0;
    ui.childrenCount.textContent = rows.length ? String(rows.length) : "";
    if (rows.length) followChildren();
  }

  function childStatus(id, status) {
    const row = childRows.get(String(id));
    if (!row || !status) return;
    row.dataset.status = status;
    row.querySelector(".status-badge").replaceWith(statusBadge(status));
  }

  let childSocket = null;
  function followChildren() {
    if (childSocket || state.stopped) return;
    const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(`${scheme}//${window.location.host}/ws/sessions/`);
    childSocket = socket;
    socket.addEventListener("open", () => refreshHeader()); // what changed while it was away
    socket.addEventListener("message", (message) => {
      let frame = null;
      try {
        frame = JSON.parse(message.data);
      } catch (exc) {
        return;
      }
      if (frame && frame.type === "session.status" && frame.data) childStatus(frame.session, frame.data.status);
    });
    socket.addEventListener("close", (event) => {
      childSocket = null;
      if (event.code === 4401 || state.stopped) return; // logged out or removed from the tenant
      window.setTimeout(followChildren, 3000);
    });
  }

  // --- plan -----------------------------------------------------------------------------------

  const TASK_ICONS = { pending: "○", in_progress: "◔", done: "✓", skipped: "–" };

  function renderPlan(plan) {
    const tasks = (plan && plan.tasks) || [];
    ui.planEmpty.hidden = Boolean(plan);
    ui.planTitle.hidden = !plan;
    ui.planTitle.textContent = plan ? plan.title : "";
    ui.planTasks.replaceChildren(
      ...tasks.map((task) =>
        el(
          "li",
          { className: "plan-task", dataset: { testid: "plan-task", status: task.status, taskId: task.id } },
          el("span", { className: "task-icon", attrs: { "aria-hidden": "true" }, text: TASK_ICONS[task.status] || "•" }),
          el("span", { className: "task-title", text: task.title }),
          el("span", { className: "visually-hidden", text: ` (${statusLabel(task.status)})` })
        )
      )
    );
    const done = tasks.filter((t) => t.status === "done" || t.status === "skipped").length;
    ui.planProgress.textContent = tasks.length ? `${done} / ${tasks.length} done` : "";
  }

  // --- approvals ------------------------------------------------------------------------------

  const DECIDED_LABELS = {
    approved: "Approved",
    rejected: "Rejected",
    expired: "Expired without a decision",
    cancelled: "Cancelled",
  };
  const RISK_HINTS = {
    read: "reads data only",
    write: "changes files or data",
    destructive: "deletes or overwrites; cannot be undone",
    external: "reaches outside the workspace",
  };

  /** `approval.decided` says approve/reject or the resulting status: accept both. */
  function decisionStatus(decision) {
    return { approve: "approved", reject: "rejected" }[decision] || String(decision || "");
  }

  function approvalUrl(id) {
    return `${APPROVALS_API}${encodeURIComponent(id)}/`;
  }

  function approvalCard(id) {
    const key = String(id);
    let card = state.approvalCards.get(key);
    if (card) return card;
    const commentId = `approval-comment-${key}`;
    card = el(
      "article",
      {
        className: "approval-card",
        dataset: { testid: "approval-card", approvalId: key, status: "pending" },
        attrs: { "aria-labelledby": `approval-title-${key}` },
      },
      el(
        "header",
        { className: "approval-head" },
        el("span", { className: "approval-icon", attrs: { "aria-hidden": "true" } }),
        el(
          "h3",
          { className: "approval-title", attrs: { id: `approval-title-${key}` } },
          el("span", { className: "approval-kicker", text: "Approval needed" }),
          el("code", { className: "approval-tool", dataset: { testid: "approval-tool" } })
        ),
        el("span", { className: "risk-badge", dataset: { testid: "approval-risk" } }),
        el("span", { className: "approval-state", dataset: { testid: "approval-state" }, text: "waiting for a decision" })
      ),
      el("p", { className: "approval-reason", dataset: { testid: "approval-reason" } }),
      el("div", { className: "approval-arguments", dataset: { testid: "approval-arguments" } },
        el("p", { className: "muted", text: "Loading the call’s arguments…" })),
      el("p", { className: "approval-times muted", dataset: { testid: "approval-times" } }),
      el(
        "div",
        { className: "approval-decide" },
        el("label", { className: "approval-comment-label", attrs: { for: commentId } }, "Comment ", el("span", { className: "muted", text: "(optional)" })),
        el("textarea", {
          className: "approval-comment",
          dataset: { testid: "approval-comment" },
          attrs: { id: commentId, rows: 1, maxlength: 5000, placeholder: "Why? The agent sees this with a rejection." },
        }),
        el(
          "div",
          { className: "approval-actions" },
          el("button", {
            className: "danger",
            dataset: { testid: "reject-button" },
            attrs: { type: "button" },
            text: "Reject",
            on: { click: () => decide(key, "reject") },
          }),
          el("button", {
            className: "approve",
            dataset: { testid: "approve-button" },
            attrs: { type: "button" },
            text: "Approve",
            on: { click: () => decide(key, "approve") },
          })
        )
      ),
      el("p", { className: "approval-message", dataset: { testid: "approval-message" }, attrs: { role: "alert", hidden: true } }),
      el(
        "div",
        { className: "approval-outcome", attrs: { hidden: true } },
        el("p", { className: "approval-outcome-text", dataset: { testid: "approval-outcome" } }),
        el("button", {
          className: "link small",
          attrs: { type: "button", "aria-label": "Dismiss this decided approval" },
          text: "Dismiss",
          on: { click: () => dismissApproval(key) },
        })
      )
    );
    state.approvalCards.set(key, card);
    ui.approvals.append(card);
    syncApprovalsVisibility();
    return card;
  }

  function setApprovalMessage(card, text, isError = false) {
    const message = card.querySelector(".approval-message");
    message.textContent = text || "";
    message.hidden = !text;
    message.classList.toggle("error", Boolean(text) && isError);
  }

  function setDeciding(card, busy) {
    card.dataset.busy = busy ? "true" : "false";
    for (const button of card.querySelectorAll(".approval-actions button")) button.disabled = busy;
    card.querySelector(".approval-comment").disabled = busy;
  }

  /** Risk as a word and a colour (never colour alone). */
  function showRisk(card, risk) {
    if (!risk) return;
    card.dataset.risk = risk;
    const badge = card.querySelector(".risk-badge");
    badge.dataset.risk = risk;
    badge.textContent = risk;
    badge.title = RISK_HINTS[risk] ? `Risk: ${risk} — ${RISK_HINTS[risk]}` : `Risk: ${risk}`;
  }

  /** What the call would do, the paths first: for a deletion, the user must see which files go. */
  function renderApprovalArguments(card, tool, rawArguments) {
    const box = card.querySelector(".approval-arguments");
    const args = parseArguments(rawArguments);
    const parts = [];
    const paths = Array.isArray(args.paths) ? args.paths.map(String) : typeof args.path === "string" ? [args.path] : [];
    if (paths.length) {
      const deleting = tool === "fs_delete_files";
      const lead = deleting
        ? `${paths.length === 1 ? "File" : `${paths.length} files`} to delete from the workspace, permanently:`
        : `${paths.length === 1 ? "File" : "Files"}:`;
      parts.push(el("p", { className: "approval-files-lead", text: lead }));
      parts.push(
        el(
          "ul",
          { className: `approval-files${deleting ? " deleting" : ""}`, dataset: { testid: "approval-paths" } },
          ...paths.map((path) => el("li", { dataset: { path } }, el("code", { text: visibleControls(path) })))
        )
      );
    }
    if (typeof args.command === "string") {
      parts.push(el("p", { className: "approval-files-lead", text: "Command:" }));
      parts.push(el("pre", { className: "approval-command", text: visibleControls(args.command) }));
    }
    const full = visibleControls(JSON.stringify(args, null, 2));
    const json = el("pre", {
      className: "approval-json",
      text: full.length > RESULT_PREVIEW_CHARS ? `${full.slice(0, RESULT_PREVIEW_CHARS)}\n…` : full,
    });
    // With the paths shown above, the raw JSON is one click away; otherwise it is the whole story.
    parts.push(
      el("details", { className: "approval-raw", attrs: { open: !parts.length } }, el("summary", { text: "Arguments (JSON)" }), json)
    );
    box.replaceChildren(...parts);
    card.dataset.hasArguments = "1";
  }

  function renderApprovalTimes(card) {
    const times = card.querySelector(".approval-times");
    const parts = [];
    const requested = card.dataset.requestedAt;
    if (requested) parts.push("requested ", timeElement(requested));
    if (card.dataset.expiresAt && card.dataset.status === "pending") {
      const expires = card.dataset.expiresAt;
      const past = new Date(expires).getTime() <= Date.now();
      parts.push(parts.length ? " · " : "", past ? "expired " : "expires ", timeElement(expires));
    }
    if (card.dataset.rule) parts.push(parts.length ? " · " : "", `rule: ${card.dataset.rule}`);
    times.replaceChildren(...parts);
    times.hidden = parts.length === 0;
  }

  function refreshApprovalTimes() {
    for (const card of state.approvalCards.values()) renderApprovalTimes(card);
  }

  function ruleName(rule) {
    if (!rule || typeof rule !== "object") return "";
    return String(rule.name || rule.policy || rule.tool_glob || rule.risk || "");
  }

  /** The tool card of the gated call follows its approval. */
  function markToolCard(callId, status, tool) {
    if (!callId) return;
    // A pending or just-decided approval belongs to the turn running now.
    const turn = eventTurn(null, true);
    const key = cardKey(turn, callId);
    if (status === "pending") {
      const card = toolCard(turn, callId, tool || "tool");
      state.waitingCalls.set(key, true);
      if (card.dataset.ok === undefined) setToolState(card, "waiting", "waiting for approval");
      placeOrphan(card);
      return;
    }
    state.waitingCalls.delete(key);
    const card = state.toolCards.get(key);
    if (!card || card.dataset.ok !== undefined) return;
    if (status === "approved") setToolState(card, "running", "approved, running…");
    else setToolState(card, "declined", status); // tool.ended follows with the result the model sees
  }

  /** Apply an approval as the API returns it (or as much of it as an event carries). */
  function showApproval(approval) {
    if (!approval || approval.id === undefined || approval.id === null) return null;
    if (approval.session && String(approval.session) !== String(boot.id)) return null;
    const card = approvalCard(approval.id);
    if (approval.tool) card.querySelector(".approval-tool").textContent = approval.tool;
    if (approval.tool) card.dataset.tool = approval.tool;
    if (approval.call_id) card.dataset.callId = approval.call_id;
    showRisk(card, approval.risk);
    if (approval.reason !== undefined) {
      const reason = card.querySelector(".approval-reason");
      reason.textContent = approval.reason || "";
      reason.hidden = !approval.reason;
    }
    if (approval.arguments !== undefined) renderApprovalArguments(card, approval.tool || card.dataset.tool, approval.arguments);
    if (approval.requested_at) card.dataset.requestedAt = approval.requested_at;
    if (approval.expires_at) card.dataset.expiresAt = approval.expires_at;
    const rule = ruleName(approval.rule);
    if (rule) card.dataset.rule = rule;
    const status = approval.status || card.dataset.status;
    if (status === "pending") {
      if (card.dataset.status === "pending") markToolCard(card.dataset.callId, "pending", card.dataset.tool);
    } else {
      showDecided(card, {
        status,
        by: approval.decided_by,
        at: approval.decided_at,
        comment: approval.comment,
      });
    }
    renderApprovalTimes(card);
    updateDocumentTitle();
    return card;
  }

  function showDecided(card, { status, by, at, comment }) {
    const known = card.dataset.status !== "pending" && card.dataset.status === status;
    card.dataset.status = status;
    card.querySelector(".approval-kicker").textContent = DECIDED_LABELS[status] || statusLabel(status);
    card.querySelector(".approval-state").textContent = statusLabel(status);
    card.querySelector(".approval-decide").hidden = true;
    setDeciding(card, false);
    // Fill in what is known; a later, fuller source (the API) may add the time and comment.
    if (by !== undefined && by !== null) card.dataset.decidedBy = by;
    if (at) card.dataset.decidedAt = at;
    if (comment !== undefined && comment !== null) card.dataset.comment = comment;
    const who = card.dataset.decidedBy && card.dataset.decidedBy !== "system" ? ` by ${card.dataset.decidedBy}` : "";
    const when = card.dataset.decidedAt ? ` at ${clockTime(card.dataset.decidedAt)}` : "";
    const said = card.dataset.comment ? ` — “${card.dataset.comment}”` : "";
    const outcome = card.querySelector(".approval-outcome");
    outcome.querySelector(".approval-outcome-text").textContent =
      `${DECIDED_LABELS[status] || statusLabel(status)}${who}${when}${said}`;
    outcome.hidden = false;
    if (!known) markToolCard(card.dataset.callId, status, card.dataset.tool);
    renderApprovalTimes(card);
    updateDocumentTitle();
  }

  function dismissApproval(key) {
    const card = state.approvalCards.get(key);
    if (!card || card.dataset.status === "pending") return;
    card.remove();
    state.approvalCards.delete(key);
    syncApprovalsVisibility();
    ui.input.focus();
  }

  async function loadPendingApprovals() {
    try {
      const rows = await apiAll(`${boot.api}approvals/?status=pending&page_size=200`);
      for (const approval of rows) showApproval(approval);
      ui.approvalsNote.textContent = "";
    } catch (exc) {
      ui.approvalsNote.textContent = `Could not load pending approvals: ${exc.message}`;
    }
    syncApprovalsVisibility();
  }

  function syncApprovalsVisibility() {
    ui.approvalsNote.hidden = !ui.approvalsNote.textContent;
    ui.approvals.hidden = state.approvalCards.size === 0 && ui.approvalsNote.hidden;
  }

  const approvalReads = new Map(); // approval id -> in-flight read
  function refreshApproval(id, { droppedWhileSending = false, alreadyDecided = false } = {}) {
    const key = String(id);
    if (approvalReads.has(key)) return approvalReads.get(key);
    const read = api(approvalUrl(key))
      .then((approval) => {
        const card = showApproval(approval);
        if (!card) return;
        if (alreadyDecided) {
          setApprovalMessage(card, "Already decided by someone else.", true);
        } else if (droppedWhileSending) {
          if (approval.status === "pending") {
            setDeciding(card, false);
            setApprovalMessage(card, "The connection dropped before the server answered: nothing was decided. Try again.", true);
          } else {
            setApprovalMessage(card, "");
          }
        }
      })
      .catch((exc) => {
        const card = state.approvalCards.get(key);
        if (!card) return;
        if (card.dataset.status === "pending") setDeciding(card, false);
        if (alreadyDecided) setApprovalMessage(card, "Already decided by someone else.", true);
        else setApprovalMessage(card, `Could not read this approval: ${exc instanceof ApiError ? exc.describe() : exc}`, true);
      })
      .finally(() => approvalReads.delete(key));
    approvalReads.set(key, read);
    return read;
  }

  function approvalRequested(data) {
    if (data.approval_id === undefined || data.approval_id === null) return;
    const fresh = !state.approvalCards.has(String(data.approval_id));
    const card = showApproval({
      id: data.approval_id,
      status: "pending",
      tool: data.tool,
      call_id: data.call_id,
      risk: data.risk,
      reason: data.reason,
    });
    if (!card) return;
    if (fresh) {
      card.scrollIntoView({ block: "nearest" });
      refreshApproval(data.approval_id); // the arguments and times are not in the event
    }
  }

  function approvalDecided(data) {
    const key = String(data.approval_id);
    const card = state.approvalCards.get(key);
    if (!card) return; // decided before this page read the pending list: nothing to show
    showDecided(card, { status: decisionStatus(data.decision), by: data.by });
    // "Approving…" is answered; an error (e.g. already decided) stays for the user to read.
    if (!card.querySelector(".approval-message").classList.contains("error")) setApprovalMessage(card, "");
    refreshApproval(key); // the decision time and comment
  }

  async function decide(key, decision) {
    const card = state.approvalCards.get(key);
    if (!card || card.dataset.status !== "pending" || card.dataset.busy === "true") return;
    const comment = card.querySelector(".approval-comment").value.trim();
    setDeciding(card, true);
    setApprovalMessage(card, decision === "approve" ? "Approving…" : "Rejecting…");
    const id = Number(key);
    if (socketOpen()) {
      const frame = { type: "decide", approval_id: id, decision };
      if (comment) frame.comment = comment;
      state.ws.send(JSON.stringify(frame));
      state.awaitingAck.push({ kind: "decide", approvalId: key });
      return;
    }
    try {
      const approval = await api(`${approvalUrl(key)}decide/`, { method: "POST", body: { decision, comment } });
      setApprovalMessage(card, "");
      showApproval(approval);
    } catch (exc) {
      decisionRefused(key, exc instanceof ApiError ? exc.code : "network", exc instanceof ApiError ? exc.describe() : String(exc));
    }
  }

  function decisionAcknowledged(id, status) {
    const card = state.approvalCards.get(String(id));
    if (!card) return;
    setApprovalMessage(card, "");
    if (status && status !== "pending") {
      showDecided(card, { status, by: card.dataset.decidedBy || USERNAME || undefined });
    }
    refreshApproval(id); // authoritative time, decider and comment
  }

  function decisionRefused(id, code, message) {
    const card = state.approvalCards.get(String(id));
    if (!card) {
      note(message, true);
      return;
    }
    if (code === "already_decided") {
      setApprovalMessage(card, "Already decided by someone else.", true);
      refreshApproval(id, { alreadyDecided: true });
      return;
    }
    setDeciding(card, false);
    setApprovalMessage(card, `Not decided: ${message}`, true);
  }

  /** Leaving `waiting_approval` without a decision event (an interrupt cancels): re-read open cards. */
  function reconcileApprovals(status) {
    if (status === "waiting_approval") {
      const anyPending = [...state.approvalCards.values()].some((card) => card.dataset.status === "pending");
      if (!anyPending) loadPendingApprovals();
      return;
    }
    for (const [key, card] of state.approvalCards) {
      if (card.dataset.status === "pending" && card.dataset.busy !== "true") refreshApproval(key);
    }
  }

  // --- activity log ---------------------------------------------------------------------------

  function eventDetail(event) {
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

  function logEvent(event) {
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

  // --- events ---------------------------------------------------------------------------------

  function applyEvent(event) {
    if (event.seq <= state.lastSeq) return; // already applied (replay after a reconnect)
    if (event.seq > state.lastSeq + 1 && state.gapAt !== state.lastSeq) {
      // The server promises no gaps; if one shows anyway, read that range again from the log (once).
      state.gapAt = state.lastSeq;
      reconnectNow();
      return;
    }
    state.lastSeq = event.seq;
    logEvent(event);
    const data = event.data || {};
    const live = event.seq > boot.snapshotSeq; // older ones are already in the fetched state
    switch (event.type) {
      case "turn.started":
        state.currentTurn = data.turn_id;
        break;
      case "message.committed":
        if (data.message_id !== undefined && data.message_id !== null) state.lastCommitted = Number(data.message_id);
        break;
      case "capabilities.added":
        addCapabilities(data, live);
        capabilitiesNote(event.seq, data, live);
        break;
      case "memory.recalled":
        memoryRecalledNote(event.seq, data, live);
        break;
      case "task.understood":
        taskUnderstoodNote(event.seq, data, live);
        break;
      case "orchestration.finished":
        orchestrationNote(event.seq, data, live);
        break;
      case "goals.updated":
        goalsUpdatedNote(event.seq, data, live);
        break;
      case "goal.started":
        goalStartedNote(event.seq, data, live);
        break;
      case "goal.decided":
        goalDecidedNote(event.seq, data, live);
        break;
      case "goal.paused":
        goalPausedNote(event.seq, data, live);
        break;
      case "goal.resumed":
        goalResumedNote(event.seq, data, live);
        break;
      case "input.requested":
        inputRequestedNote(event.seq, data, live);
        break;
      case "input.answered":
        inputAnsweredNote(event.seq, data, live);
        break;
      case "error":
        if (PREPARATION_FAILURES[data.code]) preparationFailedNote(event.seq, data, live);
        break;
      case "tool.started":
      case "tool.ended": {
        const turn = eventTurn(data, live);
        if (turn === undefined) return; // before the backlog's first turn: shown from the messages
        if (event.type === "tool.started") toolStarted(data, turn);
        else toolEnded(data, turn);
        // A delegation made (or reused) a sub-Session: the list of children changed.
        if (live && event.type === "tool.ended" && data.tool === "session_delegate") refreshHeader();
        return;
      }
      case "compaction.committed":
        compactionNote(eventTurn(data, live), data);
        break;
      case "model.ended":
        // A call cut off by a lost runner is not a failure of the turn: the recovery card says what happened.
        if (data.error && data.finish_reason !== "interrupted") turnFailed(eventTurn(data, live), "error", "The model call failed", String(data.error));
        break;
      case "session.recovered":
        sessionRecovered(data, eventTurn(data, live));
        break;
      case "turn.ended":
        if (FAILED_TURN_REASONS[data.reason]) {
          turnFailed(eventTurn(data, live), data.reason, FAILED_TURN_REASONS[data.reason], data.detail ? String(data.detail) : "");
        }
        break;
    }
    if (!live) return;
    switch (event.type) {
      case "session.status":
        setStatus(data.status, data.reason);
        reconcileApprovals(data.status);
        if (inputPanel && data.status !== "running") inputPanel.reconcile();
        break;
      case "approval.requested":
        approvalRequested(data);
        break;
      case "approval.decided":
        approvalDecided(data);
        break;
      case "input.requested":
        if (inputPanel) inputPanel.requested(data);
        break;
      case "input.answered":
        if (inputPanel) inputPanel.answered(data);
        break;
      case "message.committed":
        if (data.role === "assistant") endStream();
        fetchNewMessages();
        break;
      case "model.started":
        streamFor(data.model_call_id);
        break;
      case "plan.updated":
        renderPlan(data.plan);
        break;
      case "turn.started":
        clearInfoNote(); // "Message queued." is answered: the turn has it
        refreshHeader();
        break;
      case "task.understood":
      case "goals.updated":
        showGoals(data, data.by);
        break;
      case "capabilities.added":
        refreshHeader(); // where they came from: the Session detail's capability_sources
        break;
      case "turn.ended":
        clearInfoNote();
        endStream();
        fetchNewMessages().then(dropStaleStreams);
        refreshHeader();
        if (goalCard) goalCard.turnEnded(); // tokens and time spent, the rounds done
        break;
      case "goal.started":
      case "goal.decided":
      case "goal.paused":
      case "goal.resumed":
        if (goalCard) goalCard.refresh();
        break;
      case "file.changed":
        if (files) files.fileChanged(data);
        break;
      case "delivery.recorded":
        loadDelivery(data.delivery_id);
        break;
      case "session.archived":
        note("This Session was archived.");
        break;
      case "error":
        // An outer-loop failure is told at its turn in the timeline; the composer is not the place.
        if (!PREPARATION_FAILURES[data.code]) note(`${data.code}: ${data.message}`, true);
        break;
    }
  }

  function applyFrame(frame) {
    if (!frame || typeof frame !== "object") return;
    if (frame.seq === null || frame.seq === undefined) {
      // A refused client frame is `{"type": "error", "error": {code, message}}` (CONTRACT WebSocket).
      const data = (frame.type === "error" ? frame.error : frame.data) || {};
      if (frame.type === "model.delta") appendDelta(data);
      else if (frame.type === "ack") {
        const sent = state.awaitingAck.shift();
        if ((sent && sent.kind === "decide") || data.approval_id !== undefined) {
          decisionAcknowledged(data.approval_id !== undefined ? data.approval_id : sent.approvalId, data.status);
        } else {
          note((sent && sent.note) || "Queued.");
        }
      } else if (frame.type === "error") {
        const sent = state.awaitingAck.shift(); // a refused frame is answered by an error instead of an ack
        const message = data.message || "The server refused that.";
        if (sent && sent.kind === "decide") decisionRefused(sent.approvalId, data.code, message);
        else note(message, true);
      }
      return;
    }
    applyEvent(frame);
  }

  // --- WebSocket ------------------------------------------------------------------------------

  function setLive(name, text) {
    ui.live.dataset.state = name;
    ui.liveText.textContent = text;
  }

  function connect() {
    state.retryTimer = null;
    if (state.stopped || state.ws) return;
    const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${scheme}//${window.location.host}${boot.ws}?after=${state.lastSeq}`);
    state.ws = ws;
    let opened = false;
    ws.addEventListener("open", () => {
      opened = true;
      state.attempts = 0;
      setLive("live", "live");
    });
    ws.addEventListener("message", (message) => {
      if (state.ws !== ws) return; // a socket being replaced
      let frame;
      try {
        frame = JSON.parse(message.data);
      } catch (exc) {
        return;
      }
      applyFrame(frame);
    });
    ws.addEventListener("close", (event) => {
      if (state.ws === ws) state.ws = null;
      if (event.code === 4401) {
        signedOut(); // the server closed it: this login ended or left the tenant
        return;
      }
      if (state.awaitingAck.length) {
        const unanswered = state.awaitingAck;
        state.awaitingAck = [];
        if (unanswered.some((sent) => sent.kind !== "decide")) {
          note("The connection dropped while sending; check that your last message arrived.", true);
        }
        // A decision may or may not have been recorded: ask the API rather than guess.
        for (const sent of unanswered) if (sent.kind === "decide") refreshApproval(sent.approvalId, { droppedWhileSending: true });
      }
      if (!opened) state.attempts += 1;
      scheduleReconnect();
    });
  }

  function scheduleReconnect() {
    if (state.stopped || state.retryTimer) return;
    setLive("reconnecting", "reconnecting…");
    // A restart drops the socket once; a refused handshake fails every time: ask why then.
    if (state.attempts >= 1) checkStillAllowed();
    const delay = Math.min(1000 * 2 ** Math.min(state.attempts, 5), 30000) * (0.75 + Math.random() * 0.5);
    state.retryTimer = setTimeout(connect, delay);
  }

  function reconnectNow() {
    const ws = state.ws;
    if (!ws) return;
    state.ws = null;
    ws.close(); // its close handler schedules the reconnect from state.lastSeq
  }

  /** A refused handshake looks like a network error in the browser: ask the API why. */
  function checkStillAllowed() {
    api(boot.api).catch((exc) => {
      if (!(exc instanceof ApiError)) return;
      if (exc.status === 401 || exc.status === 403) {
        signedOut();
      } else if (exc.status === 404) {
        state.stopped = true;
        clearTimeout(state.retryTimer);
        setLive("offline", "offline");
        note("This Session is no longer available.", true);
      }
    });
  }

  /** The browser's login ended (signed out elsewhere, expired, removed from the tenant): say so
   * with a way back, and stop reconnecting — retrying could never succeed. */
  function signedOut() {
    state.stopped = true;
    clearTimeout(state.retryTimer);
    setLive("signed-out", "signed out");
    const next = encodeURIComponent(window.location.pathname);
    ui.note.replaceChildren(
      "Signed out — ",
      el("a", { attrs: { href: `/accounts/login/?next=${next}` }, dataset: { testid: "sign-in-again" }, text: "sign in again" }),
      " to keep following this Session."
    );
    ui.note.classList.add("error");
  }

  window.addEventListener("online", () => {
    if (!state.ws && !state.stopped) {
      clearTimeout(state.retryTimer);
      state.retryTimer = null;
      connect();
    }
  });

  // --- composer -------------------------------------------------------------------------------

  function note(text, isError = false) {
    ui.note.textContent = text;
    ui.note.classList.toggle("error", isError);
  }

  /** Progress notes ("Message queued.") answer one moment; a turn starting or ending ends it. */
  function clearInfoNote() {
    if (!ui.note.classList.contains("error")) ui.note.textContent = "";
  }

  function socketOpen() {
    return state.ws && state.ws.readyState === WebSocket.OPEN;
  }

  // The API's limit on one input (InputCreateSerializer); the page counts against it as you type.
  const INPUT_MAX = Number(ui.input.dataset.maxLength) || 100000;
  const INPUT_COUNT_FROM = 0.8; // the count shows from this share of the limit on
  const composerCount = $("composer-count");

  /** The live count under the message box; over the limit Send is disabled and says why. */
  function updateInputCount() {
    const length = ui.input.value.length;
    const over = length - INPUT_MAX;
    composerCount.hidden = length < INPUT_MAX * INPUT_COUNT_FROM;
    composerCount.classList.toggle("error", over > 0);
    composerCount.textContent =
      over > 0
        ? `${length.toLocaleString()} / ${INPUT_MAX.toLocaleString()} characters: ${over.toLocaleString()} over the limit. ` +
          "Shorten it, or upload the text as a file (Files → Upload…) and ask the agent to read it."
        : `${length.toLocaleString()} / ${INPUT_MAX.toLocaleString()} characters`;
    ui.send.dataset.blocked = over > 0 ? "too-long" : "";
    ui.send.title = over > 0 ? "The message is over the limit: see the count under the box" : "";
    ui.send.setAttribute("aria-disabled", over > 0 ? "true" : "false");
  }

  async function send() {
    const text = ui.input.value;
    if (!text.trim()) {
      // Kept (as an error note) until the person types: a status event must not clear it.
      note("Type a message first: an empty message is not sent.", true);
      ui.input.focus();
      return;
    }
    if (text.length > INPUT_MAX) {
      note(`Not sent: the message is ${(text.length - INPUT_MAX).toLocaleString()} characters over the limit.`, true);
      ui.input.focus();
      return;
    }
    const kind = ui.guidance.checked ? "guidance" : "message";
    ui.send.disabled = true;
    try {
      if (socketOpen()) {
        state.ws.send(JSON.stringify({ type: "input", text, kind }));
        state.awaitingAck.push({ kind: "input", note: kind === "guidance" ? "Guidance queued." : "Message queued." });
        note("Sending…");
      } else {
        await api(`${boot.api}inputs/`, {
          method: "POST",
          body: { text, kind },
          headers: { "Idempotency-Key": newIdempotencyKey() },
        });
        note(kind === "guidance" ? "Guidance queued." : "Message queued.");
      }
      ui.input.value = "";
      updateInputCount();
    } catch (exc) {
      note(`Not sent: ${exc instanceof ApiError ? exc.describe() : exc}`, true);
    } finally {
      ui.send.disabled = false;
      ui.input.focus();
    }
  }

  async function interrupt() {
    ui.interrupt.disabled = true; // until the next status event says otherwise
    try {
      if (socketOpen()) {
        state.ws.send(JSON.stringify({ type: "interrupt" }));
        state.awaitingAck.push({ kind: "interrupt", note: "Interrupt queued." });
        note("Interrupting…");
      } else {
        await api(`${boot.api}interrupt/`, { method: "POST" });
        note("Interrupt queued.");
      }
    } catch (exc) {
      ui.interrupt.disabled = !INTERRUPTIBLE.has(state.status);
      note(`Interrupt failed: ${exc instanceof ApiError ? exc.describe() : exc}`, true);
    }
  }

  ui.composer.addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  ui.input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  ui.interrupt.addEventListener("click", interrupt);
  ui.input.addEventListener("input", () => {
    updateInputCount();
    // A note about the last attempt ("Type a message first", "over the limit") is answered by typing.
    if (ui.note.textContent.startsWith("Type a message") || ui.note.textContent.includes("over the limit")) note("");
  });

  // --- files ----------------------------------------------------------------------------------

  const filesRoot = $("files-panel");
  const files = filesRoot && filesPanel ? filesPanel({ apiBase: boot.api, root: filesRoot, grid: $("session-grid") }) : null;

  // --- goal run card --------------------------------------------------------------------------

  const goalRoot = $("goal-run");
  const goalCard = goalRoot && goalRun ? goalRun.card({ root: goalRoot, apiBase: boot.api, initial: boot.goalRun, username: USERNAME }) : null;

  /** home.js created this Session but could not queue its goal: say so and offer it again. */
  function showFirstInputFailure() {
    let saved = null;
    try {
      saved = JSON.parse(window.sessionStorage.getItem(FIRST_INPUT_NOTE_KEY) || "null");
      window.sessionStorage.removeItem(FIRST_INPUT_NOTE_KEY);
    } catch (exc) {
      return;
    }
    if (!saved || saved.session !== boot.id) return;
    if (!ui.input.value) ui.input.value = saved.text || "";
    note(`Your goal was not sent to the agent (${saved.error}). It is in the message box: press Send.`, true);
  }

  // --- start ----------------------------------------------------------------------------------

  async function start() {
    setStatus(state.status, ui.reason.textContent);
    setLive("connecting", "connecting…");
    try {
      const [session, messages, plan] = await Promise.all([
        api(boot.api),
        apiAll(`${boot.api}messages/?page_size=200`),
        api(`${boot.api}plan/`),
      ]);
      applySession(session);
      setStatus(session.status, session.status_reason);
      renderMessages(messages);
      renderPlan(plan.plan);
    } catch (exc) {
      note(`Could not load the Session: ${exc.message}`, true);
    }
    showFirstInputFailure();
    if (files) files.load();
    await Promise.all([loadPendingApprovals(), loadDeliveries(), inputPanel ? inputPanel.load() : null]);
    connect();
    window.setInterval(refreshApprovalTimes, APPROVAL_TIMES_REFRESH_MS);
  }

  start();
})();
