/* The WebSocket: connect with `after=<last seq>`, reconnect with backoff, and tell a lost login
 * ("signed out — sign in again") from a network drop.
 */
import { refreshApproval } from "./approvals.js";
import { note } from "./composer.js";
import { $, ApiError, api, boot, el, state, ui } from "./ctx.js";
import { applyFrame } from "./events.js";

// --- WebSocket ------------------------------------------------------------------------------

export function setLive(name, text) {
  ui.live.dataset.state = name;
  ui.liveText.textContent = text;
}

export function connect() {
  state.retryTimer = null;
  if (state.stopped || state.ws) return;
  const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${scheme}//${window.location.host}${boot.ws}?after=${state.lastSeq}`);
  state.ws = ws;
  let opened = false;
  ws.addEventListener("open", () => {
    opened = true;
    state.attempts = 0;
    setLive("live", "live");
  });
  ws.addEventListener("message", (message) => {
    if (state.ws !== ws) return; // a socket being replaced
    let frame;
    try {
      frame = JSON.parse(message.data);
    } catch (exc) {
      return;
    }
    applyFrame(frame);
  });
  ws.addEventListener("close", (event) => {
    if (state.ws === ws) state.ws = null;
    if (event.code === 4401) {
      signedOut(); // the server closed it: this login ended or left the tenant
      return;
    }
    if (state.awaitingAck.length) {
      const unanswered = state.awaitingAck;
      state.awaitingAck = [];
      if (unanswered.some((sent) => sent.kind !== "decide")) {
        // Messages go through the API (composer.js): what is left unanswered here is an interrupt.
        note("The connection dropped while sending the interrupt; press Interrupt again if the Session goes on.", true);
      }
      // A decision may or may not have been recorded: ask the API rather than guess.
      for (const sent of unanswered) if (sent.kind === "decide") refreshApproval(sent.approvalId, { droppedWhileSending: true });
    }
    if (!opened) state.attempts += 1;
    scheduleReconnect();
  });
}

export function scheduleReconnect() {
  if (state.stopped || state.retryTimer) return;
  setLive("reconnecting", "reconnecting…");
  // A restart drops the socket once; a refused handshake fails every time: ask why then.
  if (state.attempts >= 1) checkStillAllowed();
  const delay = Math.min(1000 * 2 ** Math.min(state.attempts, 5), 30000) * (0.75 + Math.random() * 0.5);
  state.retryTimer = setTimeout(connect, delay);
}

export function reconnectNow() {
  const ws = state.ws;
  if (!ws) return;
  state.ws = null;
  ws.close(); // its close handler schedules the reconnect from state.lastSeq
}

/** A refused handshake looks like a network error in the browser: ask the API why. */
export function checkStillAllowed() {
  api(boot.api).catch((exc) => {
    if (!(exc instanceof ApiError)) return;
    if (exc.status === 401 || exc.status === 403) {
      signedOut();
    } else if (exc.status === 404) {
      state.stopped = true;
      clearTimeout(state.retryTimer);
      setLive("offline", "offline");
      note("This Session is no longer available.", true);
    }
  });
}

/** The browser's login ended (signed out elsewhere, expired, removed from the tenant): say so
 * with a way back, and stop reconnecting — retrying could never succeed. */
export function signedOut() {
  state.stopped = true;
  clearTimeout(state.retryTimer);
  setLive("signed-out", "signed out");
  const next = encodeURIComponent(window.location.pathname);
  ui.note.replaceChildren(
    "Signed out — ",
    el("a", { attrs: { href: `/accounts/login/?next=${next}` }, dataset: { testid: "sign-in-again" }, text: "sign in again" }),
    " to keep following this Session."
  );
  ui.note.classList.add("error");
}

window.addEventListener("online", () => {
  if (!state.ws && !state.stopped) {
    clearTimeout(state.retryTimer);
    state.retryTimer = null;
    connect();
  }
});
