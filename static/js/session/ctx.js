/* The Session page's shared context: the boot data the page was rendered with, the elements
 * every part writes to (`ui`), the page's state, and the helpers of workspace.js. A leaf: it
 * imports nothing, so every module can use it while the others load.
 */
export const { api, apiAll, el, richText, statusLabel, statusReasonText, statusBadge, timeElement, clockTime, newIdempotencyKey, formatBytes, filesPanel, goalRun, ApiError } =
  window.xagent;

// Only the Session page loads these modules, and it always renders its boot data.
export const boot = JSON.parse(document.getElementById("session-boot").textContent);
export const $ = (id) => document.getElementById(id);

export const INTERRUPTIBLE = new Set(["queued", "running", "preparing", "waiting_approval"]); // parked: cancels the approval
export const WORKING = new Set(["queued", "running", "preparing", "waiting_approval", "compressing"]);
export const FIRST_INPUT_NOTE_KEY = "xagent.firstInputFailed"; // set by home.js when the goal could not be queued
export const MAX_LOG_ENTRIES = 500;
export const RESULT_PREVIEW_CHARS = 20000;
export const ANSWER_EXCERPT_CHARS = 200; // of the final answer, in the delivery card
export const APPROVALS_API = "/api/v1/approvals/";
export const APPROVAL_TIMES_REFRESH_MS = 30000;

export const ui = {
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
export const USERNAME = ($("session-app") && $("session-app").dataset.username) || "";
export const state = {
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
export const names = (value) => (Array.isArray(value) ? value.map(String).filter(Boolean) : []);

export function excerpt(text, limit) {
  const oneLine = String(text || "").trim();
  return oneLine.length > limit ? `${oneLine.slice(0, limit - 1).trimEnd()}…` : oneLine;
}
