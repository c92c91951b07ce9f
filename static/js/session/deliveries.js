/* Delivery cards: what a completed turn delivered (files, checks, the answer's opening) or a
 * neutral "nothing delivered"; a decision is shown as a decision, a failed check in red.
 */
import { $, ANSWER_EXCERPT_CHARS, api, apiAll, boot, el, excerpt, formatBytes, richText, state, timeElement } from "./ctx.js";
import { files } from "./panels.js";
import { addExtra } from "./turn_notes.js";

/** What a parser found, one short line per fact (lists of rows or objects as their count). */
export function factLines(facts) {
  if (!facts || typeof facts !== "object") return [];
  const plain = (value) => value === null || ["string", "number", "boolean"].includes(typeof value);
  return Object.entries(facts).map(([key, value]) => {
    let shown;
    if (plain(value)) shown = String(value);
    else if (Array.isArray(value) && value.every(plain)) shown = value.length > 8 ? `${value.slice(0, 8).join(", ")}, … (${value.length})` : value.join(", ");
    else if (Array.isArray(value)) shown = `${value.length} item${value.length === 1 ? "" : "s"}`;
    else shown = `${Object.keys(value).length} field${Object.keys(value).length === 1 ? "" : "s"}`;
    return `${key.replace(/_/g, " ")}: ${shown}`;
  });
}

/**
 * The answer this delivery follows is the agent's message just above the card: here only its
 * opening (the whole text when unfolded), so the card does not repeat it.
 */
export function answerExcerpt(answer) {
  const plain = answer.replace(/\*\*([^*\n]+)\*\*/g, "$1").replace(/`([^`\n]+)`/g, "$1").replace(/\s+/g, " ").trim();
  const short = excerpt(plain, ANSWER_EXCERPT_CHARS);
  if (short === plain) {
    return el(
      "p",
      { className: "delivery-answer", dataset: { testid: "delivery-answer" } },
      el("span", { className: "delivery-answer-label", text: "Answer" }),
      el("span", { className: "delivery-answer-excerpt", dataset: { testid: "delivery-answer-excerpt" }, text: plain })
    );
  }
  return el(
    "details",
    { className: "delivery-answer", dataset: { testid: "delivery-answer" } },
    el(
      "summary",
      { attrs: { title: "Show the whole answer" } },
      el("span", { className: "delivery-answer-label", text: "Answer" }),
      el("span", { className: "delivery-answer-excerpt", dataset: { testid: "delivery-answer-excerpt" }, text: short })
    ),
    el("div", { className: "delivery-answer-full", dataset: { testid: "delivery-answer-full" } }, richText(answer))
  );
}

export function deliveryCard(delivery) {
  const key = String(delivery.id);
  const checks = Array.isArray(delivery.checks) ? delivery.checks : [];
  const deliveredFiles = Array.isArray(delivery.files) ? delivery.files : [];
  const failures = Array.isArray(delivery.unresolved_failures) ? delivery.unresolved_failures : [];
  const decisions = Array.isArray(delivery.decisions) ? delivery.decisions : [];
  const failedChecks = checks.filter((check) => !check.ok).length;
  const ok = delivery.checks_ok !== undefined ? Boolean(delivery.checks_ok) && !failures.length : !failedChecks && !failures.length;
  // The server's word (one owner for the API and the page); older records are judged the same way.
  const outcome = delivery.outcome || (!ok ? "failed" : !deliveredFiles.length && !checks.length ? "nothing_delivered" : "delivered");
  const verdict = [];
  if (outcome === "nothing_delivered") verdict.push("nothing delivered: no file written, nothing to check");
  else if (!checks.length) verdict.push("no file checks");
  else if (failedChecks) verdict.push(`${failedChecks} of ${checks.length} check${checks.length === 1 ? "" : "s"} failed`);
  else verdict.push(`all ${checks.length} check${checks.length === 1 ? "" : "s"} passed`);
  if (failures.length) verdict.push(`${failures.length} unresolved tool failure${failures.length === 1 ? "" : "s"}`);
  if (decisions.length) verdict.push(`${decisions.length} call${decisions.length === 1 ? "" : "s"} not run by decision`);
  const icon = { delivered: "✓", nothing_delivered: "○", failed: "✗" }[outcome] || "○";

  const parts = [
    el(
      "header",
      { className: "delivery-head" },
      el("span", { className: "delivery-icon", attrs: { "aria-hidden": "true" }, text: icon }),
      el("h3", { className: "delivery-title", text: "Delivery" }),
      el("span", {
        className: "badge machine-badge",
        attrs: { title: "Checked by the product with real parsers after the turn — not the model's own claim" },
        text: "machine-checked",
      }),
      el("span", { className: "delivery-verdict", dataset: { testid: "delivery-verdict" }, text: verdict.join(" · ") }),
      el(
        "span",
        { className: "delivery-when muted" },
        delivery.turn_number ? `turn ${delivery.turn_number} · ` : "",
        delivery.created_at ? timeElement(delivery.created_at, { clock: true }) : ""
      )
    ),
    el("p", {
      className: "delivery-lead muted",
      text: "What the product found when it opened the files this turn produced. These are automatic checks, not the agent's words.",
    }),
  ];
  if (delivery.final_answer) parts.push(answerExcerpt(String(delivery.final_answer)));
  if (deliveredFiles.length) {
    parts.push(
      el("h4", { text: "Files" }),
      el(
        "ul",
        { className: "delivery-files", dataset: { testid: "delivery-files" } },
        ...deliveredFiles.map((file) =>
          el(
            "li",
            { dataset: { path: file.path } },
            files
              ? el("button", {
                  className: "link delivery-file",
                  attrs: { type: "button", title: `Preview ${file.path}` },
                  text: file.path,
                  on: { click: () => files.open(file.path) },
                })
              : el("code", { text: file.path }),
            el("span", { className: "muted", text: ` ${formatBytes(file.size)}` }),
            file.sha256
              ? el("code", { className: "delivery-hash muted", attrs: { title: `sha256 ${file.sha256}` }, text: `sha256 ${String(file.sha256).slice(0, 12)}…` })
              : null
          )
        )
      )
    );
  }
  if (checks.length) {
    parts.push(
      el("h4", { text: "Checks" }),
      el(
        "ul",
        { className: "delivery-checks", dataset: { testid: "delivery-checks" } },
        ...checks.map((check) => {
          const facts = factLines(check.facts);
          return el(
            "li",
            { className: "delivery-check", dataset: { testid: "delivery-check", ok: check.ok ? "true" : "false", path: check.path } },
            el("span", { className: "check-mark", attrs: { "aria-hidden": "true" }, text: check.ok ? "✓" : "✗" }),
            el("span", { className: "visually-hidden", text: check.ok ? "passed: " : "failed: " }),
            el("code", { className: "check-path", text: check.path || "" }),
            el("span", { className: "check-name", text: check.check || "" }),
            check.detail ? el("span", { className: "check-detail", text: check.detail }) : null,
            facts.length
              ? el(
                  "details",
                  { className: "check-facts" },
                  el("summary", { text: "what the parser found" }),
                  el("ul", {}, ...facts.map((line) => el("li", { text: line })))
                )
              : null
          );
        })
      )
    );
  }
  if (decisions.length) {
    const said = (decision) =>
      decision.decision === "denied"
        ? `Denied by the approval policy${decision.comment ? `: ${decision.comment}` : ""}`
        : `${decision.decision === "expired" ? "Expired without a decision" : `Rejected by ${decision.by || "a person"}`}${decision.comment ? `: ${decision.comment}` : ""}`;
    parts.push(
      el("h4", { text: "Decisions" }),
      el(
        "ul",
        { className: "delivery-decisions", dataset: { testid: "delivery-decisions" } },
        ...decisions.map((decision) =>
          el(
            "li",
            { dataset: { callId: decision.call_id, decision: decision.decision } },
            el("span", { className: "check-mark", attrs: { "aria-hidden": "true" }, text: "⊘" }),
            el("code", { text: decision.tool || "tool" }),
            el("span", { text: ` not run — ${said(decision)}` })
          )
        )
      )
    );
  }
  if (failures.length) {
    parts.push(
      el("h4", { className: "failures-heading", text: "Unresolved failures" }),
      el(
        "ul",
        { className: "delivery-failures", dataset: { testid: "delivery-failures" } },
        ...failures.map((failure) =>
          el(
            "li",
            { dataset: { callId: failure.call_id } },
            el("span", { className: "check-mark", attrs: { "aria-hidden": "true" }, text: "✗" }),
            el("code", { text: failure.tool || "tool" }),
            el("span", { text: ` ${failure.summary || "failed"}` })
          )
        )
      )
    );
  }
  const card = el(
    "li",
    { className: "delivery-card", dataset: { testid: "delivery-card", deliveryId: key, checksOk: ok ? "true" : "false", outcome } },
    ...parts
  );
  return card;
}

/** `order`: the place among its turn's notes, taken when `delivery.recorded` arrived (the card
 * is read after it): a note of a later event of the turn stays after it, as after a reload. */
export function showDelivery(delivery, order) {
  if (!delivery || delivery.id === undefined || delivery.id === null) return;
  const key = String(delivery.id);
  const fresh = deliveryCard(delivery);
  const known = state.deliveryCards.get(key);
  state.deliveryCards.set(key, fresh);
  if (known) {
    fresh.dataset.turn = known.dataset.turn;
    fresh.dataset.order = known.dataset.order;
    fresh.classList.add("timeline-extra");
    known.replaceWith(fresh);
  } else {
    addExtra(fresh, delivery.turn, order);
  }
}

export function loadDelivery(id) {
  if (id === undefined || id === null) return;
  const order = (state.extraOrder += 1);
  api(`${boot.api}deliveries/${encodeURIComponent(id)}/`)
    .then((delivery) => showDelivery(delivery, order))
    .catch(() => {});
}

export async function loadDeliveries() {
  try {
    for (const delivery of await apiAll(`${boot.api}deliveries/`)) showDelivery(delivery);
  } catch (exc) {
    // An older server without deliveries: the timeline simply has none.
  }
}
