/* Sub-Sessions: the list of this Session's children and their live status.
 */
import { $, el, state, statusBadge, ui } from "./ctx.js";
import { refreshHeader } from "./header.js";

// --- sub-Sessions ---------------------------------------------------------------------------

/**
 * The sub-Sessions this MainSession handed tasks to (`children` of the Session detail): read on
 * load, again when a `session_delegate` call ends or a turn starts or ends; their status pills
 * follow the tenant's status stream (`/ws/sessions/`) while the list is not empty.
 */
export const childRows = new Map(); // child id -> row element

export function showChildren(children) {
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

export function childStatus(id, status) {
  const row = childRows.get(String(id));
  if (!row || !status) return;
  row.dataset.status = status;
  row.querySelector(".status-badge").replaceWith(statusBadge(status));
}

export let childSocket = null;
export function followChildren() {
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
