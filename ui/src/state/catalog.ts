// The agent catalog as the page shows it: cards grouped by category, the
// groups in `category_order`, and the team a user picks from them.

import type { AgentInfo } from "../gen/omicos/v1/orchestrator_pb";

/** One category of cards. */
export interface CategoryGroup {
  category: string;
  order: number;
  agents: AgentInfo[];
}

/**
 * Groups agents by category. A category sits at the smallest
 * `category_order` of its agents; ties go by name. Inside a group, agents go
 * by their own `category_order`, then name.
 */
export function groupByCategory(agents: readonly AgentInfo[]): CategoryGroup[] {
  const groups = new Map<string, CategoryGroup>();
  for (const a of agents) {
    const cat = a.category || "other";
    const g = groups.get(cat) ?? { category: cat, order: a.categoryOrder, agents: [] };
    g.order = Math.min(g.order, a.categoryOrder);
    g.agents.push(a);
    groups.set(cat, g);
  }
  const byName = (x: string, y: string) => x.localeCompare(y);
  for (const g of groups.values()) {
    g.agents.sort((x, y) => x.categoryOrder - y.categoryOrder || byName(x.name || x.id, y.name || y.id));
  }
  return [...groups.values()].sort((x, y) => x.order - y.order || byName(x.category, y.category));
}

/** A category id as a heading ("data_analysis" → "Data analysis"). */
export function categoryTitle(category: string): string {
  const t = category.replace(/[_-]+/g, " ").trim();
  return t ? t[0]!.toUpperCase() + t.slice(1) : "Other";
}

/** The team a request carries: the active agent and the picked members. */
export interface TeamChoice {
  /** The active agent; empty: the server's default (the first member). */
  active: string;
  /** Empty: the whole catalog. */
  members: string[];
}

/** Makes `id` the active agent (and a member, when members are picked). Locked agents are refused. */
export function chooseActive(team: TeamChoice, agent: AgentInfo): TeamChoice {
  if (agent.locked) return team;
  const members = team.members.length && !team.members.includes(agent.id) ? [...team.members, agent.id] : team.members;
  return { active: agent.id, members };
}

/** Adds or removes `agent` from the team; the active agent stays a member. */
export function toggleMember(team: TeamChoice, agent: AgentInfo): TeamChoice {
  if (agent.locked) return team;
  if (team.members.includes(agent.id)) {
    const members = team.members.filter((m) => m !== agent.id);
    return { active: team.active === agent.id ? (members[0] ?? "") : team.active, members };
  }
  const members = [...team.members, agent.id];
  if (team.active && !members.includes(team.active)) members.unshift(team.active);
  return { active: team.active || agent.id, members };
}
