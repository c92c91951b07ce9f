/* The panels other scripts own, made once for this page: the questions MCP servers ask
 * (input_requests.js), the workspace files (files.js) and the Goal run card (goal_run.js).
 */
import { $, USERNAME, boot, filesPanel, goalRun } from "./ctx.js";
import { updateDocumentTitle } from "./header.js";

// Questions MCP servers ask during tool calls (input_requests.js).
export const inputPanel =
  window.xagent.inputRequests && $("input-requests")
    ? window.xagent.inputRequests.panel({ container: $("input-requests"), sessionApi: boot.api, onChange: () => updateDocumentTitle() })
    : null;

// --- files ----------------------------------------------------------------------------------

export const filesRoot = $("files-panel");
export const files = filesRoot && filesPanel ? filesPanel({ apiBase: boot.api, root: filesRoot, grid: $("session-grid") }) : null;

// --- goal run card --------------------------------------------------------------------------

export const goalRoot = $("goal-run");
export const goalCard = goalRoot && goalRun ? goalRun.card({ root: goalRoot, apiBase: boot.api, initial: boot.goalRun, username: USERNAME }) : null;
