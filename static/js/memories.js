/* The Memories page: the signed-in user's long-term memories in this tenant, newest first
 * (GET /api/v1/memories/, cursor-paginated; `?kind=` and `?search=` filter on the server),
 * "Load more" following `next`, and a Delete per row that asks once more before it sends
 * DELETE /api/v1/memories/{id}/. The API only ever returns the caller's own memories. */
(function () {
  "use strict";
  const { api, el, timeElement, ApiError } = window.xagent;

  const root = document.getElementById("memories-app");
  if (!root) return;
  const endpoint = root.dataset.api;
  const $ = (id) => document.getElementById(id);
  const list = $("memory-list");
  const state = $("memories-state");
  const empty = $("memories-empty");
  const more = $("more-memories");
  const filters = $("memory-filters");
  const kindSelect = $("memory-kind");
  const searchInput = $("memory-search");

  const KIND_LABELS = Object.fromEntries([...kindSelect.options].filter((o) => o.value).map((o) => [o.value, o.textContent]));
  const SEARCH_DELAY_MS = 300;
  let nextUrl = null;
  let generation = 0; // a newer query makes the answers of older ones irrelevant
  let shownFilters = { kind: "", search: "" };

  function problem(exc) {
    if (exc instanceof ApiError && (exc.status === 401 || exc.status === 403)) {
      return "Your login has expired. Reload the page to log in again.";
    }
    return exc instanceof ApiError ? exc.describe() : String(exc);
  }

  function say(text) {
    state.textContent = text;
    state.hidden = !text;
  }

  /** Saved again later (memory_save of the same text refreshes it), not just written twice on creation. */
  function refreshed(memory) {
    const created = Date.parse(memory.created_at);
    const updated = Date.parse(memory.updated_at);
    return Number.isFinite(created) && Number.isFinite(updated) && updated - created > 60000;
  }

  function sessionLink(sessionId) {
    if (!sessionId) return null;
    return el("a", {
      className: "memory-source",
      dataset: { testid: "memory-source" },
      attrs: { href: `/sessions/${encodeURIComponent(sessionId)}/` },
      text: "from a Session",
    });
  }

  function memoryRow(memory) {
    const id = String(memory.id);
    const textId = `memory-text-${id}`;
    const actions = el("div", { className: "memory-actions" });
    const error = el("p", { className: "error memory-error", dataset: { testid: "memory-error" }, attrs: { role: "alert", hidden: true } });
    const row = el(
      "li",
      { className: "memory-row", dataset: { testid: "memory-row", id, kind: memory.kind } },
      el(
        "div",
        { className: "memory-head" },
        el("span", { className: "kind-badge", dataset: { kind: memory.kind, testid: "memory-kind-badge" }, text: KIND_LABELS[memory.kind] || memory.kind }),
        el(
          "span",
          { className: "memory-meta muted" },
          "saved ",
          timeElement(memory.created_at),
          refreshed(memory) ? [" · updated ", timeElement(memory.updated_at)] : null
        ),
        sessionLink(memory.source_session),
        actions
      ),
      el("p", { className: "memory-text", dataset: { testid: "memory-text" }, attrs: { id: textId }, text: memory.text }),
      error
    );

    function showError(text) {
      error.textContent = text || "";
      error.hidden = !text;
    }

    function idle() {
      actions.replaceChildren(
        el("button", {
          className: "danger small",
          dataset: { testid: "memory-delete" },
          attrs: { type: "button", "aria-describedby": textId },
          text: "Delete",
          on: { click: confirming },
        })
      );
    }

    function confirming() {
      showError("");
      const yes = el("button", {
        className: "danger small",
        dataset: { testid: "memory-delete-confirm" },
        attrs: { type: "button", "aria-describedby": textId },
        text: "Yes, delete",
        on: { click: remove },
      });
      actions.replaceChildren(
        el("span", { className: "memory-confirm", text: "Delete this memory for good?" }),
        yes,
        el("button", {
          className: "secondary small",
          dataset: { testid: "memory-delete-cancel" },
          attrs: { type: "button" },
          text: "Cancel",
          on: {
            click: () => {
              idle();
              actions.querySelector("button").focus();
            },
          },
        })
      );
      yes.focus();
    }

    function gone(message) {
      const next = row.nextElementSibling || row.previousElementSibling;
      row.remove();
      say(message);
      updateCount(-1);
      const focusNext = next && next.querySelector("button");
      (focusNext || searchInput).focus();
      if (!list.children.length && !nextUrl) showEmpty(message);
    }

    async function remove() {
      for (const button of actions.querySelectorAll("button")) button.disabled = true;
      row.dataset.busy = "true";
      try {
        await api(`${endpoint}${encodeURIComponent(id)}/`, { method: "DELETE" });
        gone("Memory deleted.");
      } catch (exc) {
        if (exc instanceof ApiError && exc.status === 404) {
          gone("That memory was already deleted.");
          return;
        }
        row.dataset.busy = "false";
        idle();
        showError(`Not deleted: ${problem(exc)}`);
      }
    }

    idle();
    return row;
  }

  let total = 0; // rows on the page
  function updateCount(delta) {
    total = Math.max(0, total + delta);
  }

  /** No rows: the explanation of what memories are, or (filtered) that nothing matches. */
  function showEmpty(lead = "") {
    const filtered = Boolean(shownFilters.kind || shownFilters.search);
    empty.hidden = filtered;
    if (filtered) say(`${lead ? lead + " " : ""}No memories match these filters.`);
  }

  function query() {
    const params = new URLSearchParams();
    const kind = kindSelect.value;
    const search = searchInput.value.trim();
    if (kind) params.set("kind", kind);
    if (search) params.set("search", search);
    return { url: params.toString() ? `${endpoint}?${params}` : endpoint, kind, search };
  }

  async function load({ append = false } = {}) {
    const mine = (generation += 1);
    const { url, kind, search } = query();
    more.disabled = true;
    if (!append) say("Loading memories…");
    try {
      const page = await api(append && nextUrl ? nextUrl : url);
      if (mine !== generation) return;
      const rows = (page.results || []).map(memoryRow);
      nextUrl = page.next || null;
      if (append) {
        list.append(...rows);
        total += rows.length;
      } else {
        shownFilters = { kind, search };
        list.replaceChildren(...rows);
        total = rows.length;
      }
      updateCount(0);
      more.hidden = !nextUrl;
      empty.hidden = true;
      say("");
      if (!list.children.length) showEmpty();
      else if (!append) say(`${total}${nextUrl ? " or more" : ""} memor${total === 1 ? "y" : "ies"}${kind || search ? " match" : ""}.`);
    } catch (exc) {
      if (mine !== generation) return;
      say(`Could not load memories: ${problem(exc)}`);
    } finally {
      if (mine === generation) more.disabled = false;
    }
  }

  let searchTimer = null;
  function reloadSoon() {
    window.clearTimeout(searchTimer);
    searchTimer = window.setTimeout(() => load(), SEARCH_DELAY_MS);
  }

  filters.addEventListener("submit", (event) => {
    event.preventDefault();
    window.clearTimeout(searchTimer);
    load();
  });
  kindSelect.addEventListener("change", () => {
    window.clearTimeout(searchTimer);
    load();
  });
  searchInput.addEventListener("input", reloadSoon);
  more.addEventListener("click", () => load({ append: true }));

  load();
})();
