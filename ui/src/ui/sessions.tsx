// The session list: title and last activity; a click reopens the session.
// A search box filters the list as it stands (client side); each session
// can be renamed (RenameSession) and deleted.

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

/** The longest title RenameSession takes (characters, after trimming). */
export const MAX_TITLE = 200;

/** Why `title` cannot be a session's title, or null when it can (the server checks the same). */
export function titleProblem(title: string): string | null {
  const t = title.trim();
  if (!t) return "A title cannot be empty.";
  const n = [...t].length;
  if (n > MAX_TITLE) return `A title is at most ${MAX_TITLE} characters; this one has ${n}.`;
  return null;
}

/** The rename box of one session: validated as typed, the server's refusal said in place. */
function RenameForm(props: { session: SessionSummary; onRename: (id: string, title: string) => Promise<string | null>; onDone: () => void }) {
  const s = props.session;
  const [title, setTitle] = useState(s.title);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const id = `rename-${s.sessionId}`;
  const submit = async (e: Event) => {
    e.preventDefault();
    const problem = titleProblem(title);
    if (problem) return setError(problem);
    setBusy(true);
    const refused = await props.onRename(s.sessionId, title.trim());
    setBusy(false);
    if (refused) setError(refused);
    else props.onDone();
  };
  return (
    <form class="rename-form" onSubmit={submit} data-testid="rename-form">
      <label for={id} class="visually-hidden">
        New title for {s.title || "(untitled)"}
      </label>
      <input
        id={id}
        value={title}
        aria-invalid={error ? true : undefined}
        aria-describedby={error ? `${id}-error` : undefined}
        onInput={(e) => {
          setTitle(e.currentTarget.value);
          setError(null);
        }}
        onKeyDown={(e) => {
          if (e.key === "Escape") props.onDone();
        }}
        ref={(el) => el?.focus()}
      />
      {error && (
        <p class="rename-error" id={`${id}-error`} role="alert" data-testid="rename-error">
          {error}
        </p>
      )}
      <div class="row">
        <button type="submit" class="primary" disabled={busy}>
          Save title
        </button>
        <button type="button" onClick={props.onDone}>
          Keep title
        </button>
      </div>
    </form>
  );
}

export function SessionList(props: {
  sessions: SessionSummary[];
  current: string | null;
  onOpen: (id: string) => void;
  onNew: () => void;
  onDelete: (id: string) => void;
  /** Resolves to the server's refusal in words, or null once renamed. */
  onRename: (id: string, title: string) => Promise<string | null>;
}) {
  const [query, setQuery] = useState("");
  const [renaming, setRenaming] = useState<string | null>(null);
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
            if (renaming === s.sessionId) {
              return (
                <li key={s.sessionId}>
                  <RenameForm session={s} onRename={props.onRename} onDone={() => setRenaming(null)} />
                </li>
              );
            }
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
                  aria-label={`Rename session ${title}`}
                  title="Rename"
                  data-testid="rename-session"
                  onClick={() => setRenaming(s.sessionId)}
                >
                  <span aria-hidden="true">✎</span>
                </button>
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
