/* The workspace home: the current tenant's Sessions (GET /api/v1/sessions/, kept live by the
 * `/ws/sessions/` status stream) and the new-session form (POST /api/v1/sessions/, then open it).
 * A goal typed in the form is the Session's first task: it is queued as the first input
 * (POST inputs/) before the Session opens, so the agent starts on it right away. */
(function () {
  "use strict";
  const { api, el, statusBadge, timeElement, newIdempotencyKey, ApiError } = window.xagent;

  const root = document.getElementById("workspace-home");
  if (!root) return;
  const endpoint = root.dataset.api;
  const list = document.getElementById("session-list");
  const state = document.getElementById("sessions-state");
  const more = document.getElementById("more-sessions");
  const refresh = document.getElementById("refresh-sessions");
  const form = document.getElementById("new-session-form");
  const titleInput = document.getElementById("new-session-title");
  const goalInput = document.getElementById("new-session-goal");
  const formError = document.getElementById("new-session-error");

  const REFRESH_MS = 60000;
  const FIRST_INPUT_NOTE_KEY = "xagent.firstInputFailed"; // read by session.js
  let nextUrl = null;
  let pagesLoaded = 0;
  let loading = false;

  function sessionRow(session) {
    const href = `/sessions/${encodeURIComponent(session.id)}/`;
    const needsApproval = session.status === "waiting_approval";
    return el(
      "li",
      {
        className: `session-row${needsApproval ? " needs-attention" : ""}`,
        dataset: { testid: "session-row", id: session.id, status: session.status },
      },
      el(
        "a",
        { className: "session-link", attrs: { href } },
        el(
          "span",
          { className: "session-title-line" },
          el("span", { className: "session-title", text: session.title || "Untitled session" }),
          needsApproval
            ? el("span", {
                className: "needs-approval",
                dataset: { testid: "needs-approval" },
                attrs: { title: "A tool call waits for a person to approve or reject it" },
                text: "needs approval",
              })
            : null
        ),
        session.phase_goal || session.session_goal
          ? el("span", { className: "session-goal muted", text: session.phase_goal || session.session_goal })
          : null
      ),
      statusBadge(session.status),
      el("span", { className: "session-updated muted" }, "updated ", timeElement(session.updated_at))
    );
  }

  async function load({ append = false } = {}) {
    if (loading) return;
    loading = true;
    try {
      const page = await api(append && nextUrl ? nextUrl : endpoint);
      const rows = (page.results || []).map(sessionRow);
      if (append) {
        list.append(...rows);
        pagesLoaded += 1;
      } else {
        list.replaceChildren(...rows);
        pagesLoaded = 1;
      }
      nextUrl = page.next || null;
      more.hidden = !nextUrl;
      const count = list.children.length;
      state.textContent = count ? "" : "No Sessions yet. Create one to get started.";
      state.hidden = count > 0;
    } catch (exc) {
      state.hidden = false;
      state.textContent =
        exc instanceof ApiError && (exc.status === 401 || exc.status === 403)
          ? "Your login has expired. Reload the page to log in again."
          : `Could not load Sessions: ${exc.message}`;
    } finally {
      loading = false;
    }
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    formError.hidden = true;
    const title = titleInput.value.trim();
    if (!title) {
      formError.textContent = "Give the Session a title.";
      formError.hidden = false;
      titleInput.focus();
      return;
    }
    const submit = form.querySelector("button[type=submit]");
    submit.disabled = true;
    try {
      const body = { title };
      const goal = goalInput.value.trim();
      if (goal) body.goal = goal;
      const created = await api(endpoint, { method: "POST", body });
      if (goal) {
        try {
          await api(`${endpoint}${encodeURIComponent(created.id)}/inputs/`, {
            method: "POST",
            body: { text: goal },
            headers: { "Idempotency-Key": newIdempotencyKey() },
          });
        } catch (exc) {
          // The Session exists: open it anyway, and let its page offer the goal again.
          try {
            window.sessionStorage.setItem(
              FIRST_INPUT_NOTE_KEY,
              JSON.stringify({ session: String(created.id), text: goal, error: exc instanceof ApiError ? exc.describe() : String(exc) })
            );
          } catch (_) {
            // Private mode without storage: the page opens without the reminder.
          }
        }
      }
      window.location.assign(`/sessions/${encodeURIComponent(created.id)}/`);
    } catch (exc) {
      formError.textContent = exc instanceof ApiError ? exc.describe() : String(exc);
      formError.hidden = false;
      submit.disabled = false;
    }
  });

  more.addEventListener("click", () => load({ append: true }));
  refresh.addEventListener("click", () => load());

  // Live: `/ws/sessions/` announces every status change of this tenant's Sessions (a new
  // Session included). The API stays the one source of rows: a frame only says "reload the
  // first page", coalesced, and never while more pages are open (that would drop them).
  let reloadTimer = null;
  function reloadSoon() {
    if (pagesLoaded > 1 || reloadTimer) return;
    reloadTimer = window.setTimeout(() => {
      reloadTimer = null;
      load();
    }, 300);
  }
  function follow() {
    const scheme = window.location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${window.location.host}/ws/sessions/`);
    socket.addEventListener("message", (message) => {
      let frame = null;
      try {
        frame = JSON.parse(message.data);
      } catch (_) {
        return;
      }
      if (frame && frame.type === "session.status") reloadSoon();
    });
    // Closed by a restart or a network change: reconnect, and catch up on what was missed.
    socket.addEventListener("close", (event) => {
      if (event.code === 4401) return; // logged out or removed from the tenant: stop
      window.setTimeout(() => {
        follow();
        reloadSoon();
      }, 3000);
    });
  }

  // A safety net for a socket that is up but silent (e.g. a proxy dropping frames).
  window.setInterval(() => {
    if (document.visibilityState === "visible" && pagesLoaded <= 1) load();
  }, REFRESH_MS);

  load();
  follow();
})();
