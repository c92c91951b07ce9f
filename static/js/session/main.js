/* One Session, live: the page's start-up. The page is native ES modules, one per concern
 * (timeline.js, approvals.js, deliveries.js, goal_notes.js, plan.js, composer.js,
 * connection.js, events.js, …) sharing ctx.js; no bundler.
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
import { loadPendingApprovals, refreshApprovalTimes } from "./approvals.js";
import { note } from "./composer.js";
import { connect, setLive } from "./connection.js";
import { $, APPROVAL_TIMES_REFRESH_MS, FIRST_INPUT_NOTE_KEY, api, apiAll, boot, state, ui } from "./ctx.js";
import { loadDeliveries } from "./deliveries.js";
import { applySession, setStatus } from "./header.js";
import { files, inputPanel } from "./panels.js";
import { renderPlan } from "./plan.js";
import { renderMessages } from "./timeline.js";

/** home.js created this Session but could not queue its goal: say so and offer it again. */
export function showFirstInputFailure() {
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

export async function start() {
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
