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
 */
(function () {
  "use strict";
  const { api, el, richText, statusLabel, timeElement, clockTime, newIdempotencyKey, ApiError } = window.xagent;

  const bootNode = document.getElementById("session-boot");
  if (!bootNode) return;
  const boot = JSON.parse(bootNode.textContent);
  const $ = (id) => document.getElementById(id);

  const GUIDANCE_PREFIX = "[Guidance from the user";
  const INTERRUPTIBLE = new Set(["running", "preparing"]);
  const MAX_LOG_ENTRIES = 500;
  const RESULT_PREVIEW_CHARS = 20000;

  const ui = {
    status: document.querySelector("[data-testid=session-status]"),
    statusText: document.querySelector("[data-testid=session-status] .status-text"),
    reason: $("status-reason"),
    title: $("session-title"),
    modelLabel: $("model-label"),
    modelBadge: $("model-badge"),
    sessionGoalRow: $("session-goal-row"),
    sessionGoal: $("session-goal"),
    phaseGoalRow: $("phase-goal-row"),
    phaseGoal: $("phase-goal"),
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
  };

  const state = {
    lastSeq: boot.backlogFrom, // the WebSocket's `after`: highest seq received
    status: boot.status,
    lastMessageId: 0,
    toolCards: new Map(), // call_id -> card element
    stream: null, // {callId, node, body}
    staleStreams: [], // stream bubbles to drop once their committed message is shown
    ws: null,
    attempts: 0,
    retryTimer: null,
    stopped: false,
    awaitingAck: [], // what each client frame sent asked for, answered in order by `ack` frames
    gapAt: null,
  };

  // --- status, header -------------------------------------------------------------------------

  function setStatus(status, reason) {
    state.status = status;
    ui.status.dataset.status = status;
    ui.statusText.textContent = statusLabel(status);
    ui.reason.textContent = reason || "";
    ui.reason.hidden = !reason;
    ui.interrupt.disabled = !INTERRUPTIBLE.has(status);
  }

  function showHeader(session) {
    const title = session.title || "Untitled session";
    ui.title.textContent = title;
    document.title = `${title} · xAgent workspace`;
    const label = session.model_label || "";
    const demo = label.toLowerCase().startsWith("demo model");
    ui.modelBadge.hidden = !demo;
    if (demo) ui.modelBadge.title = label;
    ui.modelLabel.textContent = demo ? label.slice("demo model".length).trim() : label ? `Model: ${label}` : "";
    ui.sessionGoal.textContent = session.session_goal || "";
    ui.sessionGoalRow.hidden = !session.session_goal;
    ui.phaseGoal.textContent = session.phase_goal || "";
    ui.phaseGoalRow.hidden = !session.phase_goal || session.phase_goal === session.session_goal;
  }

  let headerRefresh = null;
  function refreshHeader() {
    // Goals and title only: the status never comes from a re-read, only from events.
    if (headerRefresh) return;
    headerRefresh = api(boot.api)
      .then(showHeader)
      .catch(() => {})
      .finally(() => {
        headerRefresh = null;
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
    const text = parts.join(", ");
    return text.length > 160 ? `${text.slice(0, 157)}…` : text;
  }

  function toolCard(callId, tool, rawArguments) {
    let card = state.toolCards.get(callId);
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
      state.toolCards.set(callId, card);
    }
    if (rawArguments !== undefined && !card.dataset.hasArguments) {
      const args = parseArguments(rawArguments);
      card.querySelector(".tool-args").textContent = argumentsSummary(args);
      const full = JSON.stringify(args, null, 2);
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

  function toolStarted(data) {
    const card = toolCard(data.call_id, data.tool, data.arguments);
    if (card.dataset.ok === undefined) setToolState(card, "running", "running…");
    placeOrphan(card);
  }

  function toolEnded(data) {
    const card = toolCard(data.call_id, data.tool);
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
    const card = toolCard(message.tool_call_id, message.tool_name || "tool");
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

  function messageShell(message, extraClass) {
    return el(
      "li",
      {
        className: `message message-${message.role}${extraClass ? " " + extraClass : ""}`,
        dataset: { testid: "message", role: message.role, id: message.id },
      },
      el(
        "div",
        { className: "message-meta" },
        el("span", { className: "message-author", text: message.role === "assistant" ? "Agent" : message.role === "user" ? "You" : message.role }),
        extraClass === "guidance" ? el("span", { className: "badge", text: "guidance" }) : null,
        timeElement(message.created_at, { clock: true })
      )
    );
  }

  function renderMessage(message) {
    if (message.role === "tool") {
      toolResult(message);
      return;
    }
    let content = message.content || "";
    let extra = "";
    if (message.role === "user" && content.startsWith(GUIDANCE_PREFIX)) {
      extra = "guidance";
      content = content.slice(content.indexOf("\n") + 1);
    }
    const item = messageShell(message, extra);
    if (content) item.append(el("div", { className: "message-body" }, richText(content)));
    if (message.role === "assistant" && (message.tool_calls || []).length) {
      const tools = el("div", { className: "tool-cards" });
      for (const call of message.tool_calls) tools.append(toolCard(call.id, call.name, call.arguments));
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
        if (message.role === "assistant") assistantShown = true;
      }
      if (assistantShown) dropStaleStreams();
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
          renderMessages(await api(`${boot.api}messages/?after=${state.lastMessageId}`));
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
        return d.finish_reason;
      case "input.queued":
        return d.kind;
      case "file.changed":
        return `${d.op} ${d.path}`;
      case "plan.updated":
        return d.plan ? d.plan.title : "";
      case "error":
        return `${d.code}: ${d.message}`;
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
      case "tool.started":
        toolStarted(data);
        return;
      case "tool.ended":
        toolEnded(data);
        return;
    }
    if (!live) return;
    switch (event.type) {
      case "session.status":
        setStatus(data.status, data.reason);
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
      case "task.understood":
        refreshHeader();
        break;
      case "turn.ended":
        endStream();
        fetchNewMessages().then(dropStaleStreams);
        refreshHeader();
        break;
      case "session.archived":
        note("This Session was archived.");
        break;
      case "error":
        note(`${data.code}: ${data.message}`, true);
        break;
    }
  }

  function applyFrame(frame) {
    if (!frame || typeof frame !== "object") return;
    if (frame.seq === null || frame.seq === undefined) {
      if (frame.type === "model.delta") appendDelta(frame.data || {});
      else if (frame.type === "ack") {
        note(state.awaitingAck.shift() || "Queued.");
      } else if (frame.type === "error") {
        state.awaitingAck.shift(); // a refused frame is answered by an error instead of an ack
        note((frame.data && frame.data.message) || "The server refused that.", true);
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
    ws.addEventListener("close", () => {
      if (state.ws === ws) state.ws = null;
      if (state.awaitingAck.length) {
        note("The connection dropped while sending; check that your last message arrived.", true);
        state.awaitingAck = [];
      }
      if (!opened) state.attempts += 1;
      scheduleReconnect();
    });
  }

  function scheduleReconnect() {
    if (state.stopped || state.retryTimer) return;
    setLive("reconnecting", "reconnecting…");
    if (state.attempts >= 3) checkStillAllowed();
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
      if (exc.status === 401 || exc.status === 403 || exc.status === 404) {
        state.stopped = true;
        clearTimeout(state.retryTimer);
        setLive("offline", "offline");
        note(
          exc.status === 404 ? "This Session is no longer available." : "Your login has expired. Reload the page to log in again.",
          true
        );
      }
    });
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

  function socketOpen() {
    return state.ws && state.ws.readyState === WebSocket.OPEN;
  }

  async function send() {
    const text = ui.input.value;
    if (!text.trim()) {
      ui.input.focus();
      return;
    }
    const kind = ui.guidance.checked ? "guidance" : "message";
    ui.send.disabled = true;
    try {
      if (socketOpen()) {
        state.ws.send(JSON.stringify({ type: "input", text, kind }));
        state.awaitingAck.push(kind === "guidance" ? "Guidance queued." : "Message queued.");
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
        state.awaitingAck.push("Interrupt queued.");
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

  // --- start ----------------------------------------------------------------------------------

  async function start() {
    setStatus(state.status, ui.reason.textContent);
    setLive("connecting", "connecting…");
    try {
      const [session, messages, plan] = await Promise.all([
        api(boot.api),
        api(`${boot.api}messages/`),
        api(`${boot.api}plan/`),
      ]);
      showHeader(session);
      setStatus(session.status, session.status_reason);
      renderMessages(messages);
      renderPlan(plan.plan);
    } catch (exc) {
      note(`Could not load the Session: ${exc.message}`, true);
    }
    connect();
  }

  start();
})();
