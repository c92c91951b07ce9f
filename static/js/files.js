/* The Session's workspace files: a live tree, uploads (button or drag-and-drop), downloads,
 * deletion and a preview pane. Used by the Session page (js/session/) as `window.xagent.filesPanel(options)`.
 *
 * The tree is read from `GET files/` and read again (debounced) on every `file.changed`
 * event, so the API stays the one source of rows. File names are user and model text: they
 * are only ever set as text. Previews come from `GET previews/{path}`:
 * - HTML is shown in an `<iframe sandbox="">` (no tokens: no scripts, forms, popups or
 *   navigation) pointed at the preview's `url`, which the raw route serves under a `sandbox` CSP
 *   without scripts. A sandboxed page with scripts still runs in an opaque origin (no cookies,
 *   no API), but it can navigate itself away carrying its own text, so scripts run only when the
 *   person presses "Run the page's scripts": then `sandbox="allow-scripts"` and `scripts_url`
 *   (`?scripts=1`). Never allow-same-origin. A new preview of the file starts without scripts.
 * - SVG comes back as kind `image` and is shown by `<img>`, which never runs its scripts.
 * - Markdown arrives already sanitized by the server; it is filtered again here through an
 *   allowlist before it reaches the page (defence in depth, no scripts, no event handlers).
 * - CSV cells, text lines and every name are text nodes.
 */
(function () {
  "use strict";
  const { api, el, formatBytes, uploadFile, ApiError } = window.xagent;

  const RELOAD_DEBOUNCE_MS = 250;
  const CHANGED_HIGHLIGHT_MS = 4000;
  const DONE_UPLOAD_VISIBLE_MS = 5000;
  const PREVIEW_READ_BYTES = 256 * 1024; // how much of a text or CSV file it reads

  /** "a b/c?.html" -> "a%20b/c%3F.html": each segment escaped, the slashes kept. */
  function encodePath(path) {
    return String(path).split("/").map(encodeURIComponent).join("/");
  }

  function baseName(path) {
    const parts = String(path).split("/");
    return parts[parts.length - 1] || path;
  }

  function withParam(url, key, value) {
    const parsed = new URL(url, window.location.href);
    parsed.searchParams.set(key, value);
    return parsed.pathname + parsed.search;
  }

  // --- markdown: the server's sanitized HTML, filtered again through an allowlist ----------------

  const MD_TAGS = new Set([
    "a", "abbr", "b", "blockquote", "br", "code", "dd", "del", "details", "div", "dl", "dt", "em",
    "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "ins", "kbd", "li", "mark", "ol", "p", "pre", "q",
    "s", "small", "span", "strong", "sub", "summary", "sup", "table", "tbody", "td", "tfoot", "th",
    "thead", "tr", "u", "ul",
  ]);
  const MD_DROP = new Set(["script", "style", "iframe", "object", "embed", "frame", "frameset", "form", "template", "noscript", "svg", "math", "link", "meta", "base"]);
  const MD_ATTRS = new Set(["href", "title", "colspan", "rowspan", "align", "start", "alt"]);

  function safeHref(value) {
    const href = String(value || "").trim();
    if (href.startsWith("#")) return href;
    try {
      const url = new URL(href, window.location.href);
      return url.protocol === "https:" || url.protocol === "http:" || url.protocol === "mailto:" ? url.href : null;
    } catch (exc) {
      return null;
    }
  }

  function sanitizedFragment(html) {
    const parsed = new DOMParser().parseFromString(`<body>${html || ""}</body>`, "text/html");
    const out = document.createDocumentFragment();
    function copy(node, parent) {
      for (const child of node.childNodes) {
        if (child.nodeType === Node.TEXT_NODE) {
          parent.append(document.createTextNode(child.textContent));
          continue;
        }
        if (child.nodeType !== Node.ELEMENT_NODE) continue;
        const tag = child.tagName.toLowerCase();
        if (MD_DROP.has(tag)) continue;
        if (!MD_TAGS.has(tag)) {
          copy(child, parent); // unknown wrapper (img included): keep its text only
          continue;
        }
        const clean = document.createElement(tag);
        for (const attr of child.attributes) {
          const name = attr.name.toLowerCase();
          if (!MD_ATTRS.has(name)) continue;
          if (name === "href") {
            const href = safeHref(attr.value);
            if (!href) continue;
            clean.setAttribute("href", href);
            if (!href.startsWith("#")) {
              clean.setAttribute("target", "_blank");
              clean.setAttribute("rel", "noopener noreferrer");
            }
            continue;
          }
          clean.setAttribute(name, attr.value);
        }
        copy(child, clean);
        parent.append(clean);
      }
    }
    copy(parsed.body, out);
    return out;
  }

  // --- the panel ------------------------------------------------------------------------------

  /**
   * filesPanel({apiBase, root, grid}) -> {load, fileChanged, open, fileUrl}
   * apiBase: "/api/v1/sessions/<id>/"; root: the Files card; grid: the element that widens
   * while a preview is open.
   */
  function filesPanel({ apiBase, root, grid }) {
    const q = (testid) => root.querySelector(`[data-testid="${testid}"]`);
    const ui = {
      tree: q("file-tree"),
      count: q("files-count"),
      empty: q("files-empty"),
      error: q("files-error"),
      uploads: q("uploads"),
      uploadButton: q("upload-button"),
      uploadInput: q("upload-input"),
      preview: q("file-preview"),
      previewName: q("preview-name"),
      previewMeta: q("preview-meta"),
      previewDownload: q("preview-download"),
      previewClose: q("preview-close"),
      previewBody: q("preview-body"),
    };
    const state = {
      entries: [],
      collapsed: new Set(), // directory paths folded by the user
      changed: new Map(), // path -> {op, at}: rows to highlight for a moment
      previewPath: null,
      previewToken: 0,
      reloadTimer: null,
      loading: null,
      reloadAgain: false,
      uploadQueue: Promise.resolve(),
    };

    function fileUrl(path, { download = false } = {}) {
      return `${apiBase}files/${encodePath(path)}${download ? "?download=1" : ""}`;
    }

    function showError(text) {
      ui.error.textContent = text || "";
      ui.error.hidden = !text;
    }

    // --- tree ---------------------------------------------------------------------------------

    /** The listing with every parent directory present (a listing may name files only). */
    function withParents(entries) {
      const byPath = new Map();
      for (const entry of entries) byPath.set(entry.path, entry);
      for (const entry of entries) {
        const parts = entry.path.split("/");
        for (let i = 1; i < parts.length; i += 1) {
          const dir = parts.slice(0, i).join("/");
          if (!byPath.has(dir)) byPath.set(dir, { path: dir, kind: "dir" });
        }
      }
      // Directories before their own children, siblings by name.
      return [...byPath.values()].sort((a, b) => {
        const pa = a.path.split("/");
        const pb = b.path.split("/");
        for (let i = 0; i < Math.min(pa.length, pb.length); i += 1) {
          if (pa[i] !== pb[i]) {
            const aDir = i < pa.length - 1 || a.kind === "dir";
            const bDir = i < pb.length - 1 || b.kind === "dir";
            if (aDir !== bDir) return aDir ? -1 : 1;
            return pa[i] < pb[i] ? -1 : 1;
          }
        }
        return pa.length - pb.length;
      });
    }

    function hiddenByFold(path) {
      const parts = path.split("/");
      for (let i = 1; i < parts.length; i += 1) if (state.collapsed.has(parts.slice(0, i).join("/"))) return true;
      return false;
    }

    function fileRow(entry) {
      const name = baseName(entry.path);
      const depth = entry.path.split("/").length - 1;
      const changed = state.changed.get(entry.path);
      const isDir = entry.kind === "dir";
      const row = el("li", {
        className: `file-row${isDir ? " file-dir" : ""}${entry.path === state.previewPath ? " selected" : ""}`,
        dataset: {
          testid: "file-row",
          path: entry.path,
          kind: isDir ? "dir" : "file",
          changed: changed && Date.now() - changed.at < CHANGED_HIGHLIGHT_MS ? changed.op : undefined,
        },
        attrs: { style: `--depth: ${depth}` },
      });
      if (isDir) {
        const folded = state.collapsed.has(entry.path);
        row.append(
          el(
            "button",
            {
              className: "file-open link",
              attrs: { type: "button", "aria-expanded": folded ? "false" : "true", title: entry.path },
              on: {
                click: () => {
                  if (state.collapsed.has(entry.path)) state.collapsed.delete(entry.path);
                  else state.collapsed.add(entry.path);
                  render();
                },
              },
            },
            el("span", { className: "file-icon", attrs: { "aria-hidden": "true" }, text: folded ? "▸" : "▾" }),
            el("span", { className: "file-name", text: `${name}/` })
          ),
          el("button", {
            className: "file-delete link",
            dataset: { testid: "file-delete" },
            attrs: { type: "button", title: `Delete the folder ${entry.path}`, "aria-label": `Delete the folder ${entry.path}` },
            text: "✕",
            on: { click: () => remove(entry.path, { folder: true }) },
          })
        );
        return row;
      }
      row.append(
        el(
          "button",
          {
            className: "file-open link",
            dataset: { testid: "file-open" },
            attrs: { type: "button", title: `Preview ${entry.path}`, "aria-current": entry.path === state.previewPath ? "true" : null },
            on: { click: () => open(entry.path) },
          },
          el("span", { className: "file-icon", attrs: { "aria-hidden": "true" } }),
          el("span", { className: "file-name", text: name })
        ),
        el("span", { className: "file-size muted", text: formatBytes(entry.size) }),
        el("a", {
          className: "file-download",
          dataset: { testid: "file-download" },
          attrs: { href: fileUrl(entry.path, { download: true }), download: name, title: `Download ${entry.path}`, "aria-label": `Download ${entry.path}` },
          text: "⤓",
        }),
        el("button", {
          className: "file-delete link",
          dataset: { testid: "file-delete" },
          attrs: { type: "button", title: `Delete ${entry.path}`, "aria-label": `Delete ${entry.path}` },
          text: "✕",
          on: { click: () => remove(entry.path) },
        })
      );
      if (entry.modified_at) row.querySelector(".file-size").title = `modified ${new Date(entry.modified_at).toLocaleString()}`;
      return row;
    }

    function render() {
      const rows = withParents(state.entries).filter((entry) => !hiddenByFold(entry.path));
      ui.tree.replaceChildren(...rows.map(fileRow));
      const files = state.entries.filter((entry) => entry.kind !== "dir");
      const total = files.reduce((sum, entry) => sum + (Number(entry.size) || 0), 0);
      ui.count.textContent = files.length ? `${files.length} file${files.length === 1 ? "" : "s"} · ${formatBytes(total)}` : "";
      ui.empty.hidden = state.entries.length > 0;
    }

    /** Read the tree again; calls while a read runs coalesce into one more read. */
    function load() {
      if (state.loading) {
        state.reloadAgain = true;
        return state.loading;
      }
      state.loading = (async () => {
        do {
          state.reloadAgain = false;
          try {
            const listing = await api(`${apiBase}files/`);
            state.entries = (Array.isArray(listing) ? listing : (listing && listing.results) || []).filter(
              (entry) => entry && typeof entry.path === "string"
            );
            showError("");
            render();
          } catch (exc) {
            showError(`Could not list the files: ${exc instanceof ApiError ? exc.describe() : exc}`);
          }
        } while (state.reloadAgain);
        state.loading = null;
      })();
      return state.loading;
    }

    function reloadSoon() {
      clearTimeout(state.reloadTimer);
      state.reloadTimer = setTimeout(load, RELOAD_DEBOUNCE_MS);
    }

    /** A `file.changed` event: {path, op, by?}. */
    function fileChanged(data) {
      if (!data || typeof data.path !== "string") return;
      state.changed.set(data.path, { op: data.op || "modified", at: Date.now() });
      setTimeout(() => {
        const mark = state.changed.get(data.path);
        if (mark && Date.now() - mark.at >= CHANGED_HIGHLIGHT_MS) {
          state.changed.delete(data.path);
          const row = ui.tree.querySelector(`[data-path="${CSS.escape(data.path)}"]`);
          if (row) delete row.dataset.changed;
        }
      }, CHANGED_HIGHLIGHT_MS + 50);
      reloadSoon();
      const previewed = state.previewPath;
      if (!previewed) return;
      if (data.op === "deleted" && (data.path === previewed || previewed.startsWith(`${data.path}/`))) {
        previewGone("This file was deleted from the workspace.");
      } else if (data.path === previewed) {
        refreshPreviewSoon();
      }
    }

    // --- delete -------------------------------------------------------------------------------

    async function remove(path, { folder = false } = {}) {
      const question = folder
        ? `Delete the folder “${path}” and everything in it from the workspace? This cannot be undone.`
        : `Delete “${path}” from the workspace? This cannot be undone.`;
      if (!window.confirm(question)) return;
      showError("");
      try {
        await api(fileUrl(path), { method: "DELETE" });
        if (state.previewPath === path || (folder && state.previewPath && state.previewPath.startsWith(`${path}/`))) close();
        state.changed.set(path, { op: "deleted", at: Date.now() });
        await load();
      } catch (exc) {
        showError(`Could not delete ${path}: ${exc instanceof ApiError ? exc.describe() : exc}`);
      }
    }

    // --- uploads ------------------------------------------------------------------------------

    function uploadRow(name) {
      const progress = el("progress", { attrs: { max: "1", value: "0", "aria-label": `Upload progress of ${name}` } });
      const status = el("span", { className: "upload-status", text: "waiting…" });
      const dismiss = el("button", {
        className: "link small upload-dismiss",
        attrs: { type: "button", "aria-label": `Dismiss the upload of ${name}`, hidden: true },
        text: "✕",
      });
      const row = el(
        "li",
        { className: "upload", dataset: { testid: "upload", state: "waiting", name } },
        el("span", { className: "upload-name", text: name, attrs: { title: name } }),
        progress,
        status,
        dismiss
      );
      dismiss.addEventListener("click", () => row.remove());
      ui.uploads.append(row);
      return {
        progress(fraction) {
          row.dataset.state = "uploading";
          progress.value = fraction;
          status.textContent = `${Math.round(fraction * 100)}%`;
        },
        done(result) {
          row.dataset.state = "done";
          progress.value = 1;
          // The server keeps a safe name (within the file system's length) and says when that
          // is not the name given: the row says so, what it became and why.
          const renamed = Boolean(result && result.name_changed);
          status.textContent = renamed
            ? `uploaded — the name was changed to ${result.path}${result.name_change_reason ? ` (${result.name_change_reason})` : ""}`
            : "uploaded";
          status.title = status.textContent;
          if (renamed) {
            row.dataset.renamed = "true";
            dismiss.hidden = false; // a changed name stays until read and dismissed
          } else {
            setTimeout(() => row.remove(), DONE_UPLOAD_VISIBLE_MS);
          }
        },
        failed(message) {
          row.dataset.state = "error";
          progress.hidden = true;
          status.textContent = message;
          status.setAttribute("role", "alert");
          dismiss.hidden = false;
        },
      };
    }

    /** POST one file (multipart) with progress, into `folder` or the root; resolves to the
     * API's answer, or null on failure. */
    async function uploadOne(file, folder) {
      const row = uploadRow(folder ? `${folder}/${file.name}` : file.name);
      const result = await uploadFile(`${apiBase}files/`, file, {
        path: folder ? `${folder}/` : undefined,
        onProgress: (fraction) => row.progress(fraction),
      });
      if (!result.ok) {
        row.failed(result.message);
        return null;
      }
      row.done(result.body);
      if (result.body && result.body.path) state.changed.set(result.body.path, { op: result.body.op || "created", at: Date.now() });
      return result.body;
    }

    /** Files one after another (a full workspace then refuses the next one by name). */
    function upload(files, folder) {
      const list = [...files];
      if (!list.length) return state.uploadQueue;
      state.uploadQueue = state.uploadQueue.then(async () => {
        for (const file of list) {
          await uploadOne(file, folder);
          reloadSoon();
        }
      });
      return state.uploadQueue;
    }

    function filesOf(dataTransfer) {
      const files = [];
      const skipped = [];
      const items = dataTransfer.items ? [...dataTransfer.items] : [];
      if (items.length) {
        for (const item of items) {
          if (item.kind !== "file") continue;
          const entry = item.webkitGetAsEntry ? item.webkitGetAsEntry() : null;
          const file = item.getAsFile();
          if (entry && entry.isDirectory) skipped.push(entry.name);
          else if (file) files.push(file);
        }
      } else {
        files.push(...(dataTransfer.files || []));
      }
      return { files, skipped };
    }

    const carriesFiles = (event) => event.dataTransfer && [...(event.dataTransfer.types || [])].includes("Files");
    let dragDepth = 0;
    root.addEventListener("dragenter", (event) => {
      if (!carriesFiles(event)) return;
      event.preventDefault();
      dragDepth += 1;
      root.classList.add("dropping");
    });
    root.addEventListener("dragover", (event) => {
      if (!carriesFiles(event)) return;
      event.preventDefault();
      event.dataTransfer.dropEffect = "copy";
      root.classList.add("dropping");
    });
    root.addEventListener("dragleave", () => {
      dragDepth = Math.max(dragDepth - 1, 0);
      if (!dragDepth) root.classList.remove("dropping");
    });
    root.addEventListener("drop", (event) => {
      if (!carriesFiles(event)) return;
      event.preventDefault();
      event.stopPropagation();
      dragDepth = 0;
      root.classList.remove("dropping");
      const { files, skipped } = filesOf(event.dataTransfer);
      showError(skipped.length ? `Folders are not uploaded (${skipped.join(", ")}): drop the files inside them.` : "");
      // Dropped on a folder's row: into that folder; anywhere else on the panel: the root.
      const folderRow = event.target instanceof Element ? event.target.closest(".file-row[data-kind=dir]") : null;
      upload(files, folderRow ? folderRow.dataset.path : undefined);
    });
    // A file dropped beside the panel must not navigate away from the Session.
    for (const type of ["dragover", "drop"]) {
      window.addEventListener(type, (event) => {
        if (carriesFiles(event) && !root.contains(event.target)) {
          event.preventDefault();
          if (event.dataTransfer) event.dataTransfer.dropEffect = "none";
        }
      });
    }

    ui.uploadButton.addEventListener("click", () => ui.uploadInput.click());
    ui.uploadInput.addEventListener("change", () => {
      const files = [...ui.uploadInput.files];
      ui.uploadInput.value = "";
      showError("");
      upload(files);
    });

    // --- preview ------------------------------------------------------------------------------

    function setPreviewOpen(isOpen) {
      ui.preview.hidden = !isOpen;
      if (grid) grid.classList.toggle("previewing", isOpen);
    }

    function previewNotice(text, isError = false) {
      ui.previewBody.replaceChildren(el("p", { className: `preview-notice${isError ? " error" : " muted"}`, text }));
    }

    function downloadButton(path) {
      return el("a", {
        className: "button-link",
        attrs: { href: fileUrl(path, { download: true }), download: baseName(path) },
        text: `Download ${baseName(path)}`,
      });
    }

    let refreshTimer = null; // a quiet re-read of the preview after the file changed

    /** The previewed file is gone: say so, and take away what no longer applies (its meta line,
     * the Download link that would only fetch a 404). A later `file.changed` for the same path
     * (written again) shows it again. */
    function previewGone(text) {
      state.previewToken += 1; // a preview read in flight must not draw over this
      clearTimeout(refreshTimer);
      ui.preview.dataset.kind = "";
      ui.preview.dataset.state = "gone";
      ui.previewMeta.textContent = "no longer in the workspace";
      ui.previewDownload.hidden = true;
      ui.previewDownload.removeAttribute("href");
      previewNotice(text, true);
    }

    const plural = (count, noun) => `${count} ${noun}${count === 1 ? "" : "s"}`;
    const countOf = (value, fallback) => (Number.isFinite(value) ? value : fallback);

    /** "at least 1234 rows … (first 256 KB read)": how far a count is known. */
    function countSummary(exact, data) {
      return exact ? "" : ` (first ${formatBytes(countOf(data.read_bytes, PREVIEW_READ_BYTES))} read)`;
    }

    /**
     * An HTML page, without its scripts until the person asks for them (see the header). The
     * frame is replaced, not re-flagged: a sandbox attribute only applies to the next navigation.
     */
    function htmlPreview(data, path, stamp) {
      const plainUrl = data.url || fileUrl(path);
      const scriptsUrl = data.scripts_url || withParam(plainUrl, "scripts", "1");
      const frame = (scripts) =>
        el("iframe", {
          className: "preview-frame",
          dataset: { testid: "preview-frame", scripts: scripts ? "on" : "off" },
          attrs: {
            sandbox: scripts ? "allow-scripts" : "",
            src: withParam(scripts ? scriptsUrl : plainUrl, "v", stamp),
            title: `Preview of ${path}${scripts ? " (scripts running)" : ""}`,
            referrerpolicy: "no-referrer",
          },
        });
      let current = frame(false);
      const status = el("p", { className: "preview-scripts-status muted", dataset: { testid: "preview-scripts-status" } });
      const toggle = el("button", {
        className: "secondary small",
        dataset: { testid: "preview-run-scripts" },
        attrs: { type: "button" },
      });
      const warning = el("p", {
        className: "preview-warning",
        dataset: { testid: "preview-scripts-warning" },
        text: "Scripts run in an isolated sandbox without your cookies, but a page can still navigate away and send its own content. Run scripts only for pages you trust.",
      });
      const bar = el("div", { className: "preview-scripts", dataset: { state: "off" } }, el("div", { className: "preview-scripts-row" }, status, toggle), warning);
      function label(scripts) {
        bar.dataset.state = scripts ? "on" : "off";
        status.textContent = scripts
          ? "The page's scripts are running, in a sandbox: no cookies, no access to this page or the API."
          : "Shown with its scripts off: anything the page draws with scripts (charts, tabs) is missing.";
        toggle.textContent = scripts ? "Turn the scripts off" : "Run the page's scripts";
      }
      toggle.addEventListener("click", () => {
        const scripts = bar.dataset.state !== "on";
        label(scripts);
        const next = frame(scripts);
        current.replaceWith(next);
        current = next;
      });
      label(false);
      return [bar, current];
    }

    const RENDERERS = {
      html: htmlPreview,
      image(data, path, stamp) {
        // SVG included: an <img> never runs an SVG's scripts or loads what it links to.
        return [
          el("img", {
            className: "preview-image",
            dataset: { testid: "preview-image" },
            attrs: { src: withParam(data.url || fileUrl(path), "v", stamp), alt: `Preview of ${path}` },
          }),
        ];
      },
      pdf(data, path) {
        return [
          el("p", { className: "muted", text: "PDF files are not shown inside the workspace (the preview sandbox has no PDF viewer). Download it to read it." }),
          downloadButton(path),
        ];
      },
      csv(data) {
        const header = Array.isArray(data.header) ? data.header : [];
        const rows = Array.isArray(data.rows) ? data.rows : [];
        const rowCount = countOf(data.row_count, rows.length);
        const columnCount = countOf(data.column_count, header.length);
        // An older server sends no `row_count_exact`: its count was over the whole file read.
        const exact = data.row_count_exact !== false;
        let summary = `${exact ? "" : "at least "}${plural(rowCount, "row")} × ${plural(columnCount, "column")}${countSummary(exact, data)}`;
        if (!exact || rows.length < rowCount) summary += ` — showing the first ${rows.length}`;
        return [
          el("p", { className: "csv-summary muted", dataset: { testid: "csv-summary", exact: String(exact) }, text: summary }),
          el(
            "div",
            { className: "table-scroll" },
            el(
              "table",
              { className: "csv-table", dataset: { testid: "csv-table" } },
              header.length ? el("thead", {}, el("tr", {}, ...header.map((cell) => el("th", { attrs: { scope: "col" }, text: cell })))) : null,
              el("tbody", {}, ...rows.map((row) => el("tr", {}, ...[].concat(row).map((cell) => el("td", { text: cell === null ? "" : cell })))))
            )
          ),
        ];
      },
      markdown(data) {
        const parts = [el("div", { className: "markdown-body", dataset: { testid: "preview-markdown" } }, sanitizedFragment(data.html))];
        if (data.truncated) parts.push(el("p", { className: "preview-note muted", text: "Only the beginning of the file is shown. Download it for the rest." }));
        return parts;
      },
      text(data) {
        const text = typeof data.text === "string" ? data.text : "";
        const lines = text.replace(/\n$/, "").split("\n");
        const lineCount = countOf(data.line_count, lines.length);
        // `line_count_exact` (newer servers), else `truncated` says the same thing.
        const exact = data.line_count_exact !== undefined ? data.line_count_exact !== false : !data.truncated;
        let summary = `${exact ? "" : "at least "}${plural(lineCount, "line")}${countSummary(exact, data)}`;
        if (!exact) summary += ` — showing the first ${lines.length}; download the file for the rest`;
        const parts = [];
        if (data.message) parts.push(el("p", { className: "preview-note muted", dataset: { testid: "preview-message" }, text: data.message }));
        parts.push(
          el("p", { className: "csv-summary muted", dataset: { testid: "text-summary", exact: String(exact) }, text: summary }),
          el(
            "pre",
            { className: "code-view", dataset: { testid: "preview-text" } },
            ...lines.map((line) => el("span", { className: "code-line", text: line }))
          )
        );
        return parts;
      },
      binary(data, path) {
        return [el("p", { className: "muted", dataset: { testid: "preview-binary" }, text: data.message || "This file cannot be previewed." }), downloadButton(path)];
      },
    };

    async function showPreview(path, { quiet = false } = {}) {
      const token = ++state.previewToken;
      state.previewPath = path;
      setPreviewOpen(true);
      ui.previewName.textContent = path;
      ui.previewName.title = path;
      ui.previewDownload.href = fileUrl(path, { download: true });
      ui.previewDownload.setAttribute("download", baseName(path));
      ui.previewDownload.hidden = false;
      ui.preview.dataset.path = path;
      if (!quiet || ui.preview.dataset.state === "gone") {
        ui.preview.dataset.kind = "";
        ui.previewMeta.textContent = "";
        previewNotice("Loading the preview…");
      }
      delete ui.preview.dataset.state;
      for (const row of ui.tree.querySelectorAll(".file-row")) {
        const current = row.dataset.path === path;
        row.classList.toggle("selected", current);
        const button = row.querySelector(".file-open");
        if (button && row.dataset.kind === "file") {
          if (current) button.setAttribute("aria-current", "true");
          else button.removeAttribute("aria-current");
        }
      }
      try {
        const data = await api(`${apiBase}previews/${encodePath(path)}`);
        if (token !== state.previewToken) return;
        const kind = RENDERERS[data.kind] ? data.kind : "binary";
        ui.preview.dataset.kind = kind;
        const meta = [data.kind || "file"];
        if (data.size !== undefined) meta.push(formatBytes(data.size));
        if (data.modified_at) meta.push(new Date(data.modified_at).toLocaleString());
        ui.previewMeta.textContent = meta.join(" · ");
        ui.previewBody.replaceChildren(...RENDERERS[kind](data, path, String(Date.now())));
      } catch (exc) {
        if (token !== state.previewToken) return;
        if (exc instanceof ApiError && exc.status === 404) previewGone("This file is not in the workspace (any more).");
        else previewNotice(`Could not preview ${path}: ${exc instanceof ApiError ? exc.describe() : exc}`, true);
      }
    }

    function refreshPreviewSoon() {
      clearTimeout(refreshTimer);
      refreshTimer = setTimeout(() => {
        if (state.previewPath) showPreview(state.previewPath, { quiet: true });
      }, RELOAD_DEBOUNCE_MS);
    }

    function open(path) {
      showPreview(path).then(() => {
        if (!ui.preview.hidden) ui.preview.scrollIntoView({ block: "nearest" });
      });
    }

    function close() {
      state.previewToken += 1;
      state.previewPath = null;
      ui.previewBody.replaceChildren();
      delete ui.preview.dataset.path;
      setPreviewOpen(false);
      for (const row of ui.tree.querySelectorAll(".file-row.selected")) row.classList.remove("selected");
      for (const button of ui.tree.querySelectorAll("[aria-current]")) button.removeAttribute("aria-current");
    }

    ui.previewClose.addEventListener("click", close);
    ui.preview.addEventListener("keydown", (event) => {
      if (event.key === "Escape") close();
    });

    return { load, fileChanged, open, fileUrl };
  }

  window.xagent.filesPanel = filesPanel;
  window.xagent.encodePath = encodePath;
})();
