/* The plan panel: the agent's plan as the last `plan.updated` said it.
 */
import { $, el, statusLabel, ui } from "./ctx.js";

// --- plan -----------------------------------------------------------------------------------

export const TASK_ICONS = { pending: "○", in_progress: "◔", done: "✓", skipped: "–" };

export function renderPlan(plan) {
  const tasks = (plan && plan.tasks) || [];
  ui.planEmpty.hidden = Boolean(plan);
  ui.planTitle.hidden = !plan;
  ui.planTitle.textContent = plan ? plan.title : "";
  ui.planTasks.replaceChildren(
    ...tasks.map((task) =>
      el(
        "li",
        { className: "plan-task", dataset: { testid: "plan-task", status: task.status, taskId: task.id } },
        el("span", { className: "task-icon", attrs: { "aria-hidden": "true" }, text: TASK_ICONS[task.status] || "•" }),
        el("span", { className: "task-title", text: task.title }),
        el("span", { className: "visually-hidden", text: ` (${statusLabel(task.status)})` })
      )
    )
  );
  const done = tasks.filter((t) => t.status === "done" || t.status === "skipped").length;
  ui.planProgress.textContent = tasks.length ? `${done} / ${tasks.length} done` : "";
}
