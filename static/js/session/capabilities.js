/* The capabilities card: Skills, tool sets and tools attached beyond the defaults, each with
 * who attached it and when.
 */
import { $, apiAll, boot, el, names, state, ui } from "./ctx.js";

// --- capabilities card ------------------------------------------------------------------------

export const DEFAULT_TOOLS = new Set(names(boot.defaultTools));
export const CAPABILITY_GROUPS = [
  ["skills", "Skills"],
  ["toolsets", "Tool sets"],
  ["tools", "Extra tools"],
];

export const FRESH_MS = 2000; // how long a capability just added stays highlighted (app.css `flash`)
export const freshCapabilities = new Set(); // "kind\0name" added live in the last FRESH_MS

/** Merge attached capabilities (the session's list or an event's additions): add-only.
 * Returns whether anything was new. */
export function addCapabilities(data, fresh = false) {
  const added = [];
  for (const [key] of CAPABILITY_GROUPS) {
    for (const name of names(data && data[key])) {
      if (key === "tools" && DEFAULT_TOOLS.has(name)) continue;
      if (state.capabilities[key].includes(name)) continue;
      state.capabilities[key].push(name);
      added.push(`${key}\u0000${name}`);
    }
  }
  if (fresh) {
    // A re-render soon after (the sources' re-read) keeps the highlight.
    for (const key of added) freshCapabilities.add(key);
    if (added.length) window.setTimeout(() => added.forEach((key) => freshCapabilities.delete(key)), FRESH_MS);
  }
  if (added.length) renderCapabilities();
  return added.length > 0;
}

export const SOURCE_KINDS = { skill: "skills", toolset: "toolsets", tool: "tools" };

/** Where each capability came from (`capability_sources` of the Session detail). */
export function applySources(rows) {
  const sources = new Map();
  const attached = { skills: [], toolsets: [], tools: [] };
  for (const row of rows) {
    const key = SOURCE_KINDS[row && row.kind];
    if (!key || !row.name) continue;
    sources.set(`${key}\u0000${row.name}`, { by: String(row.added_by || ""), at: row.added_at || "", servers: names(row.servers) });
    attached[key].push(String(row.name));
  }
  state.sources = sources;
  if (!addCapabilities(attached)) renderCapabilities();
}

/** "default", "chosen by orchestration", "loaded by the agent" or "added by alice". */
export function sourceLabel(by) {
  if (by === "default") return "default";
  if (by === "orchestrator") return "chosen by orchestration";
  if (by === "model") return "loaded by the agent";
  return by ? `added by ${by}` : "";
}

export function sourceKind(by) {
  return ["default", "orchestrator", "model"].includes(by) ? by : "person";
}

export function capabilitySource(key, name) {
  const source = state.sources.get(`${key}\u0000${name}`);
  if (!source) return null;
  const parts = [];
  const label = sourceLabel(source.by);
  if (label) {
    parts.push(
      el("span", {
        className: "capability-source",
        dataset: { testid: "capability-source", source: sourceKind(source.by) },
        attrs: { title: source.at ? `Added ${new Date(source.at).toLocaleString()}` : null },
        text: label,
      })
    );
  }
  if (source.servers.length) {
    parts.push(
      el("span", {
        className: "capability-servers muted",
        dataset: { testid: "capability-servers" },
        attrs: { title: "The MCP server these tools come from" },
        text: `MCP ${source.servers.length === 1 ? "server" : "servers"} ${source.servers.join(", ")}`,
      })
    );
  }
  return parts.length ? el("span", { className: "capability-meta" }, parts) : null;
}

export function renderCapabilities() {
  const fresh = freshCapabilities;
  const groups = [];
  let total = 0;
  for (const [key, heading] of CAPABILITY_GROUPS) {
    const list = state.capabilities[key];
    if (!list.length) continue;
    total += list.length;
    groups.push(
      el(
        "div",
        { className: "capability-group", dataset: { kind: key } },
        el("h3", { text: heading }),
        el(
          "ul",
          { className: "capability-list", dataset: { testid: `capability-${key}` } },
          ...list.map((name) => {
            const description = key === "skills" && state.skillDescriptions ? state.skillDescriptions.get(name) : "";
            return el(
              "li",
              {
                className: "capability",
                dataset: { testid: "capability", kind: key, name, fresh: fresh.has(`${key}\u0000${name}`) ? "true" : null },
              },
              el("span", { className: "capability-line" }, el("code", { className: "capability-name", text: name }), capabilitySource(key, name)),
              description ? el("span", { className: "capability-description muted", dataset: { testid: "capability-description" }, text: description }) : null
            );
          })
        )
      )
    );
  }
  ui.capabilityGroups.replaceChildren(...groups);
  ui.capabilitiesEmpty.hidden = total > 0;
  ui.capabilitiesCount.textContent = total ? `${total} loaded` : "";
  if (state.capabilities.skills.length && !state.skillDescriptions) loadSkillDescriptions();
}

export let skillsRead = null;
export function loadSkillDescriptions() {
  if (skillsRead) return;
  skillsRead = apiAll("/api/v1/skills/?page_size=200")
    .then((skills) => {
      state.skillDescriptions = new Map(skills.map((skill) => [String(skill.name), String(skill.description || "")]));
      renderCapabilities();
    })
    .catch(() => {}); // the names alone say enough
}
