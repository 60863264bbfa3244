// The approval dialog: the head of the queue of pending approvals.

import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import { Decision, Risk } from "../gen/omicos/v1/common_pb";
import type { ValueRef } from "../gen/omicos/v1/orchestrator_pb";
import type { PendingApproval } from "../state/conversation";
import { suggestRule } from "../state/rules";
import { WholeValueOffer } from "./whole";

const RISK_TEXT: Record<number, string> = {
  [Risk.READ]: "reads only",
  [Risk.FILE_WRITE]: "writes workspace files",
  [Risk.PYTHON]: "runs Python code",
  [Risk.SHELL]: "runs shell commands",
  [Risk.MEMORY_WRITE]: "writes its long-term memory",
};

function pretty(args: string): string {
  try {
    return JSON.stringify(JSON.parse(args), null, 2);
  } catch {
    return args;
  }
}

/** What the dialog answers with: a decision, and with ALLOW_SESSION maybe a rule. Resolves to the server's reason when it refused the rule (the call still waits). */
export type Decide = (a: PendingApproval, d: Decision, rule?: string) => Promise<string | null>;

export function ApprovalDialog(props: {
  queue: PendingApproval[];
  hidden: boolean;
  nameOf: (id: string) => string;
  onDecide: Decide;
  onHide: () => void;
  /** The last question was answered and the dialog closed: focus goes back to the page's work. */
  onAnswered: () => void;
  /** The session the questions are of, and how to read a cut value whole. */
  sessionId?: string;
  readValue?: (sessionId: string, value: ValueRef) => Promise<Blob>;
}) {
  const ref = useRef<HTMLDialogElement>(null);
  const head = useRef<HTMLHeadingElement>(null);
  const a = props.queue[0];
  const open = !!a && !props.hidden;
  useEffect(() => {
    const d = ref.current;
    if (!d) return;
    if (open && !d.open) {
      d.showModal();
    } else if (!open && d.open) {
      d.close();
      // Answered (not put aside): the dialog would hand focus back to
      // whatever opened it, which may be gone (the "waiting" button).
      if (!props.hidden) props.onAnswered();
    }
    // Focus the heading, not a button: Enter alone must not decide.
    if (open) head.current?.focus();
  }, [open, a?.callId]);
  return (
    <dialog
      ref={ref}
      class="approval"
      aria-labelledby="approval-title"
      aria-describedby="approval-summary"
      data-testid="approval-dialog"
      onCancel={(e) => {
        // Escape puts the question aside; the calls keep waiting.
        e.preventDefault();
        props.onHide();
      }}
    >
      {a && (
        <div>
          <h2 id="approval-title" tabindex={-1} ref={head}>
            Allow <code>{a.toolName}</code>?
          </h2>
          {props.queue.length > 1 && (
            <p class="muted" data-testid="approval-queue">
              1 of {props.queue.length} waiting
            </p>
          )}
          {/* Keyed by call: the rule, its error and the busy state belong to one question. */}
          <ApprovalCard
            key={a.callId}
            a={a}
            nameOf={props.nameOf}
            onDecide={props.onDecide}
            onHide={props.onHide}
            sessionId={props.sessionId ?? ""}
            readValue={props.readValue ?? null}
          />
        </div>
      )}
    </dialog>
  );
}

function ApprovalCard(props: {
  a: PendingApproval;
  nameOf: (id: string) => string;
  onDecide: Decide;
  onHide: () => void;
  sessionId: string;
  readValue: ((sessionId: string, value: ValueRef) => Promise<Blob>) | null;
}) {
  const a = props.a;
  const suggestion = useMemo(() => suggestRule(a.toolName, a.arguments), [a.toolName, a.arguments]);
  const [rule, setRule] = useState(suggestion.rule);
  const [refused, setRefused] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const input = useRef<HTMLInputElement>(null);
  const decide = async (d: Decision, withRule?: string) => {
    setBusy(true);
    setRefused(null);
    try {
      const why = await props.onDecide(a, d, withRule);
      if (why !== null) {
        setRefused(why);
        input.current?.focus();
      }
    } finally {
      setBusy(false);
    }
  };
  return (
    <>
      <dl class="facts">
        <dt>Tool</dt>
        <dd>{a.toolName}</dd>
        <dt>Risk</dt>
        <dd class={`risk risk-${a.risk}`}>{RISK_TEXT[a.risk] ?? "unknown"}</dd>
        {a.agentId && (
          <>
            <dt>Asked by</dt>
            <dd>{props.nameOf(a.agentId)}</dd>
          </>
        )}
      </dl>
      <p id="approval-summary" tabindex={0}>
        {a.summary}
      </p>
      <details open>
        <summary>Arguments</summary>
        <pre tabindex={0}>{pretty(a.arguments)}</pre>
        {/* Only the head is shown: what is decided on must be readable whole first. */}
        {a.argumentsCut && (
          <WholeValueOffer sessionId={props.sessionId} value={a.argumentsCut} name={`${a.callId}-arguments.json`} readValue={props.readValue} />
        )}
      </details>
      <form
        class="rule-grant"
        data-testid="approval-rule"
        onSubmit={(e) => {
          e.preventDefault();
          if (!busy && rule.trim()) void decide(Decision.ALLOW_SESSION, rule.trim());
        }}
      >
        <label for="approval-rule">Allow as a rule for this session</label>
        <div class="rule-row">
          <input
            id="approval-rule"
            ref={input}
            type="text"
            spellcheck={false}
            autocomplete="off"
            value={rule}
            aria-describedby={refused ? "approval-rule-help approval-rule-refused" : "approval-rule-help"}
            aria-invalid={refused ? "true" : undefined}
            onInput={(e) => {
              setRule(e.currentTarget.value);
              setRefused(null);
            }}
          />
          <button type="submit" disabled={busy || !rule.trim()}>
            Allow as a rule
          </button>
        </div>
        <p class="muted rule-help" id="approval-rule-help">
          {suggestion.note ?? "Later calls that match the rule run without asking for the rest of this session; deny and ask rules still win."}
        </p>
        {refused && (
          <p class="rule-refused" id="approval-rule-refused" role="alert" data-testid="approval-rule-refused">
            The server refused the rule: {refused}
          </p>
        )}
      </form>
      <div class="dialog-actions">
        <button type="button" class="primary" disabled={busy} onClick={() => decide(Decision.ALLOW_ONCE)}>
          Allow once
        </button>
        <button type="button" disabled={busy} onClick={() => decide(Decision.ALLOW_SESSION)}>
          Allow for this session
        </button>
        <button type="button" class="danger" disabled={busy} onClick={() => decide(Decision.DENY)}>
          Deny
        </button>
        <button type="button" class="link" onClick={props.onHide}>
          Later
        </button>
      </div>
    </>
  );
}
