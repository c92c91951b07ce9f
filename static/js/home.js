/* The workspace home: the current tenant's Sessions (GET /api/v1/sessions/, kept live by the
 * `/ws/sessions/` status stream) and the new-session form (POST /api/v1/sessions/, then open it).
 * Files chosen in the form are uploaded into the new Session's workspace (POST files/, one by
 * one), then a goal typed in the form is queued as the first input (POST inputs/) with those
 * files as its `attachments`, before the Session opens, so the agent starts on it right away.
 * If an upload fails the form stays, says which file and why, and a second press retries only
 * what is missing, into the same Session (it is not created twice). */
(function () {
  "use strict";
  const { api, el, statusBadge, timeElement, newIdempotencyKey, uploadFile, formatBytes, ApiError } = window.xagent;

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
  const filesInput = document.getElementById("new-session-files");
  const uploadList = document.getElementById("new-session-uploads");
  const searchInput = document.getElementById("session-search");
  const statusFilter = document.getElementById("session-status-filter");
  const archivedToggle = document.getElementById("session-archived");

  const REFRESH_MS = 60000;
  const FIRST_INPUT_NOTE_KEY = "xagent.firstInputFailed"; // read by js/session/main.js
  let nextUrl = null;
  let pagesLoaded = 0;
  let loading = false;
  // The Session this form already created whose uploads did not all succeed: {id, title, uploaded}
  // (uploaded: file key -> workspace path). A retry finishes it instead of creating another.
  let unfinished = null;

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
          session.kind === "sub"
            ? el("span", {
                className: "badge sub-badge",
                dataset: { testid: "sub-badge" },
                attrs: { title: "A sub-Session: a MainSession handed it a task" },
                text: "sub",
              })
            : null,
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
      el("span", { className: "session-updated muted" }, "updated ", timeElement(session.updated_at)),
      rowActions(session)
    );
  }

  /** Rename and archive (restore, for an archived one): each a PATCH / DELETE / POST of the
   * Sessions API, then the list is read again, so the row shows what the server kept. */
  function rowActions(session) {
    const url = `${endpoint}${encodeURIComponent(session.id)}/`;
    const title = session.title || "Untitled session";
    const actions = el("span", { className: "session-actions" });
    const act = async (button, request, done) => {
      button.disabled = true;
      try {
        await request();
        await load({ note: done });
      } catch (exc) {
        state.hidden = false;
        state.textContent = exc instanceof ApiError ? exc.describe() : String(exc);
        button.disabled = false;
      }
    };
    const rename = el("button", {
      className: "secondary small",
      text: "Rename",
      dataset: { testid: "rename-session" },
      attrs: { type: "button", "aria-label": `Rename “${title}”` },
    });
    rename.addEventListener("click", () => {
      const input = el("input", {
        attrs: { type: "text", maxlength: "200", value: session.title || "", "aria-label": "New title" },
        dataset: { testid: "rename-input" },
      });
      const save = el("button", { className: "small", text: "Save", attrs: { type: "submit" }, dataset: { testid: "rename-save" } });
      const cancel = el("button", { className: "secondary small", text: "Cancel", attrs: { type: "button" } });
      const editor = el("form", { className: "rename-form" }, input, save, cancel);
      cancel.addEventListener("click", () => editor.replaceWith(actions));
      editor.addEventListener("submit", (event) => {
        event.preventDefault();
        const wanted = input.value.trim();
        if (!wanted) {
          state.hidden = false;
          state.textContent = "A Session needs a title.";
          input.focus();
          return;
        }
        act(save, () => api(url, { method: "PATCH", body: { title: wanted } }), `Renamed to “${wanted}”.`);
      });
      actions.replaceWith(editor);
      input.focus();
      input.select();
    });
    if (session.archived_at) {
      const restore = el("button", {
        className: "secondary small",
        text: "Restore",
        dataset: { testid: "restore-session" },
        attrs: { type: "button", "aria-label": `Restore “${title}”` },
      });
      restore.addEventListener("click", () =>
        act(restore, () => api(`${url}restore/`, { method: "POST" }), `Restored “${title}”.`)
      );
      actions.append(rename, restore);
    } else {
      const archive = el("button", {
        className: "secondary small",
        text: "Archive",
        dataset: { testid: "archive-session" },
        attrs: {
          type: "button",
          "aria-label": `Archive “${title}”`,
          title: "Out of the list; its data is kept and it can be restored (tick “Archived” to find it)",
        },
      });
      archive.addEventListener("click", () =>
        act(archive, () => api(url, { method: "DELETE" }), `Archived “${title}”. Tick “Archived” to find or restore it.`)
      );
      actions.append(rename, archive);
    }
    return actions;
  }

  /** The list's URL for what the filters say: ?search=, ?status=, ?archived=true. */
  function listUrl() {
    const query = new URLSearchParams();
    const term = searchInput.value.trim();
    if (term) query.set("search", term);
    if (statusFilter.value) query.set("status", statusFilter.value);
    if (archivedToggle.checked) query.set("archived", "true");
    const text = query.toString();
    return text ? `${endpoint}?${text}` : endpoint;
  }

  // A rename being typed is not replaced by a live reload of the list.
  const editing = () => Boolean(list.querySelector(".rename-form"));
  const filtering = () => Boolean(searchInput.value.trim() || statusFilter.value);

  let loadAgain = false; // the filters changed while a page was loading: read again after it
  // `note`: what an action just did, said above the list (kept when the list is then empty).
  async function load({ append = false, note = "" } = {}) {
    if (loading) {
      if (!append) loadAgain = true;
      return;
    }
    loading = true;
    try {
      const page = await api(append && nextUrl ? nextUrl : listUrl());
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
      const empty = count
        ? ""
        : archivedToggle.checked
          ? filtering()
            ? "No archived Session matches."
            : "No archived Sessions."
          : filtering()
            ? "No Session matches. Clear the search to see them all."
            : "No Sessions yet. Create one to get started.";
      state.textContent = [note, empty].filter(Boolean).join(" ");
      state.hidden = !state.textContent;
    } catch (exc) {
      state.hidden = false;
      state.textContent =
        exc instanceof ApiError && (exc.status === 401 || exc.status === 403)
          ? "Signed out: reload the page to sign in again."
          : `Could not load Sessions: ${exc.message}`;
    } finally {
      loading = false;
      if (loadAgain) {
        loadAgain = false;
        load();
      }
    }
  }

  function showFormError(...children) {
    formError.replaceChildren(...children);
    formError.hidden = !children.length;
  }

  const fileKey = (file) => `${file.name}\u0000${file.size}\u0000${file.lastModified}`;
  const sessionUrl = (id) => `/sessions/${encodeURIComponent(id)}/`;

  /** One row of the upload list: name, progress, then "uploaded" or the reason it failed. */
  function uploadRow(file) {
    const progress = el("progress", { attrs: { max: "1", value: "0", "aria-label": `Upload progress of ${file.name}` } });
    const status = el("span", { className: "upload-status", text: "waiting…" });
    const row = el(
      "li",
      { className: "upload", dataset: { testid: "upload", state: "waiting", name: file.name } },
      el("span", { className: "upload-name", text: file.name, attrs: { title: file.name } }),
      progress,
      status
    );
    uploadList.append(row);
    return {
      progress(fraction) {
        row.dataset.state = "uploading";
        progress.value = fraction;
        status.textContent = `${Math.round(fraction * 100)}%`;
      },
      done(path) {
        row.dataset.state = "done";
        progress.value = 1;
        status.textContent =
          path && path !== file.name ? `uploaded — the name was changed to ${path}` : `uploaded (${formatBytes(file.size)})`;
      },
      failed(message) {
        row.dataset.state = "error";
        progress.hidden = true;
        status.textContent = message;
      },
    };
  }

  /** Uploads the chosen files not uploaded yet; returns [{file, message}] of those that failed. */
  async function uploadChosen(sessionId, chosen) {
    const failures = [];
    uploadList.replaceChildren();
    for (const file of chosen) {
      const row = uploadRow(file);
      const known = unfinished.uploaded.get(fileKey(file));
      if (known) {
        row.done(known);
        continue;
      }
      const result = await uploadFile(`${endpoint}${encodeURIComponent(sessionId)}/files/`, file, {
        onProgress: (fraction) => row.progress(fraction),
      });
      if (result.ok) {
        const path = (result.body && result.body.path) || file.name;
        unfinished.uploaded.set(fileKey(file), path);
        row.done(path);
      } else {
        row.failed(result.message);
        failures.push({ file, message: result.message });
      }
    }
    return failures;
  }

  function uploadsFailed(failures, total) {
    const submit = form.querySelector("button[type=submit]");
    submit.textContent = "Retry the upload";
    titleInput.readOnly = true; // the Session exists: a retry goes into it
    showFormError(
      el("p", {
        text:
          `The Session “${unfinished.title}” was created, but ${failures.length} of ${total} file${total === 1 ? "" : "s"} ` +
          "could not be uploaded, so the first task was not sent yet:",
      }),
      el("ul", {}, ...failures.map(({ file, message }) => el("li", {}, el("strong", { text: file.name }), ` — ${message}`))),
      el(
        "p",
        {},
        "Press “Retry the upload” (you may choose other files first), or ",
        el("a", { attrs: { href: sessionUrl(unfinished.id) }, dataset: { testid: "open-unfinished-session" }, text: "open the Session without them" }),
        "."
      )
    );
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    showFormError();
    const title = titleInput.value.trim();
    if (!title) {
      showFormError(document.createTextNode("Give the Session a title."));
      titleInput.focus();
      return;
    }
    const submit = form.querySelector("button[type=submit]");
    submit.disabled = true;
    const goal = goalInput.value.trim();
    const chosen = filesInput ? [...filesInput.files] : [];
    try {
      if (!unfinished) {
        const body = { title };
        if (goal) body.goal = goal;
        const created = await api(endpoint, { method: "POST", body });
        unfinished = { id: String(created.id), title, uploaded: new Map() };
      }
      const sessionId = unfinished.id;
      if (chosen.length) {
        const failures = await uploadChosen(sessionId, chosen);
        if (failures.length) {
          uploadsFailed(failures, chosen.length);
          submit.disabled = false;
          return;
        }
      }
      const attachments = [...new Set(chosen.map((file) => unfinished.uploaded.get(fileKey(file))).filter(Boolean))];
      if (goal) {
        try {
          await api(`${endpoint}${encodeURIComponent(sessionId)}/inputs/`, {
            method: "POST",
            body: attachments.length ? { text: goal, attachments } : { text: goal },
            headers: { "Idempotency-Key": newIdempotencyKey() },
          });
        } catch (exc) {
          // The Session exists: open it anyway, and let its page offer the goal again.
          try {
            window.sessionStorage.setItem(
              FIRST_INPUT_NOTE_KEY,
              JSON.stringify({ session: sessionId, text: goal, error: exc instanceof ApiError ? exc.describe() : String(exc) })
            );
          } catch (_) {
            // Private mode without storage: the page opens without the reminder.
          }
        }
      }
      unfinished = null;
      window.location.assign(sessionUrl(sessionId));
    } catch (exc) {
      showFormError(document.createTextNode(exc instanceof ApiError ? exc.describe() : String(exc)));
      submit.disabled = false;
    }
  });
  // The page renders the button disabled until now (home.html): a click before this script
  // handled the form would have reloaded the page instead.
  form.querySelector("button[type=submit]").disabled = false;

  // Typing searches after a pause; the status and "Archived" apply at once.
  let searchTimer = null;
  searchInput.addEventListener("input", () => {
    window.clearTimeout(searchTimer);
    searchTimer = window.setTimeout(() => load(), 250);
  });
  statusFilter.addEventListener("change", () => load());
  archivedToggle.addEventListener("change", () => load());
  document.getElementById("session-filters").addEventListener("submit", (event) => {
    event.preventDefault();
    window.clearTimeout(searchTimer);
    load();
  });
  more.addEventListener("click", () => load({ append: true }));
  refresh.addEventListener("click", () => load());

  // Live: `/ws/sessions/` announces every status change of this tenant's Sessions (a new
  // Session included). The API stays the one source of rows: a frame only says "reload the
  // first page", coalesced, and never while more pages are open (that would drop them).
  let reloadTimer = null;
  function reloadSoon() {
    if (pagesLoaded > 1 || reloadTimer || editing()) return;
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
      if (event.code === 4401) {
        // Logged out or removed from the tenant: stop, and say how to get back.
        state.hidden = false;
        state.replaceChildren(
          "Signed out — ",
          el("a", { attrs: { href: `/accounts/login/?next=${encodeURIComponent(window.location.pathname)}` }, text: "sign in again" }),
          "."
        );
        return;
      }
      window.setTimeout(() => {
        follow();
        reloadSoon();
      }, 3000);
    });
  }

  // A safety net for a socket that is up but silent (e.g. a proxy dropping frames).
  window.setInterval(() => {
    if (document.visibilityState === "visible" && pagesLoaded <= 1 && !editing()) load();
  }, REFRESH_MS);

  load();
  follow();
})();
