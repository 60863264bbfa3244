// The conversation of one session, folded from its ChatEvents.
//
// Pure and immutable: `apply` returns a new state (sharing what did not
// change), so the views can memoise on identity. The one rule that keeps a
// reload or a reconnect exact: events are applied in event_seq order, each
// once. An event at or below `lastSeq` was seen already (a replay overlap) and
// is dropped; an event above `lastSeq + 1` means some were missed, and it is
// not applied: `gap` is set so the caller re-attaches with since_seq = lastSeq,
// and the server sends the missing ones first.

import type { ChatEvent, ValueRef } from "../gen/omicos/v1/orchestrator_pb";
import { TurnDoneReason } from "../gen/omicos/v1/orchestrator_pb";
import { Decision, PermissionMode, Risk, ToolStatus } from "../gen/omicos/v1/common_pb";
import { outputFiles } from "./outputs";

/** How a tool call stands, as the card shows it. */
export type CallStatus = "running" | "awaiting_approval" | "done" | "error" | "denied" | "cancelled";

/** One tqdm-style bar of a call. */
export interface Bar {
  id: string;
  label: string;
  current: number;
  total: number;
  /** 0..100 */
  percent: number;
  elapsedS: number;
  etaS: number;
  unit: string;
  done: boolean;
  message: string;
}

/** A stretch of a call's live output on one stream. */
export interface OutputRun {
  stream: string;
  text: string;
}

/** A tool call and everything seen of it. */
export interface ToolCallView {
  callId: string;
  turnId: string;
  name: string;
  arguments: string;
  /**
   * Where the whole arguments are when the event carries them cut (over
   * 64 KiB: a head and a marker); Orchestrator/ReadValue reads them.
   */
  argumentsCut: ValueRef | null;
  status: CallStatus;
  startedMs: number;
  finishedMs: number | null;
  elapsedMs: number | null;
  output: OutputRun[];
  /** Bars in the order they first appeared. */
  bars: Bar[];
  result: string | null;
  spoolPath: string;
  /** Workspace paths of images the result names (kernel plots, generated images). */
  images: string[];
  /** The decision, once one was made, and who made it. */
  approval: { decision: Decision; source: string } | null;
  /** The frame of the sub-turn a call_agent call started. */
  childFrame: string | null;
}

/** Something shown in a frame, in order. */
export type Item =
  | { t: "text"; id: string; text: string }
  | { t: "call"; callId: string }
  | { t: "error"; id: string; kind: string; message: string }
  | { t: "switch"; id: string; from: string; to: string; reason: string }
  /** A message the user steered into the running turn (it joined the next model request). */
  | { t: "steer"; id: string; message: string }
  /** The turn moved to another orchestrator replica (it goes on there). */
  | { t: "moved"; id: string; replica: string; reason: string; lostCalls: string[] }
  /** A sub-turn whose opening call is not in view (its frame is shown where it happened). */
  | { t: "frame"; key: string };

/** The output of one execution context (the root agent, or a delegated sub-turn). */
export interface FrameView {
  key: string;
  turnId: string;
  contextId: string;
  agentId: string;
  depth: number;
  items: Item[];
}

/** One turn: the user's message and what the team did with it. */
export interface TurnView {
  id: string;
  message: string;
  agent: string;
  team: string[];
  mode: PermissionMode;
  startedMs: number;
  rootFrame: string;
  done: TurnDoneReason | null;
  /** The server's words on why it ended, when the reason alone does not say. */
  doneDetail: string;
  usage: { input: number; output: number; model: string } | null;
}

/** A tool call waiting for the user's decision. */
export interface PendingApproval {
  callId: string;
  turnId: string;
  toolName: string;
  risk: Risk;
  summary: string;
  arguments: string;
  /** Where the whole arguments are when `arguments` holds only their head. */
  argumentsCut: ValueRef | null;
  agentId: string;
  seq: number;
}

/** The folded state of a session. */
export interface Conversation {
  sessionId: string;
  /** The highest event_seq applied; since_seq for the next Attach. */
  lastSeq: number;
  turns: TurnView[];
  frames: Record<string, FrameView>;
  calls: Record<string, ToolCallView>;
  /** Oldest first: the dialog shows the head, the rest wait their turn. */
  approvals: PendingApproval[];
  /** The turn that has started and not finished, if any. */
  live: string | null;
  /** Set when an event arrived past a hole; cleared by `resume`. */
  gap: { expected: number; got: number } | null;
  /** Errors that came outside any turn (event_seq 0). */
  looseErrors: { kind: string; message: string }[];
  /** Server time of the latest event or heartbeat. */
  lastHeardMs: number;
  /** The frame the latest text delta went to: the answer a reissued model request supersedes. */
  textFrame: string | null;
  /**
   * Rewinds seen: how many turns went, the files restored, those left as
   * they were (too large for the runner to have kept), and the turn they
   * followed (empty: none).
   */
  rewinds: { turns: number; filesRestored: string[]; filesNotRestored: string[]; afterTurn: string }[];
}

/** An empty conversation for `sessionId` (empty: not created yet). */
export function emptyConversation(sessionId = ""): Conversation {
  return {
    sessionId,
    lastSeq: 0,
    turns: [],
    frames: {},
    calls: {},
    approvals: [],
    live: null,
    gap: null,
    looseErrors: [],
    lastHeardMs: 0,
    textFrame: null,
    rewinds: [],
  };
}

/** What `apply` did with an event. */
export type Applied = "applied" | "duplicate" | "heartbeat" | "gap";

/** Folds one event into `c`. */
export function apply(c: Conversation, ev: ChatEvent): { state: Conversation; outcome: Applied } {
  const seq = Number(ev.eventSeq);
  const heard = Number(ev.timestampMs) || c.lastHeardMs;
  if (ev.kind.case === "heartbeat") {
    // A heartbeat repeats the latest seq: one above ours means we missed events.
    if (seq > c.lastSeq) {
      return { state: { ...c, gap: { expected: c.lastSeq + 1, got: seq }, lastHeardMs: heard }, outcome: "gap" };
    }
    return { state: { ...c, lastHeardMs: heard }, outcome: "heartbeat" };
  }
  if (seq === 0) {
    // Not logged (a refusal before any turn started): shown, never counted.
    if (ev.kind.case === "error") {
      const e = ev.kind.value;
      return {
        state: { ...c, looseErrors: [...c.looseErrors, { kind: e.kind, message: e.message }], lastHeardMs: heard },
        outcome: "applied",
      };
    }
    return { state: c, outcome: "duplicate" };
  }
  if (seq <= c.lastSeq) return { state: c, outcome: "duplicate" };
  if (seq > c.lastSeq + 1) {
    return { state: { ...c, gap: { expected: c.lastSeq + 1, got: seq } }, outcome: "gap" };
  }
  const next = fold({ ...c, lastSeq: seq, lastHeardMs: heard, sessionId: c.sessionId || ev.sessionId }, ev, seq);
  return { state: next, outcome: "applied" };
}

/** Folds many events; stops at the first gap. */
export function applyAll(c: Conversation, evs: Iterable<ChatEvent>): Conversation {
  let s = c;
  for (const ev of evs) {
    const r = apply(s, ev);
    s = r.state;
    if (r.outcome === "gap") break;
  }
  return s;
}

/** Clears a gap before re-attaching from `lastSeq`. */
export function resume(c: Conversation): Conversation {
  return c.gap ? { ...c, gap: null } : c;
}

function frameKey(turnId: string, contextId: string): string {
  return `${turnId}|${contextId}`;
}

/** The call id that opened a sub-turn context ("root/<call>" → "<call>"). */
function openingCall(contextId: string): string | null {
  const i = contextId.lastIndexOf("/");
  return i < 0 ? null : contextId.slice(i + 1);
}

function fold(c: Conversation, ev: ChatEvent, seq: number): Conversation {
  const k = ev.kind;
  const ts = Number(ev.timestampMs);
  switch (k.case) {
    case "turnStarted": {
      const v = k.value;
      return startTurn(c, ev.turnId, { message: v.message, agent: v.agent, team: [...v.teamMembers], mode: v.permissionMode }, ts);
    }
    case "textDelta": {
      const s = withFrame(c, ev, (f) => {
        const last = f.items[f.items.length - 1];
        if (last && last.t === "text") {
          const items = f.items.slice(0, -1);
          items.push({ ...last, text: last.text + k.value.text });
          return { ...f, items };
        }
        return { ...f, items: [...f.items, { t: "text", id: `t${seq}`, text: k.value.text }] };
      });
      return { ...s, textFrame: frameKey(ev.turnId, ev.executionContextId || "root") };
    }
    case "toolCallStarted": {
      const v = k.value;
      const call: ToolCallView = {
        callId: v.callId,
        turnId: ev.turnId,
        name: v.name,
        arguments: v.arguments,
        argumentsCut:
          ev.cutValues.find((r) => r.at.case === "event" && r.at.value.field === "tool_call_started.arguments") ?? null,
        status: "running",
        startedMs: ts,
        finishedMs: null,
        elapsedMs: null,
        output: [],
        bars: [],
        result: null,
        spoolPath: "",
        images: [],
        approval: null,
        childFrame: null,
      };
      const s = withFrame(c, ev, (f) => ({ ...f, items: [...f.items, { t: "call", callId: v.callId }] }));
      return { ...s, calls: { ...s.calls, [v.callId]: call } };
    }
    case "toolProgress": {
      const p = k.value.progress;
      if (!p) return c;
      return withCall(c, k.value.callId, (call) => {
        const bar: Bar = {
          id: p.barId || "0",
          label: p.label,
          current: p.current,
          total: p.total,
          percent: clampPercent(p.done && p.total > 0 ? 100 : p.percent),
          elapsedS: p.elapsedS,
          etaS: p.done ? 0 : p.etaS,
          unit: p.unit,
          done: p.done,
          message: p.message,
        };
        const i = call.bars.findIndex((b) => b.id === bar.id);
        const bars = i < 0 ? [...call.bars, bar] : call.bars.map((b, j) => (j === i ? bar : b));
        return { ...call, bars };
      });
    }
    case "toolOutputChunk": {
      const ch = k.value.chunk;
      if (!ch) return c;
      return withCall(c, k.value.callId, (call) => {
        const last = call.output[call.output.length - 1];
        const output =
          last && last.stream === ch.stream
            ? [...call.output.slice(0, -1), { stream: ch.stream, text: last.text + ch.text }]
            : [...call.output, { stream: ch.stream, text: ch.text }];
        return { ...call, output };
      });
    }
    case "toolApprovalRequest": {
      const v = k.value;
      const pending: PendingApproval = {
        callId: v.callId,
        turnId: ev.turnId,
        toolName: v.toolName,
        risk: v.risk,
        summary: v.summary,
        arguments: v.arguments,
        argumentsCut: ev.cutValues.find((r) => r.at.case === "event" && r.at.value.field === "tool_approval_request.arguments") ?? null,
        agentId: ev.agentId,
        seq,
      };
      const s = withCall(c, v.callId, (call) => ({ ...call, status: "awaiting_approval" }));
      const approvals = s.approvals.filter((a) => a.callId !== v.callId);
      approvals.push(pending);
      return { ...s, approvals };
    }
    case "toolApprovalResolved": {
      const v = k.value;
      const s = withCall(c, v.callId, (call) => ({
        ...call,
        approval: { decision: v.decision, source: v.source },
        status: v.decision === Decision.DENY ? "denied" : call.status === "awaiting_approval" ? "running" : call.status,
      }));
      return { ...s, approvals: s.approvals.filter((a) => a.callId !== v.callId) };
    }
    case "toolCallFinished": {
      const v = k.value;
      const s = withCall(c, v.callId, (call) => ({
        ...call,
        status:
          call.status === "denied"
            ? "denied"
            : v.status === ToolStatus.DONE
              ? "done"
              : CANCELLED.test(v.result)
                ? "cancelled"
                : "error",
        result: v.result,
        spoolPath: v.spoolPath,
        elapsedMs: Number(v.elapsedMs),
        finishedMs: ts,
        images: outputFiles(v.result),
        // A finished call's bars stop where they are; a bar that reached its total is full.
        bars: call.bars.map((b) => (b.total > 0 && b.current >= b.total ? { ...b, percent: 100, etaS: 0, done: true } : b)),
      }));
      return { ...s, approvals: s.approvals.filter((a) => a.callId !== v.callId) };
    }
    case "agentSwitch": {
      const v = k.value;
      return withFrame(c, ev, (f) => ({
        ...f,
        items: [...f.items, { t: "switch", id: `s${seq}`, from: v.fromAgent, to: v.toAgent, reason: v.reason }],
      }));
    }
    case "usage": {
      const v = k.value;
      return withTurn(c, ev.turnId, (t) => ({
        ...t,
        usage: {
          input: (t.usage?.input ?? 0) + Number(v.inputTokens),
          output: (t.usage?.output ?? 0) + Number(v.outputTokens),
          model: v.model || t.usage?.model || "",
        },
      }));
    }
    case "error": {
      const v = k.value;
      if (!ev.turnId || !c.frames[frameKey(ev.turnId, "root")]) {
        return { ...c, looseErrors: [...c.looseErrors, { kind: v.kind, message: v.message }] };
      }
      return withFrame(c, ev, (f) => ({
        ...f,
        items: [...f.items, { t: "error", id: `e${seq}`, kind: v.kind, message: v.message }],
      }));
    }
    case "steer": {
      const message = k.value.message;
      return withFrame(c, ev, (f) => ({ ...f, items: [...f.items, { t: "steer", id: `s${seq}`, message }] }));
    }
    case "rewound":
      return rewind(c, k.value.turnIds, k.value.filesRestored, k.value.filesNotRestored);
    case "turnMoved": {
      const v = k.value;
      let s = c;
      // The answer that was streaming (in whichever frame, a sub-turn's
      // too) is asked for again: its partial text since the last
      // model-request boundary, i.e. that frame's trailing text items, is
      // superseded by what the new request streams.
      const streaming = c.textFrame ? c.frames[c.textFrame] : undefined;
      if (v.modelRequestReissued && streaming && streaming.turnId === ev.turnId) {
        let end = streaming.items.length;
        while (end > 0 && streaming.items[end - 1]!.t === "text") end--;
        s = { ...s, frames: { ...s.frames, [streaming.key]: { ...streaming, items: streaming.items.slice(0, end) } } };
      }
      return withFrame(s, ev, (f) => ({
        ...f,
        items: [...f.items, { t: "moved", id: `m${seq}`, replica: v.replica, reason: v.reason, lostCalls: [...v.lostCalls] }],
      }));
    }
    case "turnDone": {
      const reason = k.value.reason;
      const calls = { ...c.calls };
      for (const [id, call] of Object.entries(c.calls)) {
        if (call.turnId === ev.turnId && (call.status === "running" || call.status === "awaiting_approval")) {
          calls[id] = { ...call, status: reason === TurnDoneReason.CANCELLED ? "cancelled" : "error", finishedMs: ts };
        }
      }
      const s = withTurn({ ...c, calls }, ev.turnId, (t) => ({ ...t, done: reason, doneDetail: k.value.detail }));
      return {
        ...s,
        live: s.live === ev.turnId ? null : s.live,
        approvals: s.approvals.filter((a) => a.turnId !== ev.turnId),
      };
    }
    default:
      return c;
  }
}

/**
 * Takes rewound turns out of the view: the log keeps them, but what the
 * model sees (and so what the conversation is) no longer holds them. Applied
 * on replay too, so a reload shows the history after the rewind.
 */
function rewind(c: Conversation, turnIds: string[], files: string[], notRestored: string[]): Conversation {
  const gone = new Set(turnIds);
  const kept = c.turns.filter((t) => !gone.has(t.id));
  const frames: Record<string, FrameView> = {};
  for (const [k, f] of Object.entries(c.frames)) if (!gone.has(f.turnId)) frames[k] = f;
  const calls: Record<string, ToolCallView> = {};
  for (const [k, call] of Object.entries(c.calls)) if (!gone.has(call.turnId)) calls[k] = call;
  return {
    ...c,
    turns: kept,
    frames,
    calls,
    approvals: c.approvals.filter((a) => !gone.has(a.turnId)),
    live: c.live !== null && gone.has(c.live) ? null : c.live,
    rewinds: [
      ...c.rewinds,
      { turns: c.turns.length - kept.length, filesRestored: [...files], filesNotRestored: [...notRestored], afterTurn: kept[kept.length - 1]?.id ?? "" },
    ],
  };
}

function startTurn(
  c: Conversation,
  turnId: string,
  t: { message: string; agent: string; team: string[]; mode: PermissionMode },
  ts: number,
): Conversation {
  const root = frameKey(turnId, "root");
  const turn: TurnView = { id: turnId, ...t, startedMs: ts, rootFrame: root, done: null, doneDetail: "", usage: null };
  const frame: FrameView = { key: root, turnId, contextId: "root", agentId: t.agent, depth: 0, items: [] };
  return { ...c, turns: [...c.turns, turn], frames: { ...c.frames, [root]: frame }, live: turnId };
}

/** How the runner and the orchestrator word a call stopped by a cancel. */
const CANCELLED = /\bcancel(?:l)?ed\b/i;

function clampPercent(p: number): number {
  if (!Number.isFinite(p)) return 0;
  return Math.max(0, Math.min(100, p));
}

function withTurn(c: Conversation, turnId: string, f: (t: TurnView) => TurnView): Conversation {
  const i = c.turns.findIndex((t) => t.id === turnId);
  if (i < 0) return c;
  const turns = c.turns.slice();
  turns[i] = f(turns[i]!);
  return { ...c, turns };
}

function withCall(c: Conversation, callId: string, f: (call: ToolCallView) => ToolCallView): Conversation {
  const call = c.calls[callId];
  if (!call) return c;
  return { ...c, calls: { ...c.calls, [callId]: f(call) } };
}

/**
 * Runs `f` on the event's frame, creating it (and placing it inside the
 * call_agent call that opened it) when this is the context's first event.
 */
function withFrame(c: Conversation, ev: ChatEvent, f: (fr: FrameView) => FrameView): Conversation {
  const ctx = ev.executionContextId || "root";
  const key = frameKey(ev.turnId, ctx);
  let s = c;
  let frame = s.frames[key];
  if (!frame) {
    if (!s.frames[frameKey(ev.turnId, "root")]) {
      // An event of a turn whose start we do not hold (a log that begins mid-turn): give it a turn.
      s = startTurn(s, ev.turnId, { message: "", agent: ev.agentId, team: [], mode: PermissionMode.UNSPECIFIED }, Number(ev.timestampMs));
      frame = s.frames[key];
    }
    if (!frame) {
      frame = { key, turnId: ev.turnId, contextId: ctx, agentId: ev.agentId, depth: ctx.split("/").length - 1, items: [] };
      const opener = openingCall(ctx);
      s = { ...s, frames: { ...s.frames, [key]: frame } };
      if (opener && s.calls[opener]) {
        s = withCall(s, opener, (call) => ({ ...call, childFrame: key }));
      } else {
        // No call to hang it on: show it in the root frame, where it happened.
        const root = frameKey(ev.turnId, "root");
        const rf = s.frames[root]!;
        s = {
          ...s,
          frames: { ...s.frames, [root]: { ...rf, items: [...rf.items, { t: "frame", key }] } },
        };
      }
    }
  }
  return { ...s, frames: { ...s.frames, [key]: f(s.frames[key]!) } };
}
