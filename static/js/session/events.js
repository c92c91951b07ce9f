/* Applying the event stream: each WebSocket frame or event to the part of the page it changes.
 * Handlers are idempotent, so an event already reflected in the fetched state does no harm.
 */
import { logEvent } from "./activity.js";
import { approvalDecided, approvalRequested, decisionAcknowledged, decisionRefused, reconcileApprovals } from "./approvals.js";
import { addCapabilities } from "./capabilities.js";
import { clearInfoNote, note } from "./composer.js";
import { reconnectNow } from "./connection.js";
import { $, boot, state } from "./ctx.js";
import { loadDelivery } from "./deliveries.js";
import { goalDecidedNote, goalPausedNote, goalResumedNote, goalStartedNote, inputAnsweredNote, inputRequestedNote } from "./goal_notes.js";
import { showGoals } from "./goals.js";
import { refreshHeader, setStatus } from "./header.js";
import { PREPARATION_FAILURES, goalsUpdatedNote, orchestrationNote, preparationFailedNote, taskUnderstoodNote } from "./outer_loop.js";
import { files, goalCard, inputPanel } from "./panels.js";
import { renderPlan } from "./plan.js";
import { appendDelta, dropStaleStreams, endStream, eventTurn, fetchNewMessages, streamFor, toolEnded, toolStarted } from "./timeline.js";
import { FAILED_TURN_REASONS, capabilitiesNote, compactionNote, memoryRecalledNote, quotaExceededNote, sessionRecovered, turnFailed } from "./turn_notes.js";

// --- events ---------------------------------------------------------------------------------

export function applyEvent(event) {
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
    case "quota.exceeded":
      quotaExceededNote(event.seq, data, live);
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

export function applyFrame(frame) {
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
