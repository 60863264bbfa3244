// The session list: title and last activity; a click reopens the session.
// A search box filters the list as it stands (client side); each session
// can be deleted.

import { useState } from "preact/hooks";
import type { SessionSummary } from "../gen/omicos/v1/orchestrator_pb";

/** "just now", "5 min ago", "3 h ago", or the date. */
export function ago(ms: number, now = Date.now()): string {
  const d = Math.max(0, now - ms);
  if (d < 60_000) return "just now";
  if (d < 3_600_000) return `${Math.floor(d / 60_000)} min ago`;
  if (d < 86_400_000) return `${Math.floor(d / 3_600_000)} h ago`;
  return new Date(ms).toLocaleDateString();
}

/** The sessions whose title, agent or id holds every word of `query` (any case). */
export function filterSessions(sessions: SessionSummary[], query: string): SessionSummary[] {
  const words = query.toLowerCase().split(/\s+/).filter(Boolean);
  if (!words.length) return sessions;
  return sessions.filter((s) => {
    const hay = `${s.title} ${s.agent} ${s.sessionId}`.toLowerCase();
    return words.every((w) => hay.includes(w));
  });
}

export function SessionList(props: {
  sessions: SessionSummary[];
  current: string | null;
  onOpen: (id: string) => void;
  onNew: () => void;
  onDelete: (id: string) => void;
}) {
  const [query, setQuery] = useState("");
  const shown = filterSessions(props.sessions, query);
  return (
    <nav class="sessions" aria-label="Sessions">
      <button type="button" class="primary new-chat" onClick={props.onNew}>
        New chat
      </button>
      <h2 class="side-title">Sessions</h2>
      {props.sessions.length > 0 && (
        <>
          <label for="session-search" class="visually-hidden">
            Search sessions
          </label>
          <input
            id="session-search"
            class="session-search"
            type="search"
            placeholder="Search sessions"
            value={query}
            onInput={(e) => setQuery(e.currentTarget.value)}
          />
        </>
      )}
      {props.sessions.length === 0 ? (
        <p class="muted">None yet.</p>
      ) : shown.length === 0 ? (
        <p class="muted" role="status">
          No session matches “{query}”.
        </p>
      ) : (
        <ul>
          {shown.map((s) => {
            const ms = Number(s.lastActiveMs);
            const title = s.title || "(untitled)";
            return (
              <li key={s.sessionId} class="session-item">
                <a
                  href={`/s/${encodeURIComponent(s.sessionId)}`}
                  aria-current={props.current === s.sessionId ? "page" : undefined}
                  data-testid="session-link"
                  data-session={s.sessionId}
                  onClick={(e) => {
                    e.preventDefault();
                    props.onOpen(s.sessionId);
                  }}
                >
                  <span class="s-title">{title}</span>
                  <time class="muted" dateTime={new Date(ms).toISOString()}>
                    {ago(ms)}
                  </time>
                </a>
                <button
                  type="button"
                  class="delete-session"
                  aria-label={`Delete session ${title}`}
                  title="Delete"
                  onClick={() => {
                    if (confirm(`Delete the session “${title}”? Its conversation is gone for good.`)) props.onDelete(s.sessionId);
                  }}
                >
                  <span aria-hidden="true">✕</span>
                </button>
              </li>
            );
          })}
        </ul>
      )}
    </nav>
  );
}
