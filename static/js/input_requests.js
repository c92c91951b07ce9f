/* MCP input requests (elicitation) in the Session page: a server asked the person something in
 * the middle of a tool call. Used by the Session page (js/session/) as `window.xagent.inputRequests.panel(options)`.
 *
 * Pending requests are read from the API at start (`input-requests/?status=pending`); new ones
 * arrive as `input.requested` events (the event carries the message and the schema, so the card
 * renders at once), answers as `input.answered` — whoever gave them (this page, another browser,
 * the API, the WebSocket, the timeout, an interrupt). The card renders the requested fields from
 * the schema (text, number, checkbox, select, multi-select), with required markers, descriptions
 * and defaults pre-filled; Accept sends the form, Decline and Cancel send nothing else. Answers
 * go over REST (`…/input-requests/{id}/answer/`): its 400 names each field that does not fit, and
 * the card shows that next to the field and stays open.
 *
 * Everything the server sent (message, titles, descriptions, options) is text: set with
 * textContent inside <bdi>, with direction controls shown by name, so a server cannot reorder
 * what a person reads.
 */
(function () {
  "use strict";
  const { api, apiAll, el, clockTime, timeElement, statusLabel, ApiError } = window.xagent;

  const DIRECTION_CONTROLS = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
  const OUTCOMES = {
    accepted: "Answered",
    declined: "Declined",
    cancelled: "Cancelled",
    expired: "Expired — the server was told no",
  };
  const TEXT_INPUT_TYPES = { email: "email", uri: "url", date: "date", "date-time": "datetime-local" };

  function visibleControls(text) {
    return String(text === undefined || text === null ? "" : text).replace(
      DIRECTION_CONTROLS,
      (ch) => `⟨U+${ch.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}⟩`
    );
  }

  /** Server text, isolated: a <bdi> so its direction cannot flip the sentence around it. */
  function serverText(text, className) {
    return el("bdi", { className, text: visibleControls(text) });
  }

  /** [{value, label}] of a select, or null when the field is free text. */
  function choicesOf(prop) {
    if (!prop || typeof prop !== "object") return null;
    if (Array.isArray(prop.enum)) {
      const names = Array.isArray(prop.enumNames) ? prop.enumNames : [];
      return prop.enum.map((value, index) => ({ value: String(value), label: names[index] || String(value) }));
    }
    const options = prop.oneOf || prop.anyOf;
    if (Array.isArray(options)) {
      return options
        .filter((o) => o && typeof o === "object" && "const" in o)
        .map((o) => ({ value: String(o.const), label: o.title || String(o.const) }));
    }
    return null;
  }

  function panel({ container, sessionApi, onChange }) {
    const cards = new Map(); // request id -> card
    const changed = () => onChange && onChange();

    function requestUrl(id) {
      return `${sessionApi}input-requests/${encodeURIComponent(id)}/`;
    }

    function sync() {
      container.hidden = cards.size === 0;
      changed();
    }

    /** One field of the form: its control, from the property's schema. */
    function field(key, name, prop, required) {
      const id = `input-${key}-${name}`;
      const title = prop.title || name;
      const description = prop.description ? el("small", { className: "input-field-help muted" }, serverText(prop.description)) : null;
      const marker = required ? el("span", { className: "input-required", attrs: { "aria-hidden": "true" }, text: " *" }) : null;
      const error = el("p", { className: "input-field-error error", dataset: { testid: "input-field-error" }, attrs: { hidden: true } });
      const wrap = el("div", { className: "input-field", dataset: { field: name, testid: "input-field" } });
      const choices = choicesOf(prop);
      if (prop.type === "boolean") {
        const box = el("input", { attrs: { type: "checkbox", id, name, checked: prop.default === true } });
        box.dataset.kind = "boolean";
        wrap.append(el("label", { className: "input-check", attrs: { for: id } }, box, " ", serverText(title), marker), description, error);
        return wrap;
      }
      if (prop.type === "array") {
        const options = choicesOf(prop.items) || [];
        const defaults = new Set(Array.isArray(prop.default) ? prop.default.map(String) : []);
        const group = el(
          "fieldset",
          { className: "input-multi", dataset: { kind: "multi" } },
          el("legend", {}, serverText(title), marker),
          ...options.map(({ value, label }, index) =>
            el(
              "label",
              { className: "input-check" },
              el("input", { attrs: { type: "checkbox", id: `${id}-${index}`, value, checked: defaults.has(value) } }),
              " ",
              serverText(label)
            )
          )
        );
        wrap.append(group, description, error);
        return wrap;
      }
      const label = el("label", { attrs: { for: id } }, serverText(title), marker);
      let control;
      if (choices) {
        control = el(
          "select",
          { attrs: { id, name, required } },
          el("option", { attrs: { value: "" }, text: required ? "Choose…" : "(none)" }),
          ...choices.map(({ value, label: text }) =>
            el("option", { attrs: { value, selected: prop.default !== undefined && String(prop.default) === value }, text: visibleControls(text) })
          )
        );
        control.dataset.kind = "choice";
      } else if (prop.type === "number" || prop.type === "integer") {
        control = el("input", {
          attrs: {
            type: "number",
            id,
            name,
            required,
            min: typeof prop.minimum === "number" ? prop.minimum : null,
            max: typeof prop.maximum === "number" ? prop.maximum : null,
            step: prop.type === "integer" ? 1 : "any",
            value: typeof prop.default === "number" ? prop.default : null,
          },
        });
        control.dataset.kind = prop.type;
      } else {
        control = el("input", {
          attrs: {
            type: TEXT_INPUT_TYPES[prop.format] || "text",
            id,
            name,
            required,
            dir: "auto",
            minlength: Number.isInteger(prop.minLength) ? prop.minLength : null,
            maxlength: Number.isInteger(prop.maxLength) ? prop.maxLength : null,
            value: typeof prop.default === "string" ? prop.default : null,
          },
        });
        control.dataset.kind = "string";
      }
      wrap.append(label, description, control, error);
      return wrap;
    }

    /** The form's values as the schema types them; an empty optional field is left out. */
    function collect(card) {
      const content = {};
      for (const wrap of card.querySelectorAll(".input-field")) {
        const name = wrap.dataset.field;
        const multi = wrap.querySelector("fieldset[data-kind=multi]");
        if (multi) {
          content[name] = [...multi.querySelectorAll("input:checked")].map((box) => box.value);
          continue;
        }
        const control = wrap.querySelector("input, select");
        const kind = control.dataset.kind;
        if (kind === "boolean") content[name] = control.checked;
        else if (control.value === "") continue;
        else if (kind === "number" || kind === "integer") content[name] = Number(control.value);
        else content[name] = control.value;
      }
      return content;
    }

    function card(id) {
      const key = String(id);
      let found = cards.get(key);
      if (found) return found;
      found = el(
        "article",
        {
          className: "input-card",
          dataset: { testid: "input-request-card", requestId: key, status: "pending" },
          attrs: { "aria-labelledby": `input-title-${key}` },
        },
        el(
          "header",
          { className: "approval-head" },
          el("span", { className: "input-icon", attrs: { "aria-hidden": "true" } }),
          el(
            "h3",
            { className: "approval-title", attrs: { id: `input-title-${key}` } },
            el("span", { className: "input-kicker", text: "Input requested by" }),
            el("code", { className: "approval-tool input-server", dataset: { testid: "input-server" } })
          ),
          el("span", { className: "approval-state input-state", dataset: { testid: "input-state" }, text: "waiting for you" })
        ),
        el("p", { className: "input-message", dataset: { testid: "input-message" } }),
        el("form", { className: "input-form", attrs: { novalidate: true }, on: { submit: (event) => { event.preventDefault(); answer(key, "accept"); } } },
          el("div", { className: "input-fields" }),
          el("p", { className: "input-times muted" }),
          el(
            "div",
            { className: "approval-actions input-actions" },
            el("button", { dataset: { testid: "input-cancel" }, attrs: { type: "button" }, text: "Cancel", on: { click: () => answer(key, "cancel") } }),
            el("button", { className: "danger", dataset: { testid: "input-decline" }, attrs: { type: "button" }, text: "Decline", on: { click: () => answer(key, "decline") } }),
            el("button", { className: "approve", dataset: { testid: "input-accept" }, attrs: { type: "submit" }, text: "Accept" })
          )
        ),
        el("p", { className: "approval-message input-note", dataset: { testid: "input-note" }, attrs: { role: "alert", hidden: true } }),
        el(
          "div",
          { className: "approval-outcome input-outcome-row", attrs: { hidden: true } },
          el("p", { className: "approval-outcome-text input-outcome", dataset: { testid: "input-outcome" } }),
          el("button", {
            className: "link small",
            attrs: { type: "button", "aria-label": "Dismiss this answered request" },
            text: "Dismiss",
            on: { click: () => dismiss(key) },
          })
        )
      );
      cards.set(key, found);
      container.append(found);
      sync();
      return found;
    }

    function setNote(target, text, isError = false) {
      const note = target.querySelector(".input-note");
      note.textContent = text || "";
      note.hidden = !text;
      note.classList.toggle("error", Boolean(text) && isError);
    }

    function setBusy(target, busy) {
      target.dataset.busy = busy ? "true" : "false";
      for (const control of target.querySelectorAll("form input, form select, form button")) control.disabled = busy;
    }

    function showFields(target, key, schema) {
      if (target.dataset.rendered) return;
      const props = (schema && typeof schema.properties === "object" && schema.properties) || {};
      const required = new Set(Array.isArray(schema && schema.required) ? schema.required : []);
      const fields = Object.entries(props).map(([name, prop]) => field(key, name, prop || {}, required.has(name)));
      const box = target.querySelector(".input-fields");
      box.replaceChildren(...fields);
      if (!fields.length) box.append(el("p", { className: "muted", text: "The server asks for no fields: accept or decline." }));
      if (required.size) box.append(el("p", { className: "muted input-required-note", text: "* required" }));
      target.dataset.rendered = "1";
    }

    /** Apply a request as the API returns it, or as much as an event carries. */
    function show(request) {
      if (!request || request.id === undefined || request.id === null) return null;
      const key = String(request.id);
      const target = card(key);
      if (request.server) target.querySelector(".input-server").replaceChildren(serverText(request.server));
      if (request.message !== undefined) target.querySelector(".input-message").replaceChildren(serverText(request.message));
      if (request.schema) showFields(target, key, request.schema);
      if (request.expires_at && request.status === "pending") {
        target.querySelector(".input-times").replaceChildren("declined automatically ", timeElement(request.expires_at), " if nobody answers");
      }
      if (request.status && request.status !== "pending") showOutcome(target, request.status, request.answered_by, request.answered_at);
      return target;
    }

    function showOutcome(target, status, by, at) {
      target.dataset.status = status;
      setBusy(target, false);
      target.querySelector(".input-form").hidden = true;
      target.querySelector(".input-state").textContent = statusLabel(status);
      if (by) target.dataset.answeredBy = by;
      if (at) target.dataset.answeredAt = at;
      const who = target.dataset.answeredBy && !["timeout", "interrupt", "system"].includes(target.dataset.answeredBy) ? ` by ${target.dataset.answeredBy}` : "";
      const when = target.dataset.answeredAt ? ` at ${clockTime(target.dataset.answeredAt)}` : "";
      target.querySelector(".input-outcome").textContent = `${OUTCOMES[status] || statusLabel(status)}${who}${when}`;
      target.querySelector(".input-outcome-row").hidden = false;
      changed();
    }

    function dismiss(key) {
      const target = cards.get(key);
      if (!target || target.dataset.status === "pending") return;
      target.remove();
      cards.delete(key);
      sync();
    }

    function showFieldErrors(target, problems) {
      for (const wrap of target.querySelectorAll(".input-field")) {
        const error = wrap.querySelector(".input-field-error");
        const text = problems && problems[wrap.dataset.field];
        error.textContent = text ? [].concat(text).join(" ") : "";
        error.hidden = !text;
      }
    }

    async function answer(key, action) {
      const target = cards.get(key);
      if (!target || target.dataset.status !== "pending" || target.dataset.busy === "true") return;
      const body = { action };
      if (action === "accept") body.content = collect(target);
      setBusy(target, true);
      setNote(target, { accept: "Sending your answer…", decline: "Declining…", cancel: "Cancelling…" }[action]);
      try {
        const request = await api(`${requestUrl(key)}answer/`, { method: "POST", body });
        showFieldErrors(target, null);
        setNote(target, "");
        show(request);
      } catch (exc) {
        setBusy(target, false);
        if (exc instanceof ApiError && exc.code === "already_decided") {
          setNote(target, "Already answered elsewhere, or it expired.", true);
          refresh(key);
        } else if (exc instanceof ApiError && exc.details && exc.details.content) {
          showFieldErrors(target, exc.details.content);
          setNote(target, "Some fields do not fit what the server asked for.", true);
        } else {
          setNote(target, `Not sent: ${exc instanceof ApiError ? exc.describe() : exc}`, true);
        }
      }
    }

    function refresh(key) {
      return api(requestUrl(key)).then(show).catch(() => {});
    }

    return {
      async load() {
        try {
          const rows = await apiAll(`${sessionApi}input-requests/?status=pending&page_size=200`);
          for (const row of rows) show(row);
        } catch (exc) {
          /* the events still bring new requests; an old one shows on the next reload */
        }
      },
      requested(data) {
        const target = show({
          id: data.request_id,
          status: "pending",
          server: data.server,
          message: data.message,
          schema: data.schema,
          expires_at: data.expires_at,
        });
        if (target) target.scrollIntoView({ block: "nearest" });
      },
      answered(data) {
        const target = cards.get(String(data.request_id));
        if (!target) return;
        if (target.dataset.status === "pending") setNote(target, "");
        showOutcome(target, data.status || { accept: "accepted", decline: "declined", cancel: "cancelled" }[data.action], data.by);
        refresh(String(data.request_id)); // the answer's time
      },
      /** Leaving the running state (an interrupt, a lost runner): re-read cards still open. */
      reconcile() {
        for (const [key, target] of cards) if (target.dataset.status === "pending" && target.dataset.busy !== "true") refresh(key);
      },
      pending() {
        return [...cards.values()].some((target) => target.dataset.status === "pending");
      },
    };
  }

  window.xagent.inputRequests = { panel, visibleControls };
})();
