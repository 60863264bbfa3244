// The approval dialog: the head of the queue of pending approvals.

import { useEffect, useRef, useState } from "preact/hooks";
import { Decision, Risk } from "../gen/omicos/v1/common_pb";
import type { PendingApproval } from "../state/conversation";

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

export function ApprovalDialog(props: {
  queue: PendingApproval[];
  hidden: boolean;
  onDecide: (a: PendingApproval, d: Decision) => Promise<void>;
  onHide: () => void;
}) {
  const ref = useRef<HTMLDialogElement>(null);
  const head = useRef<HTMLHeadingElement>(null);
  const [busy, setBusy] = useState<string | null>(null);
  const a = props.queue[0];
  const open = !!a && !props.hidden;
  useEffect(() => {
    const d = ref.current;
    if (!d) return;
    if (open && !d.open) {
      d.showModal();
    } else if (!open && d.open) {
      d.close();
    }
    // Focus the heading, not a button: Enter alone must not decide.
    if (open) head.current?.focus();
  }, [open, a?.callId]);
  const decide = async (d: Decision) => {
    if (!a) return;
    setBusy(a.callId);
    try {
      await props.onDecide(a, d);
    } finally {
      setBusy(null);
    }
  };
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
          <dl class="facts">
            <dt>Tool</dt>
            <dd>{a.toolName}</dd>
            <dt>Risk</dt>
            <dd class={`risk risk-${a.risk}`}>{RISK_TEXT[a.risk] ?? "unknown"}</dd>
            {a.agentId && (
              <>
                <dt>Asked by</dt>
                <dd>{a.agentId}</dd>
              </>
            )}
          </dl>
          <p id="approval-summary">{a.summary}</p>
          <details open>
            <summary>Arguments</summary>
            <pre tabindex={0}>{pretty(a.arguments)}</pre>
          </details>
          <div class="dialog-actions">
            <button type="button" class="primary" disabled={busy !== null} onClick={() => decide(Decision.ALLOW_ONCE)}>
              Allow once
            </button>
            <button type="button" disabled={busy !== null} onClick={() => decide(Decision.ALLOW_SESSION)}>
              Allow for this session
            </button>
            <button type="button" class="danger" disabled={busy !== null} onClick={() => decide(Decision.DENY)}>
              Deny
            </button>
            <button type="button" class="link" onClick={props.onHide}>
              Later
            </button>
          </div>
        </div>
      )}
    </dialog>
  );
}
