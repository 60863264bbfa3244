// The session list: title and last activity; a click reopens the session.

import type { SessionSummary } from "../gen/omicos/v1/orchestrator_pb";

/** "just now", "5 min ago", "3 h ago", or the date. */
export function ago(ms: number, now = Date.now()): string {
  const d = Math.max(0, now - ms);
  if (d < 60_000) return "just now";
  if (d < 3_600_000) return `${Math.floor(d / 60_000)} min ago`;
  if (d < 86_400_000) return `${Math.floor(d / 3_600_000)} h ago`;
  return new Date(ms).toLocaleDateString();
}

export function SessionList(props: {
  sessions: SessionSummary[];
  current: string | null;
  onOpen: (id: string) => void;
  onNew: () => void;
}) {
  return (
    <nav class="sessions" aria-label="Sessions">
      <button type="button" class="primary new-chat" onClick={props.onNew}>
        New chat
      </button>
      <h2 class="side-title">Sessions</h2>
      {props.sessions.length === 0 ? (
        <p class="muted">None yet.</p>
      ) : (
        <ul>
          {props.sessions.map((s) => {
            const ms = Number(s.lastActiveMs);
            return (
              <li key={s.sessionId}>
                <a
                  href={`/s/${encodeURIComponent(s.sessionId)}`}
                  aria-current={props.current === s.sessionId ? "page" : undefined}
                  data-testid="session-link"
                  onClick={(e) => {
                    e.preventDefault();
                    props.onOpen(s.sessionId);
                  }}
                >
                  <span class="s-title">{s.title || "(untitled)"}</span>
                  <time class="muted" dateTime={new Date(ms).toISOString()}>
                    {ago(ms)}
                  </time>
                </a>
              </li>
            );
          })}
        </ul>
      )}
    </nav>
  );
}
