// The agent catalog as cards, grouped by category in category_order.

import type { AgentInfo } from "../gen/omicos/v1/orchestrator_pb";
import { categoryTitle, groupByCategory, type TeamChoice } from "../state/catalog";

export function AgentCards(props: {
  agents: AgentInfo[];
  tier: string;
  team: TeamChoice;
  /** The server refused the page (sign-in): the catalog is not to blame. */
  blocked: boolean;
  nameOf: (id: string) => string;
  onActive: (a: AgentInfo) => void;
  onToggle: (a: AgentInfo) => void;
  onPrompt: (a: AgentInfo, prompt: string) => void;
}) {
  const groups = groupByCategory(props.agents);
  if (!props.agents.length) {
    return (
      <p class="muted">
        {props.blocked ? "The agents appear once the page is signed in." : "No agents yet: the catalog is empty or the orchestrator has not answered."}
      </p>
    );
  }
  const members = props.team.members;
  const n = props.nameOf;
  return (
    <div class="cards">
      <p class="muted team-line" role="status">
        {members.length
          ? `Team: ${members.map(n).join(", ")}. Active: ${n(props.team.active || members[0]!)}.`
          : props.team.active
            ? `Active: ${n(props.team.active)}; the team is the whole catalog.`
            : "Team: the whole catalog; the first agent answers."}
      </p>
      {groups.map((g) => (
        <section class="category" aria-labelledby={`cat-${g.category}`} key={g.category}>
          <h3 id={`cat-${g.category}`}>{categoryTitle(g.category)}</h3>
          <ul class="card-list">
            {g.agents.map((a) => (
              <li key={a.id}>
                <Card
                  agent={a}
                  tier={props.tier}
                  active={props.team.active === a.id}
                  member={members.includes(a.id)}
                  onActive={() => props.onActive(a)}
                  onToggle={() => props.onToggle(a)}
                  onPrompt={(p) => props.onPrompt(a, p)}
                />
              </li>
            ))}
          </ul>
        </section>
      ))}
    </div>
  );
}

function Card(props: {
  agent: AgentInfo;
  tier: string;
  active: boolean;
  member: boolean;
  onActive: () => void;
  onToggle: () => void;
  onPrompt: (p: string) => void;
}) {
  const a = props.agent;
  const hid = `agent-${a.id}`;
  return (
    <article
      class={`card${props.active ? " active" : ""}${a.locked ? " locked" : ""}`}
      aria-labelledby={hid}
      data-testid="agent-card"
      data-agent={a.id}
    >
      <h4 id={hid}>
        <span class="icon" aria-hidden="true">
          {a.icon || "🤖"}
        </span>{" "}
        {a.name || a.id}
        {a.locked && (
          <span class="badge lock">
            <span aria-hidden="true">🔒 </span>Locked: needs the {a.tier} tier
            {props.tier ? ` (this deployment: ${props.tier})` : ""}
          </span>
        )}
      </h4>
      {a.summary && <p class="summary">{a.summary}</p>}
      {a.useWhen && (
        <p class="use-when">
          <span class="label">Use when: </span>
          {a.useWhen}
        </p>
      )}
      {a.examplePrompts.length > 0 && (
        <div class="prompts" role="group" aria-label={`Example prompts for ${a.name || a.id}`}>
          {a.examplePrompts.map((p) => (
            <button type="button" class="prompt" disabled={a.locked} onClick={() => props.onPrompt(p)} key={p}>
              {p}
            </button>
          ))}
        </div>
      )}
      <div class="card-actions">
        <button type="button" aria-pressed={props.active} disabled={a.locked} onClick={props.onActive}>
          {props.active ? "Active" : `Talk to ${a.name || a.id}`}
        </button>
        <label class="check">
          <input type="checkbox" checked={props.member} disabled={a.locked} onChange={props.onToggle} /> In team
        </label>
      </div>
    </article>
  );
}
