/* Shared helpers of the browser workspace: the REST client (browser session + CSRF), file
 * uploads to a Session's workspace, a DOM builder that only ever sets text (model and user
 * text is never parsed as HTML), and status/time formatting. Exposed as `window.xagent` for home.js and the Session page modules (js/session/). */
(function () {
  "use strict";

  const STATUSES = ["idle", "queued", "preparing", "running", "waiting_approval", "compressing", "interrupted", "failed"];

  // Why a Session waits as `queued` (CONTRACT `session.status.reason`), in words.
  const QUEUE_REASONS = {
    capacity: "Waiting for a free worker: every worker is busy.",
    tenant_limit: "Waiting: your organisation already runs as many Sessions at once as it may; this one starts when one of them is done.",
    quota_exceeded: "Waiting: a usage quota is spent. It goes on when an admin raises the limit or the next period begins.",
    provider_unavailable: "Waiting: the model provider is unavailable.",
  };

  /** The reason line under a status: a queue reason in words, any other reason as given. */
  function statusReasonText(status, reason) {
    if (status === "queued" && QUEUE_REASONS[reason]) return QUEUE_REASONS[reason];
    return reason || "";
  }

  function cookie(name) {
    for (const part of document.cookie ? document.cookie.split(";") : []) {
      const [key, ...rest] = part.trim().split("=");
      if (key === name) return decodeURIComponent(rest.join("="));
    }
    return "";
  }

  function csrfToken() {
    // The cookie is the source DRF's SessionAuthentication checks against; the value the page
    // was rendered with covers CSRF_COOKIE_HTTPONLY deployments.
    const holder = document.querySelector("[data-csrf]");
    return cookie("csrftoken") || (holder ? holder.dataset.csrf : "");
  }

  class ApiError extends Error {
    constructor(status, body) {
      const error = (body && body.error) || {};
      super(error.message || `The server answered ${status}.`);
      this.status = status;
      this.code = error.code || "http_" + status;
      this.details = error.details || {};
    }

    /** A sentence for the user, with field errors if the API gave any. */
    describe() {
      const fields = Object.entries(this.details || {})
        .map(([field, problems]) => `${field}: ${[].concat(problems).join(" ")}`)
        .join("; ");
      return fields ? `${this.message} (${fields})` : this.message;
    }
  }

  /** Same-origin path of an API URL (cursor `next` links are absolute). */
  function localPath(url) {
    const parsed = new URL(url, window.location.href);
    return parsed.pathname + parsed.search;
  }

  async function api(path, { method = "GET", body, headers = {} } = {}) {
    const init = {
      method,
      credentials: "same-origin",
      headers: { Accept: "application/json", ...headers },
    };
    if (method !== "GET" && method !== "HEAD") {
      init.headers["X-CSRFToken"] = csrfToken();
      if (body !== undefined) {
        init.headers["Content-Type"] = "application/json";
        init.body = JSON.stringify(body);
      }
    }
    let response;
    try {
      response = await fetch(localPath(path), init);
    } catch (exc) {
      throw new ApiError(0, { error: { code: "network", message: "The server cannot be reached." } });
    }
    const text = await response.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch (exc) {
        data = null;
      }
    }
    if (!response.ok) throw new ApiError(response.status, data);
    return data;
  }

  /** Every row of a cursor-paginated list (`{"results", "next"}`), following the `next` links. */
  async function apiAll(path) {
    const rows = [];
    for (let next = path; next; ) {
      const page = await api(next);
      rows.push(...((page && page.results) || []));
      next = page && page.next;
    }
    return rows;
  }

  /**
   * el("li", {className, dataset, attrs, text, on}, ...children): children are nodes or
   * strings (added as text nodes). Nothing here ever assigns innerHTML.
   */
  function el(tag, options = {}, ...children) {
    const node = document.createElement(tag);
    if (options.className) node.className = options.className;
    if (options.text !== undefined && options.text !== null) node.textContent = String(options.text);
    for (const [key, value] of Object.entries(options.dataset || {})) {
      if (value !== undefined && value !== null) node.dataset[key] = String(value);
    }
    for (const [key, value] of Object.entries(options.attrs || {})) {
      if (value === false || value === undefined || value === null) continue;
      node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const [event, handler] of Object.entries(options.on || {})) node.addEventListener(event, handler);
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  /** Text with `**bold**` and `code` spans, built as text nodes (safe for any input). */
  function richText(text) {
    const fragment = document.createDocumentFragment();
    const pattern = /(\*\*[^*\n]+\*\*|`[^`\n]+`)/g;
    let last = 0;
    for (const match of String(text).matchAll(pattern)) {
      if (match.index > last) fragment.append(document.createTextNode(text.slice(last, match.index)));
      const token = match[0];
      fragment.append(
        token.startsWith("**") ? el("strong", { text: token.slice(2, -2) }) : el("code", { text: token.slice(1, -1) })
      );
      last = match.index + token.length;
    }
    if (last < text.length) fragment.append(document.createTextNode(text.slice(last)));
    return fragment;
  }

  function statusLabel(status) {
    return String(status || "unknown").replace(/_/g, " ");
  }

  /** A status pill: coloured by `data-status` in app.css, labelled in words (not colour alone). */
  function statusBadge(status) {
    return el(
      "span",
      { className: "status-badge", dataset: { status } },
      el("span", { className: "dot", attrs: { "aria-hidden": "true" } }),
      el("span", { className: "status-text", text: statusLabel(status) })
    );
  }

  const relative = typeof Intl !== "undefined" && Intl.RelativeTimeFormat
    ? new Intl.RelativeTimeFormat(undefined, { numeric: "auto" })
    : null;

  function timeAgo(iso) {
    const then = new Date(iso);
    if (Number.isNaN(then.getTime())) return "";
    const seconds = Math.round((then.getTime() - Date.now()) / 1000);
    const abs = Math.abs(seconds);
    if (!relative) return then.toLocaleString();
    if (abs < 45) return relative.format(seconds, "second");
    if (abs < 45 * 60) return relative.format(Math.round(seconds / 60), "minute");
    if (abs < 20 * 3600) return relative.format(Math.round(seconds / 3600), "hour");
    if (abs < 7 * 86400) return relative.format(Math.round(seconds / 86400), "day");
    return then.toLocaleDateString();
  }

  function clockTime(iso) {
    const then = new Date(iso);
    return Number.isNaN(then.getTime()) ? "" : then.toLocaleTimeString();
  }

  function timeElement(iso, { clock = false } = {}) {
    return el("time", {
      attrs: { datetime: iso, title: iso ? new Date(iso).toLocaleString() : "" },
      text: clock ? clockTime(iso) : timeAgo(iso),
    });
  }

  /** 1536 -> "1.5 KB" (binary multiples, one decimal below 10). */
  function formatBytes(size) {
    const bytes = Number(size);
    if (!Number.isFinite(bytes) || bytes < 0) return "";
    if (bytes < 1024) return `${bytes} B`;
    const units = ["KB", "MB", "GB", "TB"];
    let value = bytes / 1024;
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return `${value < 10 ? value.toFixed(1) : Math.round(value)} ${units[unit]}`;
  }

  /** A sentence for a failed upload: the API's own error (with its field details) when it sent
   * one, else what the HTTP status means. */
  function uploadErrorMessage(status, body) {
    const error = body && body.error;
    if (error && error.message) {
      const detail = error.details && typeof error.details === "object"
        ? Object.entries(error.details)
            .filter(([, value]) => typeof value === "string" || typeof value === "number" || Array.isArray(value))
            .map(([key, value]) => `${key}: ${[].concat(value).join(" ")}`)
            .join("; ")
        : "";
      return detail ? `${error.message} (${detail})` : error.message;
    }
    if (status === 413) return "The file is too large for the workspace.";
    if (status === 0) return "The server cannot be reached.";
    if (status === 401 || status === 403) return "Your login has expired. Reload the page to log in again.";
    return `The server answered ${status}.`;
  }

  /**
   * uploadFile(url, file, {path, onProgress}) -> Promise<{ok, status, body, message}>: one
   * multipart POST (`file`, optional `path`) to a Session's `files/` route, with the CSRF header
   * and upload progress (XHR: fetch reports no upload progress). Never rejects: a failure
   * resolves with ok=false and a sentence for the user in `message`.
   */
  function uploadFile(url, file, { path, onProgress } = {}) {
    return new Promise((resolve) => {
      const form = new FormData();
      form.append("file", file, file.name);
      if (path) form.append("path", path);
      const xhr = new XMLHttpRequest();
      xhr.open("POST", localPath(url));
      xhr.withCredentials = true;
      xhr.setRequestHeader("X-CSRFToken", csrfToken());
      xhr.setRequestHeader("Accept", "application/json");
      if (onProgress) {
        xhr.upload.addEventListener("progress", (event) => {
          if (event.lengthComputable && event.total) onProgress(event.loaded / event.total);
        });
      }
      xhr.addEventListener("load", () => {
        let body = null;
        try {
          body = xhr.responseText ? JSON.parse(xhr.responseText) : null;
        } catch (exc) {
          body = null;
        }
        const ok = xhr.status >= 200 && xhr.status < 300;
        resolve({ ok, status: xhr.status, body, message: ok ? "" : uploadErrorMessage(xhr.status, body) });
      });
      xhr.addEventListener("error", () => resolve({ ok: false, status: 0, body: null, message: uploadErrorMessage(0, null) }));
      xhr.addEventListener("abort", () => resolve({ ok: false, status: 0, body: null, message: "The upload was cancelled." }));
      if (onProgress) onProgress(0);
      xhr.send(form);
    });
  }

  function newIdempotencyKey() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    return `k-${Date.now()}-${Math.random().toString(16).slice(2)}`;
  }

  window.xagent = {
    STATUSES,
    statusReasonText,
    ApiError,
    api,
    csrfToken,
    formatBytes,
    apiAll,
    el,
    richText,
    statusLabel,
    statusBadge,
    timeAgo,
    clockTime,
    timeElement,
    newIdempotencyKey,
    uploadFile,
    uploadErrorMessage,
  };
})();
