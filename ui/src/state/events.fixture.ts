// Builders of ChatEvents for the unit tests: the real generated message types.

import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { ChatEventSchema, TurnDoneReason, type ChatEvent } from "../gen/omicos/v1/orchestrator_pb";
import { Decision, PermissionMode, Risk, ToolStatus } from "../gen/omicos/v1/common_pb";

type Kind = NonNullable<MessageInitShape<typeof ChatEventSchema>["kind"]>;

/** A session's log as the server would write it: gap-free seqs from 1. */
export class Log {
  seq = 0;
  readonly events: ChatEvent[] = [];
  constructor(
    readonly sessionId = "s1",
    public turnId = "t1",
  ) {}

  private push(kind: Kind, ctx = "root", agent = "generalist"): ChatEvent {
    this.seq += 1;
    const ev = create(ChatEventSchema, {
      sessionId: this.sessionId,
      turnId: this.turnId,
      eventSeq: BigInt(this.seq),
      executionContextId: ctx,
      agentId: agent,
      timestampMs: BigInt(1_000_000 + this.seq * 10),
      kind,
    });
    this.events.push(ev);
    return ev;
  }

  /** A heartbeat repeating the latest seq (never logged). */
  heartbeat(seq = this.seq): ChatEvent {
    return create(ChatEventSchema, {
      sessionId: this.sessionId,
      turnId: this.turnId,
      eventSeq: BigInt(seq),
      executionContextId: "root",
      kind: { case: "heartbeat", value: {} },
    });
  }

  started(message: string, agent = "generalist", team: string[] = []): ChatEvent {
    return this.push(
      { case: "turnStarted", value: { message, agent, teamMembers: team, permissionMode: PermissionMode.AUTO } },
      "root",
      agent,
    );
  }
  steer(message: string): ChatEvent {
    return this.push({ case: "steer", value: { message } });
  }
  text(t: string, ctx = "root", agent = "generalist"): ChatEvent {
    return this.push({ case: "textDelta", value: { text: t } }, ctx, agent);
  }
  call(callId: string, name: string, args: string, ctx = "root", agent = "generalist"): ChatEvent {
    return this.push({ case: "toolCallStarted", value: { callId, name, arguments: args } }, ctx, agent);
  }
  output(callId: string, stream: string, text: string, ctx = "root"): ChatEvent {
    return this.push({ case: "toolOutputChunk", value: { callId, chunk: { stream, text } } }, ctx);
  }
  progress(callId: string, p: { barId?: string; current: number; total: number; percent: number; etaS?: number; done?: boolean; label?: string }, ctx = "root"): ChatEvent {
    return this.push(
      {
        case: "toolProgress",
        value: {
          callId,
          progress: { barId: p.barId ?? "b0", label: p.label ?? "", current: p.current, total: p.total, percent: p.percent, elapsedS: 1, etaS: p.etaS ?? 0, unit: "it", done: p.done ?? false, message: "" },
        },
      },
      ctx,
    );
  }
  ask(callId: string, toolName: string, risk = Risk.PYTHON, ctx = "root"): ChatEvent {
    return this.push(
      { case: "toolApprovalRequest", value: { callId, toolName, risk, summary: `run ${toolName}`, arguments: "{}" } },
      ctx,
    );
  }
  resolved(callId: string, decision: Decision, source = "client"): ChatEvent {
    return this.push({ case: "toolApprovalResolved", value: { callId, decision, source } });
  }
  finished(callId: string, name: string, result: string, status = ToolStatus.DONE, spoolPath = "", ctx = "root"): ChatEvent {
    return this.push(
      { case: "toolCallFinished", value: { callId, name, status, result, spoolPath, elapsedMs: 1234n } },
      ctx,
    );
  }
  switchTo(from: string, to: string, reason: string, depth: number, ctx = "root"): ChatEvent {
    return this.push({ case: "agentSwitch", value: { fromAgent: from, toAgent: to, reason, depth } }, ctx);
  }
  error(kind: string, message: string): ChatEvent {
    return this.push({ case: "error", value: { kind, message } });
  }
  rewound(turnIds: string[], filesRestored: string[] = [], filesNotRestored: string[] = []): ChatEvent {
    return this.push({ case: "rewound", value: { turnIds, filesRestored, filesNotRestored } });
  }
  moved(reissued: boolean, lostCalls: string[] = [], ctx = "root"): ChatEvent {
    return this.push(
      { case: "turnMoved", value: { reason: "the orchestrator running this turn stopped renewing its lease", replica: "orch-2", modelRequestReissued: reissued, reattachedCalls: [], lostCalls } },
      ctx,
    );
  }
  done(reason = TurnDoneReason.COMPLETED): ChatEvent {
    return this.push({ case: "turnDone", value: { reason } });
  }
}
