// Following one session: Attach from the last event_seq held, fold what
// arrives, and attach again when the stream breaks, stalls or skips.
//
// Reopening a session or reloading the page starts from since_seq 0 and an
// empty conversation: the log replays every event, then the live turn (if
// any) follows on the same stream. A broken stream resumes from `lastSeq`,
// so nothing is lost; the reducer drops what it already holds, so nothing is
// doubled. A stream with no heartbeat for `stallMs` is taken as lost.

import { Code, ConnectError } from "@connectrpc/connect";
import type { ChatEvent } from "../gen/omicos/v1/orchestrator_pb";
import { apply, emptyConversation, resume, type Conversation } from "./conversation";

/** What the follower needs of the orchestrator. */
export interface AttachSource {
  attach(sessionId: string, sinceSeq: number, signal: AbortSignal): AsyncIterable<ChatEvent>;
}

/** How the link to the orchestrator stands, as the indicator says it. */
export type LinkState = "connecting" | "connected" | "reconnecting" | "offline";

/** Callbacks and timings of a follower. */
export interface FollowOptions {
  onState: (c: Conversation) => void;
  onLink: (l: LinkState, why?: string) => void;
  /** A failure that retrying will not mend (unknown session, bad request). */
  onFatal: (e: ConnectError) => void;
  /** Silence longer than this on an open stream means it is lost. */
  stallMs: number;
  /** Waits; tests pass a fake. */
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
  now?: () => number;
  /** How often the stream is checked for silence; null: only by checkStall() (tests). */
  stallCheckMs?: number | null;
  /** First and longest retry delay. */
  retryMs?: [number, number];
}

const FATAL = new Set([Code.NotFound, Code.InvalidArgument, Code.PermissionDenied, Code.Unimplemented, Code.Unauthenticated]);

function realSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      resolve();
    }, { once: true });
  });
}

/** Follows one session until closed. */
export class Follower {
  private state: Conversation;
  private running = false;
  private closed = new AbortController();
  private stream: AbortController | null = null;
  private heardAt = 0;
  private stalled = false;
  private wake: AbortController | null = null;
  /** Some stream has delivered: later attaches are re-connections. */
  private everOpened = false;
  /** follow() was called since the loop last attached. */
  private again = false;
  private watchdog: ReturnType<typeof setInterval> | null = null;
  private readonly sleep: (ms: number, signal: AbortSignal) => Promise<void>;
  private readonly now: () => number;

  constructor(
    private readonly source: AttachSource,
    readonly sessionId: string,
    private readonly opts: FollowOptions,
  ) {
    this.state = emptyConversation(sessionId);
    this.sleep = opts.sleep ?? realSleep;
    this.now = opts.now ?? Date.now;
  }

  /** The conversation as folded so far. */
  get conversation(): Conversation {
    return this.state;
  }

  /**
   * Makes sure a stream is open (after StartTurn, or to reopen the session);
   * a follower already attached keeps its stream.
   */
  follow(): void {
    if (this.closed.signal.aborted) return;
    this.again = true;
    this.wake?.abort();
    if (this.running) return;
    this.running = true;
    void this.loop().finally(() => {
      this.running = false;
    });
  }

  /** Stops following; the stream is dropped (the turn goes on at the server). */
  close(): void {
    this.closed.abort();
    this.stream?.abort();
    this.wake?.abort();
    if (this.watchdog) clearInterval(this.watchdog);
  }

  /**
   * The network went away (the browser says it is offline): drop the open
   * stream now instead of waiting for its silence; the loop attaches again
   * with backoff, and follow() once the network is back tries at once.
   */
  dropLink(): void {
    if (this.stream && !this.stalled) {
      this.stalled = true;
      this.opts.onLink("reconnecting", "offline");
      this.stream.abort();
    }
  }

  /** Checks the open stream for silence; called by a timer, or by tests. */
  checkStall(): void {
    if (this.stream && !this.stalled && this.now() - this.heardAt > this.opts.stallMs) {
      this.stalled = true;
      this.opts.onLink("reconnecting", "no heartbeat");
      this.stream.abort();
    }
  }

  private async loop(): Promise<void> {
    const [first, longest] = this.opts.retryMs ?? [250, 5000];
    let delay = first;
    if (!this.watchdog && this.opts.stallCheckMs !== null) {
      this.watchdog = setInterval(() => this.checkStall(), this.opts.stallCheckMs ?? 1000);
    }
    if (!this.everOpened) this.opts.onLink("connecting");
    while (!this.closed.signal.aborted) {
      this.again = false;
      const ac = new AbortController();
      this.stream = ac;
      this.stalled = false;
      this.heardAt = this.now();
      let failure: unknown = null;
      let opened = false;
      let moved = false;
      try {
        for await (const ev of this.source.attach(this.sessionId, this.state.lastSeq, ac.signal)) {
          this.heardAt = this.now();
          if (!opened) {
            opened = true;
            this.everOpened = true;
            this.opts.onLink("connected");
          }
          const r = apply(this.state, ev);
          if (r.state !== this.state) {
            this.state = r.state;
            this.opts.onState(this.state);
          }
          if (r.outcome === "applied") {
            moved = true;
            delay = first;
          }
          if (r.outcome === "gap") {
            // Re-attach from what we hold: the server sends the missing events first.
            this.state = resume(this.state);
            ac.abort();
            break;
          }
        }
      } catch (e) {
        failure = e;
      } finally {
        this.stream = null;
      }
      if (this.closed.signal.aborted) return;
      if (ac.signal.aborted) continue; // our own abort (gap, stall): attach again at once
      if (failure) {
        const ce = ConnectError.from(failure);
        if (FATAL.has(ce.code)) {
          // The server answered, so the link is up; but a refused token is
          // no connection the page can use, and the page says so instead.
          if (ce.code !== Code.Unauthenticated) this.opts.onLink("connected");
          this.opts.onFatal(ce);
          return;
        }
        this.opts.onLink(opened ? "reconnecting" : "offline", ce.rawMessage);
        await this.pause(delay);
        delay = Math.min(delay * 2, longest);
        continue;
      }
      if (!opened) this.opts.onLink("connected");
      // The stream ended. A turn still open (it runs on another replica, or the
      // stream closed early): look again shortly. Otherwise idle until follow().
      if (this.state.live) {
        await this.pause(moved ? first : Math.min(delay * 2, longest));
        continue;
      }
      if (this.again) continue;
      return;
    }
  }

  private async pause(ms: number): Promise<void> {
    const w = new AbortController();
    this.wake = w;
    const both = AbortSignal.any([w.signal, this.closed.signal]);
    await this.sleep(ms, both);
    this.wake = null;
  }
}
