import { describe, expect, it } from "vitest";
import { Code, ConnectError } from "@connectrpc/connect";
import { Follower, type AttachSource, type LinkState } from "./follow";
import type { Conversation } from "./conversation";
import { Log } from "./events.fixture";
import type { ChatEvent } from "../gen/omicos/v1/orchestrator_pb";

/**
 * A stand-in for Orchestrator/Attach with the server's semantics: replays
 * the log after since_seq, then (for the scripted attempts) breaks the stream.
 */
class ScriptedAttach implements AttachSource {
  readonly calls: number[] = [];
  constructor(
    private readonly log: Log,
    /** Per attempt: how many events to send before failing; undefined: all, then end. */
    private readonly breakAfter: (number | "error" | "fatal" | "unauthenticated" | undefined)[],
    private readonly extra: (attempt: number) => ChatEvent[] = () => [],
  ) {}
  async *attach(_id: string, since: number, signal: AbortSignal): AsyncIterable<ChatEvent> {
    const attempt = this.calls.length;
    this.calls.push(since);
    const plan = this.breakAfter[attempt];
    if (plan === "error") throw new ConnectError("connection refused", Code.Unavailable);
    if (plan === "fatal") throw new ConnectError("session `s1` does not exist", Code.NotFound);
    if (plan === "unauthenticated") throw new ConnectError("the token was refused", Code.Unauthenticated);
    for (const ev of this.extra(attempt)) yield ev;
    let sent = 0;
    for (const ev of this.log.events.filter((e) => Number(e.eventSeq) > since)) {
      if (signal.aborted) return;
      if (plan !== undefined && sent === plan) throw new ConnectError("stream reset", Code.Unavailable);
      yield ev;
      sent++;
    }
  }
}

function run(source: AttachSource, stallMs = 10_000) {
  const links: LinkState[] = [];
  const fatal: ConnectError[] = [];
  let last: Conversation | null = null;
  let done!: () => void;
  const finished = new Promise<void>((r) => (done = r));
  const f = new Follower(source, "s1", {
    onState: (c) => {
      last = c;
      if (c.turns.length && c.live === null) done();
    },
    onLink: (l) => links.push(l),
    onFatal: (e) => {
      fatal.push(e);
      done();
    },
    stallMs,
    stallCheckMs: null,
    sleep: async () => {},
    retryMs: [1, 2],
  });
  return { f, links, fatal, finished, state: () => last as Conversation | null };
}

function turnLog(): Log {
  const l = new Log();
  l.started("hi");
  for (const w of ["a ", "b ", "c ", "d ", "e"]) l.text(w);
  l.call("c1", "run_python_code", "{}");
  l.output("c1", "stdout", "x");
  l.finished("c1", "run_python_code", "{}");
  l.done();
  return l;
}

describe("Follower", () => {
  it("resumes a broken stream from lastSeq: nothing lost, nothing doubled", async () => {
    const log = turnLog();
    const src = new ScriptedAttach(log, [3, "error", 4, undefined]);
    const r = run(src);
    r.f.follow();
    await r.finished;
    expect(src.calls).toEqual([0, 3, 3, 7]);
    const c = r.state()!;
    expect(c.lastSeq).toBe(log.seq);
    const items = c.frames["t1|root"]!.items;
    expect(items.map((i) => (i.t === "text" ? i.text : i.t))).toEqual(["a b c d e", "call"]);
    expect(r.links).toContain("reconnecting");
    expect(r.links.at(-1)).toBe("connected");
  });

  it("re-attaches from lastSeq when the stream skips an event", async () => {
    const log = turnLog();
    // The first attempt delivers a later event out of its place (seq 5 after 0): a gap.
    const src = new ScriptedAttach(log, [undefined, undefined], (attempt) => (attempt === 0 ? [log.events[4]!] : []));
    const r = run(src);
    r.f.follow();
    await r.finished;
    expect(src.calls).toEqual([0, 0]);
    expect(r.state()!.lastSeq).toBe(log.seq);
  });

  it("a reload (a new follower) rebuilds the same conversation from seq 0", async () => {
    const log = turnLog();
    const a = run(new ScriptedAttach(log, [2, undefined]));
    a.f.follow();
    await a.finished;
    const src = new ScriptedAttach(log, [undefined]);
    const b = run(src);
    b.f.follow();
    await b.finished;
    expect(src.calls).toEqual([0]);
    expect(b.state()).toEqual(a.state());
  });

  it("stops on an error retrying cannot mend", async () => {
    const r = run(new ScriptedAttach(turnLog(), ["fatal"]));
    r.f.follow();
    await r.finished;
    expect(r.fatal.map((e) => e.code)).toEqual([Code.NotFound]);
  });

  it("never calls a refused token connected, and does not retry it", async () => {
    const src = new ScriptedAttach(turnLog(), ["unauthenticated"]);
    const r = run(src);
    r.f.follow();
    await r.finished;
    expect(r.fatal.map((e) => e.code)).toEqual([Code.Unauthenticated]);
    expect(r.links).not.toContain("connected");
    expect(src.calls).toEqual([0]);
  });

  it("takes a silent stream as lost and attaches again", async () => {
    const log = turnLog();
    let now = 0;
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const calls: number[] = [];
    const src: AttachSource = {
      async *attach(_id, since, signal) {
        calls.push(since);
        for (const ev of log.events.filter((e) => Number(e.eventSeq) > since)) {
          yield ev;
          if (calls.length === 1 && Number(ev.eventSeq) === 2) {
            // The server goes quiet: no events, no heartbeats, until the client gives up.
            await new Promise<void>((r) => signal.addEventListener("abort", () => r(), { once: true }));
            release();
            return;
          }
        }
      },
    };
    const links: LinkState[] = [];
    let last: Conversation | null = null;
    const f = new Follower(src, "s1", {
      onState: (c) => (last = c),
      onLink: (l) => links.push(l),
      onFatal: () => {},
      stallMs: 1000,
      stallCheckMs: null,
      sleep: async () => {},
      now: () => now,
    });
    f.follow();
    await new Promise((r) => setTimeout(r, 10));
    now = 500;
    f.checkStall();
    expect(calls).toEqual([0]);
    now = 1600;
    f.checkStall();
    await gate;
    await new Promise((r) => setTimeout(r, 10));
    expect(calls).toEqual([0, 2]);
    expect(links).toContain("reconnecting");
    expect(last!.lastSeq).toBe(log.seq);
    f.close();
  });

  it("drops a stream that still looks alive when the browser goes offline, and resumes from the last seq", async () => {
    const log = turnLog();
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const calls: number[] = [];
    const src: AttachSource = {
      async *attach(_id, since, signal) {
        calls.push(since);
        for (const ev of log.events.filter((e) => Number(e.eventSeq) > since)) {
          yield ev;
          if (calls.length === 1 && Number(ev.eventSeq) === 2) {
            // Nothing says the stream is gone (no stall yet): only the browser's offline event.
            await new Promise<void>((r) => signal.addEventListener("abort", () => r(), { once: true }));
            release();
            return;
          }
        }
      },
    };
    const links: LinkState[] = [];
    let last: Conversation | null = null;
    const f = new Follower(src, "s1", {
      onState: (c) => (last = c),
      onLink: (l) => links.push(l),
      onFatal: () => {},
      stallMs: 60_000,
      stallCheckMs: null,
      sleep: async () => {},
    });
    f.follow();
    await new Promise((r) => setTimeout(r, 10));
    expect(links).toEqual(["connecting", "connected"]);
    f.dropLink();
    expect(links[links.length - 1]).toBe("reconnecting");
    await gate;
    await new Promise((r) => setTimeout(r, 10));
    expect(calls).toEqual([0, 2]);
    expect(last!.lastSeq).toBe(log.seq);
    f.close();
  });

  it("follow() during an idle stop attaches again for the next turn", async () => {
    const log = new Log();
    log.started("one");
    log.done();
    const src = new ScriptedAttach(log, [undefined, undefined]);
    const r = run(src);
    r.f.follow();
    await r.finished;
    log.turnId = "t2";
    log.started("two");
    log.text("ok");
    log.done();
    r.f.follow();
    await new Promise((res) => setTimeout(res, 20));
    expect(src.calls).toEqual([0, 2]);
    expect(r.state()!.turns.map((t) => t.message)).toEqual(["one", "two"]);
  });
});
