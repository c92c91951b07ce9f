/* The goals panel: the session goal and the phase goal, each edited in place by a person (PATCH
 * `{field: value}`). An open editor is never overwritten; it says the goal changed meanwhile.
 */
import { $, ApiError, USERNAME, api, boot, excerpt } from "./ctx.js";
import { applySession } from "./header.js";

// --- goals panel ----------------------------------------------------------------------------

/**
 * The session goal and the phase goal, each edited in place by a person (PATCH `{field: value}`).
 * What is shown follows the owner: the PATCH answer, `goals.updated` and `task.understood`
 * events (another tab's or colleague's edit, the outer loop's transition) and re-reads. An open
 * editor is never overwritten: it says that the goal changed meanwhile instead.
 */
export const GOAL_FIELDS = ["session_goal", "phase_goal"];
export const GOAL_NAMES = { session_goal: "session goal", phase_goal: "phase goal" };
export const goalUi = {};
for (const field of GOAL_FIELDS) {
  const root = document.querySelector(`.goal[data-field=${field}]`);
  if (!root) continue;
  goalUi[field] = {
    root,
    value: root.querySelector(".goal-value"),
    edit: root.querySelector(".goal-edit"),
    form: root.querySelector(".goal-editor"),
    input: root.querySelector(".goal-input"),
    conflict: root.querySelector(".goal-conflict"),
    error: root.querySelector(".goal-error"),
    save: root.querySelector("[data-testid=goal-save]"),
    cancel: root.querySelector("[data-testid=goal-cancel]"),
    editingFrom: null, // the value when the editor opened; null while closed
  };
}

export function showGoal(field, value, by) {
  const goal = goalUi[field];
  if (!goal) return;
  const text = typeof value === "string" ? value : "";
  goal.root.dataset.empty = text.trim() ? "false" : "true";
  goal.value.textContent = text.trim() ? text : "not set yet";
  if (goal.editingFrom !== null && text !== goal.editingFrom && text !== goal.input.value) {
    const who = by ? (by === USERNAME ? "by you (in another tab)" : `by ${by}`) : "";
    goal.conflict.textContent = `This goal changed meanwhile${who ? " " + who : ""}: “${excerpt(text, 120) || "not set"}”. Saving replaces it.`;
    goal.conflict.hidden = false;
  }
}

export function showGoals(data, by) {
  for (const field of GOAL_FIELDS) {
    if (data && typeof data[field] === "string") showGoal(field, data[field], by);
  }
}

export function setGoalError(goal, text) {
  goal.error.textContent = text || "";
  goal.error.hidden = !text;
  if (text) goal.input.setAttribute("aria-invalid", "true");
  else goal.input.removeAttribute("aria-invalid");
}

export function openGoalEditor(field) {
  const goal = goalUi[field];
  const current = goal.root.dataset.empty === "true" ? "" : goal.value.textContent;
  goal.editingFrom = current;
  goal.input.value = current;
  goal.conflict.hidden = true;
  setGoalError(goal, "");
  goal.root.dataset.editing = "true";
  goal.form.hidden = false;
  goal.value.hidden = true;
  goal.edit.hidden = true;
  goal.input.focus();
  goal.input.setSelectionRange(goal.input.value.length, goal.input.value.length);
}

export function closeGoalEditor(field) {
  const goal = goalUi[field];
  goal.editingFrom = null;
  goal.root.dataset.editing = "false";
  goal.form.hidden = true;
  goal.value.hidden = false;
  goal.edit.hidden = false;
  goal.conflict.hidden = true;
  setGoalError(goal, "");
  goal.edit.focus();
}

export async function saveGoal(field) {
  const goal = goalUi[field];
  if (goal.form.dataset.busy === "true") return;
  goal.form.dataset.busy = "true";
  goal.save.disabled = goal.cancel.disabled = true;
  goal.save.textContent = "Saving…";
  try {
    const session = await api(boot.api, { method: "PATCH", body: { [field]: goal.input.value } });
    closeGoalEditor(field);
    applySession(session);
  } catch (exc) {
    const detail = exc instanceof ApiError ? describeGoalError(exc, field, goal.input.value.length) : String(exc);
    setGoalError(goal, `Not saved: ${detail}`);
    goal.input.focus();
  } finally {
    goal.form.dataset.busy = "false";
    goal.save.disabled = goal.cancel.disabled = false;
    goal.save.textContent = "Save";
  }
}

/** The field's own problem in words ("Ensure the phase goal has no more than 10000 characters."). */
export function describeGoalError(exc, field, length) {
  const problems = exc.details && exc.details[field];
  if (!problems) return exc.describe();
  const said = [].concat(problems).join(" ").replace(/\bthis field\b/gi, `the ${GOAL_NAMES[field]}`);
  const tooLong = /no more than/.test(said) ? ` It has ${length}.` : "";
  return `${said.charAt(0).toUpperCase()}${said.slice(1)}${tooLong}`;
}

for (const [field, goal] of Object.entries(goalUi)) {
  goal.edit.addEventListener("click", () => openGoalEditor(field));
  goal.cancel.addEventListener("click", () => closeGoalEditor(field));
  goal.form.addEventListener("submit", (event) => {
    event.preventDefault();
    saveGoal(field);
  });
  goal.input.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      event.preventDefault();
      closeGoalEditor(field);
    } else if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      saveGoal(field);
    }
  });
}
