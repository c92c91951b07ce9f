/* The header: status badge and reason, title, model label, and the document title (which says
 * when an approval or an answer is awaited). The status changes only on `session.status` events.
 */
import { addCapabilities, applySources } from "./capabilities.js";
import { showChildren } from "./children.js";
import { $, INTERRUPTIBLE, WORKING, api, boot, state, statusLabel, statusReasonText, ui } from "./ctx.js";
import { showGoals } from "./goals.js";
import { inputPanel } from "./panels.js";

// --- status, header -------------------------------------------------------------------------

export function setStatus(status, reason) {
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

export function showHeader(session) {
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
export function applySession(session) {
  if (!session) return;
  showHeader(session);
  if (Array.isArray(session.capability_sources)) applySources(session.capability_sources);
  if (session.capabilities) addCapabilities(session.capabilities);
  if (Array.isArray(session.children)) showChildren(session.children);
}

export function updateDocumentTitle() {
  const title = state.title || ui.title.textContent || "Untitled session";
  const waiting = [...state.approvalCards.values()].some((card) => card.dataset.status === "pending");
  const asked = !waiting && inputPanel && inputPanel.pending();
  document.title = `${waiting ? "Approval needed · " : asked ? "Input needed · " : ""}${title} · xAgent workspace`;
}

export let headerRefresh = null;
export let refreshAgain = false;
/** Re-read the Session detail (title, goals, capability sources, sub-Sessions): one read at a
 * time, and one more after it when asked meanwhile, so the last change is never missed. The
 * status never comes from a re-read, only from events. */
export function refreshHeader() {
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
