// How the page's states read to a person: the link to the server, a sign-in
// problem, why a turn ended, a progress bar. Plain sentences that say what
// happened and what to do, never a wire detail.

import { Code } from "@connectrpc/connect";
import { TurnDoneReason } from "../gen/omicos/v1/orchestrator_pb";
import type { Bar } from "./conversation";
import type { LinkState } from "./follow";

/** Whether the server accepts this page: ok, or why not. */
export type Access = "ok" | "no-token" | "bad-token";

/** The access a refused call means, or null when the failure is not about the token. */
export function accessFromCode(code: Code, hasToken: boolean): Access | null {
  if (code !== Code.Unauthenticated) return null;
  return hasToken ? "bad-token" : "no-token";
}

/** What the sign-in banner says: what went wrong and what to do. */
export function accessText(a: Access): string {
  switch (a) {
    case "no-token":
      return "This page is not signed in. Open it from the link that `omicos up` printed (it ends in #token=…), or paste the access token below (`omicos up` keeps it in .omicos/token in its workspace).";
    case "bad-token":
      return "The server refused this page's access token; it may belong to an earlier `omicos up`. Open the page from the link `omicos up` printed last, or paste the current token below.";
    case "ok":
      return "";
  }
}

/** The link indicator's words. */
export function linkText(l: LinkState, access: Access): string {
  if (access !== "ok") return "Not signed in";
  return { connecting: "Connecting…", connected: "Connected", reconnecting: "Reconnecting…", offline: "Offline" }[l];
}

/** Whether the page has lost the server (events and answers cannot arrive). */
export function connectionLost(l: LinkState): boolean {
  return l === "reconnecting" || l === "offline";
}

/**
 * How a turn's end reads. The server ends every open turn as CANCELLED when
 * it shuts down; only a cancel this page asked for reads "Cancelled".
 */
export function doneText(reason: TurnDoneReason, detail: string, cancelledHere: boolean): string {
  switch (reason) {
    case TurnDoneReason.CANCELLED:
      return cancelledHere ? "Cancelled" : "Interrupted: the server or another client stopped this turn";
    case TurnDoneReason.ERROR:
      return "Ended by an error";
    case TurnDoneReason.MAX_ITERATIONS:
      return "Stopped: the tool-iteration limit was reached";
    case TurnDoneReason.DEADLINE:
      return "Stopped: the turn's deadline passed";
    case TurnDoneReason.INTERRUPTED:
      return "Interrupted: the orchestrator running it was lost";
    case TurnDoneReason.BUDGET:
      return detail ? `Stopped: ${detail}` : "Stopped: a budget was reached";
    default:
      return "Ended";
  }
}

function trim(n: number): string {
  return Number.isInteger(n) ? String(n) : n.toFixed(1);
}

/** "4.2 s", "3 min 05 s". */
export function formatDuration(ms: number): string {
  if (!Number.isFinite(ms) || ms < 0) return "–";
  if (ms < 10_000) return `${(ms / 1000).toFixed(1)} s`;
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(m / 60)} h ${String(m % 60).padStart(2, "0")} min`;
}

/** "40% · 8/20 it · eta 2.4 s"; a bar whose call no longer runs shows no eta. */
export function barText(b: Bar, running: boolean): string {
  const pct = Math.round(b.percent);
  const unit = b.unit ? ` ${b.unit}` : "";
  const count = b.total > 0 ? `${trim(b.current)}/${trim(b.total)}${unit}` : `${trim(b.current)}${unit}`;
  const tail = b.done ? " · done" : running && b.etaS > 0 ? ` · eta ${formatDuration(b.etaS * 1000)}` : running ? "" : " · stopped";
  return `${pct}% · ${count}${tail}`;
}
