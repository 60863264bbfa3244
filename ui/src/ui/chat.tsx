// The conversation: turns, nested frames per execution context, streaming
// markdown, tool-call cards with output, progress bars, images and spools.

import { createContext } from "preact";
import { useContext, useEffect, useState } from "preact/hooks";
import { TurnDoneReason, type ValueRef } from "../gen/omicos/v1/orchestrator_pb";
import { Decision } from "../gen/omicos/v1/common_pb";
import type { Bar, Conversation, FrameView, Item, ToolCallView, TurnView } from "../state/conversation";
import { fileUrl, outputFiles } from "../state/outputs";
import { renderMarkdown } from "../markdown";
import { barText, doneText, formatDuration } from "../state/status-text";
import { copyText } from "./copy";
import type { CarriedMessage } from "../state/carried";
import { joinAttachments, splitAttachments } from "../state/attachments";
import { SentFiles } from "./attach";
import { WholeValueOffer } from "./whole";

/**
 * What a person can do to past turns. Each resolves once the server has
 * answered (the page shows a refusal in its notice); `blocked` says why they
 * are offered disabled (a turn runs: the server refuses rewind and fork then).
 */
export interface TurnActions {
  /** Rewinds to this turn and starts it again with `message`. */
  editResend: (turnId: string, message: string) => Promise<boolean>;
  /** Rewinds the last turn and asks its message again. */
  regenerate: () => Promise<void>;
  /** A new session holding the history up to and including this turn. */
  fork: (turnId: string) => Promise<void>;
  blocked: string | null;
}

/** What every block of the log reads besides the conversation. */
interface LogContext {
  nameOf: (id: string) => string;
  /** The server is out of reach: a live turn cannot be followed. */
  lost: boolean;
  cancelledHere: string[];
  actions: TurnActions | null;
  /** Reads a value an event carries cut, whole (Orchestrator/ReadValue). */
  readValue: ((sessionId: string, value: ValueRef) => Promise<Blob>) | null;
}
const Log = createContext<LogContext>({ nameOf: (id) => id, lost: false, cancelledHere: [], actions: null, readValue: null });

export function ChatLog(props: {
  conv: Conversation;
  nameOf: (id: string) => string;
  lost: boolean;
  cancelledHere: string[];
  actions?: TurnActions;
  /** Reads a cut value whole; without it the page offers no download. */
  readValue?: (sessionId: string, value: ValueRef) => Promise<Blob>;
  /** History the session holds from before its log (a fork's parent), oldest first. */
  carried?: CarriedMessage[];
}) {
  const c = props.conv;
  const last = c.turns[c.turns.length - 1]?.id;
  const rewound = c.rewinds.reduce((n, r) => n + r.turns, 0);
  const restored = [...new Set(c.rewinds.flatMap((r) => r.filesRestored))];
  const notRestored = [...new Set(c.rewinds.flatMap((r) => r.filesNotRestored))];
  return (
    <Log.Provider
      value={{
        nameOf: props.nameOf,
        lost: props.lost,
        cancelledHere: props.cancelledHere,
        actions: props.actions ?? null,
        readValue: props.readValue ?? null,
      }}
    >
    {rewound > 0 && (
      <p class="muted rewound-note" data-testid="rewound-note">
        {rewound} earlier turn{rewound > 1 ? "s were" : " was"} rewound: the model no longer sees {rewound > 1 ? "them" : "it"}.
        {restored.length > 0 && ` Files put back as they were: ${restored.join(", ")}.`}
        {notRestored.length > 0 && ` Left as they are (too large to have been kept): ${notRestored.join(", ")}.`}
      </p>
    )}
    {props.carried && props.carried.length > 0 && (
      <section class="carried" aria-labelledby="carried-title" data-testid="carried">
        <h2 id="carried-title" class="carried-title muted">
          Carried over from the session this one was forked from
        </h2>
        {props.carried.map((m, i) =>
          m.role === "user" ? (
            <div class="msg user" data-testid="carried-user" key={i}>
              <div class="who">You</div>
              <UserText message={m.text} />
            </div>
          ) : (
            <div class="msg agent md" data-testid="carried-answer" key={i} dangerouslySetInnerHTML={{ __html: renderMarkdown(m.text) }} />
          ),
        )}
      </section>
    )}
    <ol class="turns" aria-label="Conversation">
      {c.turns.map((t) => (
        <TurnBlock turn={t} conv={c} key={t.id} last={t.id === last} />
      ))}
      {c.looseErrors.map((e, i) => (
        <li key={`loose${i}`}>
          <ErrorBlock kind={e.kind} message={e.message} />
        </li>
      ))}
    </ol>
    </Log.Provider>
  );
}

/** The answer's text (markdown as the model wrote it): the root frame's texts. */
function answerText(t: TurnView, conv: Conversation): string {
  const f = conv.frames[t.rootFrame];
  return f ? f.items.flatMap((it) => (it.t === "text" ? [it.text.trim()] : [])).join("\n\n") : "";
}

/** A button that copies `text()` and says so for a moment. */
export function CopyButton(props: { text: () => string; label: string; testid?: string }) {
  const [done, setDone] = useState<boolean | null>(null);
  return (
    <button
      type="button"
      class="copy"
      data-testid={props.testid}
      onClick={async () => {
        setDone(await copyText(props.text()));
        setTimeout(() => setDone(null), 2000);
      }}
    >
      {done === null ? props.label : done ? "Copied" : "Copy failed"}
    </button>
  );
}

/** What a person sent: the text they typed, then the files the message named (the server's attachment line). */
function UserText(props: { message: string }) {
  const m = splitAttachments(props.message);
  return (
    <>
      {m.text && <div class="user-text">{m.text}</div>}
      <SentFiles files={m.files} />
    </>
  );
}

/** The user's message: shown, or (Edit) an editable box whose Send rewinds to this turn and asks again. */
function UserMessage(props: { turn: TurnView }) {
  const t = props.turn;
  const ctx = useContext(Log);
  const [editing, setEditing] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const a = ctx.actions;
  const boxId = `edit-${t.id}`;
  const split = splitAttachments(t.message);
  if (editing !== null && a) {
    const submit = async (e: Event) => {
      e.preventDefault();
      if (!editing.trim() || busy || a.blocked) return;
      setBusy(true);
      // The files stay attached: the model reads the same line again.
      const ok = await a.editResend(t.id, joinAttachments(editing.trim(), split.line));
      setBusy(false);
      if (ok) setEditing(null);
    };
    return (
      <form class="msg user editing" data-testid="edit-form" onSubmit={submit}>
        <label for={boxId} class="who">
          Edit your message (the turns from here on are rewound)
        </label>
        <textarea
          id={boxId}
          rows={3}
          value={editing}
          data-testid="edit-box"
          onInput={(e) => setEditing(e.currentTarget.value)}
          onKeyDown={(e) => {
            if (e.key === "Escape") setEditing(null);
          }}
        />
        <SentFiles files={split.files} />
        <div class="edit-actions">
          <button type="submit" class="primary" disabled={!editing.trim() || busy || !!a.blocked} title={a.blocked ?? undefined}>
            Rewind and ask again
          </button>
          <button type="button" onClick={() => setEditing(null)}>
            Discard edit
          </button>
        </div>
      </form>
    );
  }
  return (
    <div class="msg user" data-testid="user-message">
      <div class="who">You{t.agent ? ` → ${ctx.nameOf(t.agent)}` : ""}</div>
      <UserText message={t.message} />
      {a && (
        <div class="msg-actions">
          <button type="button" class="link-button" data-testid="edit-message" disabled={!!a.blocked} title={a.blocked ?? undefined} aria-label={`Edit this message: ${clip(split.text || t.message)}`} onClick={() => setEditing(split.text)}>
            Edit
          </button>
          <button type="button" class="link-button" data-testid="fork-turn" disabled={!!a.blocked} title={a.blocked ?? undefined} aria-label={`Fork from here: ${clip(split.text || t.message)}`} onClick={() => void a.fork(t.id)}>
            Fork from here
          </button>
        </div>
      )}
    </div>
  );
}

/** The first words of a message, for a button's accessible name. */
function clip(s: string): string {
  return s.length > 40 ? `${s.slice(0, 40)}…` : s;
}

function TurnBlock(props: { turn: TurnView; conv: Conversation; last: boolean }) {
  const t = props.turn;
  const ctx = useContext(Log);
  const live = t.done === null;
  const cancelled = t.done === TurnDoneReason.CANCELLED && ctx.cancelledHere.includes(t.id);
  const hasAnswer = !live && answerText(t, props.conv) !== "";
  const a = ctx.actions;
  return (
    <li class="turn" data-testid="turn" aria-busy={live}>
      {t.message && <UserMessage turn={t} />}
      <FrameBlock frameKey={t.rootFrame} conv={props.conv} live={live} />
      <div class="turn-foot muted">
        {live ? (
          ctx.lost ? (
            <span class="lost" data-testid="turn-lost">
              Connection lost, reconnecting… The turn goes on at the server.
            </span>
          ) : (
            <span class="working">Working…</span>
          )
        ) : t.done !== TurnDoneReason.COMPLETED && t.done !== TurnDoneReason.UNSPECIFIED ? (
          <span class={cancelled ? "cancelled" : "stopped"} data-testid="turn-done">
            {doneText(t.done!, t.doneDetail, cancelled)}
          </span>
        ) : null}
        {hasAnswer && <CopyButton text={() => answerText(t, props.conv)} label="Copy answer" testid="copy-answer" />}
        {a && props.last && !live && t.message && (
          <button type="button" class="copy" data-testid="regenerate" disabled={!!a.blocked} title={a.blocked ?? undefined} onClick={() => void a.regenerate()}>
            Regenerate
          </button>
        )}
        {t.usage && (
          <span class="usage">
            {" "}
            {t.usage.input} in / {t.usage.output} out tokens{t.usage.model ? ` · ${t.usage.model}` : ""}
          </span>
        )}
      </div>
    </li>
  );
}

function FrameBlock(props: { frameKey: string; conv: Conversation; live: boolean }) {
  const f: FrameView | undefined = props.conv.frames[props.frameKey];
  if (!f) return null;
  const body = (
    <div class="frame-body">
      {f.items.map((it, i) => (
        <ItemBlock item={it} conv={props.conv} live={props.live && i === f.items.length - 1} key={itemKey(it)} />
      ))}
    </div>
  );
  const { nameOf } = useContext(Log);
  if (f.depth === 0) return <div class="frame root">{body}</div>;
  return (
    <section class={`frame nested depth-${Math.min(f.depth, 4)}`} aria-label={`Sub-turn of ${nameOf(f.agentId)} (${f.contextId})`} data-testid="frame">
      <div class="frame-head">
        <span aria-hidden="true">↳ </span>
        {nameOf(f.agentId)}
      </div>
      {body}
    </section>
  );
}

function itemKey(it: Item): string {
  switch (it.t) {
    case "call":
      return `c:${it.callId}`;
    case "frame":
      return `f:${it.key}`;
    default:
      return it.id;
  }
}

function ItemBlock(props: { item: Item; conv: Conversation; live: boolean }) {
  const it = props.item;
  const { nameOf } = useContext(Log);
  switch (it.t) {
    case "text":
      return <Markdown text={it.text} streaming={props.live} />;
    case "call": {
      const call = props.conv.calls[it.callId];
      return call ? <ToolCard call={call} conv={props.conv} /> : null;
    }
    case "frame":
      return <FrameBlock frameKey={it.key} conv={props.conv} live={props.live} />;
    case "error":
      return <ErrorBlock kind={it.kind} message={it.message} />;
    case "steer":
      return (
        <div class="msg user steer" data-testid="steer">
          <div class="who">You, while it worked</div>
          <UserText message={it.message} />
        </div>
      );
    case "moved":
      return (
        <p class="moved muted" data-testid="turn-moved" title={it.reason}>
          <span aria-hidden="true">↻ </span>
          Continued on another server{it.lostCalls.length ? ` (${it.lostCalls.length} call${it.lostCalls.length > 1 ? "s" : ""} lost with the first one)` : ""}
        </p>
      );
    case "switch":
      return (
        <p class="switch muted">
          <span aria-hidden="true">⇄ </span>
          {it.reason === "return" ? `${nameOf(it.from)} handed back to ${nameOf(it.to)}` : `${nameOf(it.from)} asked ${nameOf(it.to)}`}
        </p>
      );
  }
}

function Markdown(props: { text: string; streaming: boolean }) {
  return (
    <div
      class={`msg agent md${props.streaming ? " streaming" : ""}`}
      data-testid="agent-text"
      onClick={(e) => {
        // The copy buttons markdown.ts puts on code blocks.
        const b = (e.target as Element).closest?.("button.copy-code");
        const code = b?.parentElement?.querySelector("pre");
        if (!b || !code) return;
        void copyText(code.textContent ?? "").then((ok) => {
          b.textContent = ok ? "Copied" : "Copy failed";
          setTimeout(() => (b.textContent = "Copy"), 2000);
        });
      }}
      dangerouslySetInnerHTML={{ __html: renderMarkdown(props.text) }}
    />
  );
}

function ErrorBlock(props: { kind: string; message: string }) {
  return (
    <div class="error-event" data-testid="error-event">
      <strong>Error {props.kind}</strong>
      <pre>{props.message}</pre>
    </div>
  );
}

function useNow(active: boolean, ms = 1000): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    if (!active) return;
    const t = setInterval(() => setNow(Date.now()), ms);
    return () => clearInterval(t);
  }, [active, ms]);
  return now;
}


const STATUS_TEXT: Record<ToolCallView["status"], string> = {
  running: "running",
  awaiting_approval: "waiting for approval",
  done: "done",
  error: "error",
  denied: "denied",
  cancelled: "cancelled",
};

const DECISION_TEXT: Record<number, string> = {
  [Decision.ALLOW_ONCE]: "allowed once",
  [Decision.ALLOW_SESSION]: "allowed for the session",
  [Decision.DENY]: "denied",
};

function prettyArgs(args: string): string {
  try {
    return JSON.stringify(JSON.parse(args), null, 2);
  } catch {
    return args;
  }
}

function ToolCard(props: { call: ToolCallView; conv: Conversation }) {
  const c = props.call;
  const running = c.status === "running" || c.status === "awaiting_approval";
  const now = useNow(running);
  const elapsed = c.elapsedMs ?? (running ? now - c.startedMs : (c.finishedMs ?? now) - c.startedMs);
  const { nameOf } = useContext(Log);
  const called = c.name === "call_agent" ? agentOf(c.arguments) : null;
  const title = called ? nameOf(called) : null;
  const failed = c.status === "error" || c.status === "denied" || c.status === "cancelled";
  return (
    <section class={`tool status-${c.status}`} aria-label={`${c.name}${title ? ` → ${title}` : ""}, call ${c.callId}`} data-testid="tool-card" data-call={c.callId} data-status={c.status}>
      <header class="tool-head">
        <span class="tool-name">{c.name}</span>
        {title && <span class="muted"> → {title}</span>}
        <span class={`pill ${c.status}`} data-testid="tool-status">
          {STATUS_TEXT[c.status]}
        </span>
        <span class="muted elapsed" data-testid="tool-elapsed">
          {formatDuration(elapsed)}
        </span>
      </header>
      {c.approval && (
        <p class="muted approval-note">
          {DECISION_TEXT[c.approval.decision] ?? "decided"}
          {c.approval.source && c.approval.source !== "client" ? ` (${c.approval.source})` : ""}
        </p>
      )}
      <details class="args">
        <summary>Arguments</summary>
        <pre tabindex={0}>{prettyArgs(c.arguments)}</pre>
        {c.argumentsCut && <WholeValue sessionId={props.conv.sessionId} value={c.argumentsCut} name={`${c.callId}-arguments.json`} />}
      </details>
      {failed && (
        <div class="reason" data-testid="tool-reason">
          <strong>Why: </strong>
          <pre tabindex={0}>
            {c.result ||
              (c.status === "cancelled"
                ? "The turn was cancelled while this call ran."
                : c.status === "denied"
                  ? "Denied."
                  : "The turn ended before this call finished.")}
          </pre>
        </div>
      )}
      {c.bars.map((b) => (
        <ProgressBar bar={b} running={running} key={b.id} />
      ))}
      {c.output.length > 0 && (
        <pre class="output" tabindex={0} aria-label="Live output" data-testid="tool-output">
          {c.output.map((o, i) => (
            <span class={o.stream === "stderr" ? "stderr" : "stdout"} key={i}>
              {o.text}
            </span>
          ))}
        </pre>
      )}
      {c.childFrame && <FrameBlock frameKey={c.childFrame} conv={props.conv} live={running} />}
      <Images call={c} />
      {c.result !== null && !failed && (
        <details class="result">
          <summary>Result{c.spoolPath ? " (preview)" : ""}</summary>
          <pre tabindex={0}>{c.result}</pre>
        </details>
      )}
      {c.spoolPath && <Spool path={c.spoolPath} />}
    </section>
  );
}

/** A cut value of this log's session, offered whole. */
function WholeValue(props: { sessionId: string; value: ValueRef; name: string }) {
  const { readValue } = useContext(Log);
  return <WholeValueOffer {...props} readValue={readValue} />;
}

function agentOf(args: string): string | null {
  try {
    const v = JSON.parse(args) as { agent_name?: unknown };
    return typeof v.agent_name === "string" ? v.agent_name : null;
  } catch {
    return null;
  }
}

function ProgressBar(props: { bar: Bar; running: boolean }) {
  const b = props.bar;
  const pct = Math.round(b.percent);
  const label = b.label || "Progress";
  return (
    <div class="bar" data-testid="progress" data-percent={pct}>
      <div class="bar-text">
        <span>{label}</span>
        <span data-testid="progress-text">{barText(b, props.running)}</span>
      </div>
      <progress max={100} value={b.percent} aria-label={`${label}: ${pct}%`} />
      {b.message && <div class="muted">{b.message}</div>}
    </div>
  );
}


/** Images the call's result names; for a spooled result, read from the full spool file. */
function Images(props: { call: ToolCallView }) {
  const c = props.call;
  const [fromSpool, setFromSpool] = useState<string[]>([]);
  useEffect(() => {
    if (c.images.length || !c.spoolPath || c.status !== "done") return;
    const url = fileUrl(c.spoolPath);
    if (!url) return;
    const ac = new AbortController();
    fetch(url, { signal: ac.signal, headers: { Range: "bytes=0-8388607" } })
      .then((r) => (r.ok ? r.text() : ""))
      .then((t) => setFromSpool(outputFiles(t)))
      .catch(() => {});
    return () => ac.abort();
  }, [c.images.length, c.spoolPath, c.status]);
  const paths = c.images.length ? c.images : fromSpool;
  if (!paths.length) return null;
  return (
    <div class="images">
      {paths.map((p) => {
        const url = fileUrl(p);
        const name = p.split("/").pop() ?? p;
        return url ? (
          <figure key={p}>
            <img src={url} alt={`Image from ${c.name}: ${name}`} loading="lazy" data-testid="tool-image" />
            <figcaption class="muted">{p}</figcaption>
          </figure>
        ) : null;
      })}
    </div>
  );
}

const SPOOL_PREVIEW_BYTES = 65536;

function Spool(props: { path: string }) {
  const [text, setText] = useState<string | null>(null);
  const [err, setErr] = useState<string | null>(null);
  const url = fileUrl(props.path);
  const load = () => {
    if (!url || text !== null) return;
    fetch(url, { headers: { Range: `bytes=0-${SPOOL_PREVIEW_BYTES - 1}` } })
      .then(async (r) => {
        if (!r.ok) throw new Error(`${r.status} ${r.statusText}`);
        const body = await r.text();
        const total = r.headers.get("Content-Range")?.split("/")[1];
        setText(total && Number(total) > SPOOL_PREVIEW_BYTES ? `${body}\n… (${total} bytes in all)` : body);
      })
      .catch((e: unknown) => setErr(String(e)));
  };
  return (
    <details class="spool" onToggle={(e) => (e.currentTarget as HTMLDetailsElement).open && load()}>
      <summary>
        Full result spooled to <code>{props.path}</code>
      </summary>
      {url && (
        <p>
          <a href={url} target="_blank" rel="noopener noreferrer">
            Open the whole file
          </a>
        </p>
      )}
      {err && <p class="error-text">Could not read it: {err}</p>}
      {text !== null && (
        <pre tabindex={0} data-testid="spool-preview">
          {text}
        </pre>
      )}
    </details>
  );
}
