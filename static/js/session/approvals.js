/* Approvals: pending ones read at start, new ones from `approval.requested`; a decision goes out
 * as a WebSocket `decide` frame (REST when the socket is down) and the card turns decided on the
 * `ack`, the `approval.decided` event or a re-read, whichever comes first.
 */
import { note, socketOpen } from "./composer.js";
import { $, APPROVALS_API, ApiError, RESULT_PREVIEW_CHARS, USERNAME, api, apiAll, boot, clockTime, el, state, statusLabel, timeElement, ui } from "./ctx.js";
import { updateDocumentTitle } from "./header.js";
import { cardKey, eventTurn, parseArguments, placeOrphan, setToolState, toolCard, visibleControls } from "./timeline.js";

// --- approvals ------------------------------------------------------------------------------

export const DECIDED_LABELS = {
  approved: "Approved",
  rejected: "Rejected",
  expired: "Expired without a decision",
  cancelled: "Cancelled",
};
export const RISK_HINTS = {
  read: "reads data only",
  write: "changes files or data",
  destructive: "deletes or overwrites; cannot be undone",
  external: "reaches outside the workspace",
};

/** `approval.decided` says approve/reject or the resulting status: accept both. */
export function decisionStatus(decision) {
  return { approve: "approved", reject: "rejected" }[decision] || String(decision || "");
}

export function approvalUrl(id) {
  return `${APPROVALS_API}${encodeURIComponent(id)}/`;
}

export function approvalCard(id) {
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

export function setApprovalMessage(card, text, isError = false) {
  const message = card.querySelector(".approval-message");
  message.textContent = text || "";
  message.hidden = !text;
  message.classList.toggle("error", Boolean(text) && isError);
}

export function setDeciding(card, busy) {
  card.dataset.busy = busy ? "true" : "false";
  for (const button of card.querySelectorAll(".approval-actions button")) button.disabled = busy;
  card.querySelector(".approval-comment").disabled = busy;
}

/** Risk as a word and a colour (never colour alone). */
export function showRisk(card, risk) {
  if (!risk) return;
  card.dataset.risk = risk;
  const badge = card.querySelector(".risk-badge");
  badge.dataset.risk = risk;
  badge.textContent = risk;
  badge.title = RISK_HINTS[risk] ? `Risk: ${risk} — ${RISK_HINTS[risk]}` : `Risk: ${risk}`;
}

/** What the call would do, the paths first: for a deletion, the user must see which files go. */
export function renderApprovalArguments(card, tool, rawArguments) {
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

export function renderApprovalTimes(card) {
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

export function refreshApprovalTimes() {
  for (const card of state.approvalCards.values()) renderApprovalTimes(card);
}

export function ruleName(rule) {
  if (!rule || typeof rule !== "object") return "";
  return String(rule.name || rule.policy || rule.tool_glob || rule.risk || "");
}

/** The tool card of the gated call follows its approval. */
export function markToolCard(callId, status, tool) {
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
export function showApproval(approval) {
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

export function showDecided(card, { status, by, at, comment }) {
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

export function dismissApproval(key) {
  const card = state.approvalCards.get(key);
  if (!card || card.dataset.status === "pending") return;
  card.remove();
  state.approvalCards.delete(key);
  syncApprovalsVisibility();
  ui.input.focus();
}

export async function loadPendingApprovals() {
  try {
    const rows = await apiAll(`${boot.api}approvals/?status=pending&page_size=200`);
    for (const approval of rows) showApproval(approval);
    ui.approvalsNote.textContent = "";
  } catch (exc) {
    ui.approvalsNote.textContent = `Could not load pending approvals: ${exc.message}`;
  }
  syncApprovalsVisibility();
}

export function syncApprovalsVisibility() {
  ui.approvalsNote.hidden = !ui.approvalsNote.textContent;
  ui.approvals.hidden = state.approvalCards.size === 0 && ui.approvalsNote.hidden;
}

export const approvalReads = new Map(); // approval id -> in-flight read
export function refreshApproval(id, { droppedWhileSending = false, alreadyDecided = false } = {}) {
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

export function approvalRequested(data) {
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

export function approvalDecided(data) {
  const key = String(data.approval_id);
  const card = state.approvalCards.get(key);
  if (!card) return; // decided before this page read the pending list: nothing to show
  showDecided(card, { status: decisionStatus(data.decision), by: data.by });
  // "Approving…" is answered; an error (e.g. already decided) stays for the user to read.
  if (!card.querySelector(".approval-message").classList.contains("error")) setApprovalMessage(card, "");
  refreshApproval(key); // the decision time and comment
}

export async function decide(key, decision) {
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

export function decisionAcknowledged(id, status) {
  const card = state.approvalCards.get(String(id));
  if (!card) return;
  setApprovalMessage(card, "");
  if (status && status !== "pending") {
    showDecided(card, { status, by: card.dataset.decidedBy || USERNAME || undefined });
  }
  refreshApproval(id); // authoritative time, decider and comment
}

export function decisionRefused(id, code, message) {
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
export function reconcileApprovals(status) {
  if (status === "waiting_approval") {
    const anyPending = [...state.approvalCards.values()].some((card) => card.dataset.status === "pending");
    if (!anyPending) loadPendingApprovals();
    return;
  }
  for (const [key, card] of state.approvalCards) {
    if (card.dataset.status === "pending" && card.dataset.busy !== "true") refreshApproval(key);
  }
}
