/* The message box: send (WebSocket frame, else REST with an idempotency key), interrupt, the
 * live count against the input limit, and notes that say what happened.
 */
import { $, ApiError, INTERRUPTIBLE, api, boot, newIdempotencyKey, state, ui } from "./ctx.js";

// --- composer -------------------------------------------------------------------------------

export function note(text, isError = false) {
  ui.note.textContent = text;
  ui.note.classList.toggle("error", isError);
}

/** Progress notes ("Message queued.") answer one moment; a turn starting or ending ends it. */
export function clearInfoNote() {
  if (!ui.note.classList.contains("error")) ui.note.textContent = "";
}

export function socketOpen() {
  return state.ws && state.ws.readyState === WebSocket.OPEN;
}

// The API's limit on one input (InputCreateSerializer); the page counts against it as you type.
export const INPUT_MAX = Number(ui.input.dataset.maxLength) || 100000;
export const INPUT_COUNT_FROM = 0.8; // the count shows from this share of the limit on
export const composerCount = $("composer-count");

/** The live count under the message box; over the limit Send is disabled and says why. */
export function updateInputCount() {
  const length = ui.input.value.length;
  const over = length - INPUT_MAX;
  composerCount.hidden = length < INPUT_MAX * INPUT_COUNT_FROM;
  composerCount.classList.toggle("error", over > 0);
  composerCount.textContent =
    over > 0
      ? `${length.toLocaleString()} / ${INPUT_MAX.toLocaleString()} characters: ${over.toLocaleString()} over the limit. ` +
        "Shorten it, or upload the text as a file (Files → Upload…) and ask the agent to read it."
      : `${length.toLocaleString()} / ${INPUT_MAX.toLocaleString()} characters`;
  ui.send.dataset.blocked = over > 0 ? "too-long" : "";
  ui.send.title = over > 0 ? "The message is over the limit: see the count under the box" : "";
  ui.send.setAttribute("aria-disabled", over > 0 ? "true" : "false");
}

export async function send() {
  const text = ui.input.value;
  if (!text.trim()) {
    // Kept (as an error note) until the person types: a status event must not clear it.
    note("Type a message first: an empty message is not sent.", true);
    ui.input.focus();
    return;
  }
  if (text.length > INPUT_MAX) {
    note(`Not sent: the message is ${(text.length - INPUT_MAX).toLocaleString()} characters over the limit.`, true);
    ui.input.focus();
    return;
  }
  const kind = ui.guidance.checked ? "guidance" : "message";
  ui.send.disabled = true;
  try {
    // Always through the API, even with the socket open: its 202 means the input is committed,
    // and only then is the box cleared. A frame on a socket that drops before the server reads
    // it would be lost with the text already gone (the frame carries no idempotency key).
    note("Sending…");
    await api(`${boot.api}inputs/`, {
      method: "POST",
      body: { text, kind },
      headers: { "Idempotency-Key": newIdempotencyKey() },
    });
    note(kind === "guidance" ? "Guidance queued." : "Message queued.");
    ui.input.value = "";
    updateInputCount();
  } catch (exc) {
    note(`Not sent: ${exc instanceof ApiError ? exc.describe() : exc}`, true);
  } finally {
    ui.send.disabled = false;
    ui.input.focus();
  }
}

export async function interrupt() {
  ui.interrupt.disabled = true; // until the next status event says otherwise
  try {
    if (socketOpen()) {
      state.ws.send(JSON.stringify({ type: "interrupt" }));
      state.awaitingAck.push({ kind: "interrupt", note: "Interrupt queued." });
      note("Interrupting…");
    } else {
      await api(`${boot.api}interrupt/`, { method: "POST" });
      note("Interrupt queued.");
    }
  } catch (exc) {
    ui.interrupt.disabled = !INTERRUPTIBLE.has(state.status);
    note(`Interrupt failed: ${exc instanceof ApiError ? exc.describe() : exc}`, true);
  }
}

ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});
ui.input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});
ui.interrupt.addEventListener("click", interrupt);
ui.input.addEventListener("input", () => {
  updateInputCount();
  // A note about the last attempt ("Type a message first", "over the limit") is answered by typing.
  if (ui.note.textContent.startsWith("Type a message") || ui.note.textContent.includes("over the limit")) note("");
});
