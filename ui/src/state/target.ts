// Whom the next message goes to. A session keeps the agent and team it was
// started with: reopening it sends the next message there, not to whatever
// agent was picked last for a new chat. A pick made in a session (the
// composer's agent list, a card) holds for that session only.

import type { SessionSummary } from "../gen/omicos/v1/orchestrator_pb";
import type { TeamChoice } from "./catalog";
import type { Conversation } from "./conversation";

/** The agent and team a turn is sent with. */
export interface Target {
  agent: string;
  team: string[];
}

/** The session's own agent and team: its latest turn's, else what the session list says. */
export function sessionTarget(conv: Conversation, summary: SessionSummary | undefined): Target | null {
  for (let i = conv.turns.length - 1; i >= 0; i--) {
    const t = conv.turns[i]!;
    if (t.agent) return { agent: t.agent, team: [...t.team] };
  }
  if (summary?.agent) return { agent: summary.agent, team: [...summary.teamMembers] };
  return null;
}

/**
 * The target of the next message: in an open session, the pick made in it
 * or else the session's own agent; in a new chat, the global pick.
 */
export function composerTarget(
  sessionId: string | null,
  conv: Conversation,
  summary: SessionSummary | undefined,
  picks: Record<string, string>,
  global: TeamChoice,
): Target {
  if (!sessionId) return { agent: global.active, team: [...global.members] };
  const own = sessionTarget(conv, summary) ?? { agent: global.active, team: [...global.members] };
  const picked = picks[sessionId];
  if (!picked || picked === own.agent) return own;
  // A team that does not hold the picked agent would refuse it: add it.
  const team = own.team.length && !own.team.includes(picked) ? [...own.team, picked] : own.team;
  return { agent: picked, team };
}
