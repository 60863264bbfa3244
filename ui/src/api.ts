// The page's clients: gRPC-web to the orchestrator that served the page.
//
// Unary calls and server streams only (a browser cannot hold a bidi
// stream): OrchestratorWeb/StartTurn starts a turn, Orchestrator/Attach
// follows it, ApproveTool and CancelTurn answer it.

import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { Orchestrator, OrchestratorWeb, type ValueRef } from "./gen/omicos/v1/orchestrator_pb";
import type { AttachSource } from "./state/follow";

/**
 * The bearer token: `omicos up` prints the page's URL as `…/#token=<token>`.
 * The fragment never reaches a server (not in requests, logs or Referer); the
 * page moves it into sessionStorage (this tab only) and drops it from the
 * address bar, so a reload or a shared link does not carry it.
 */
function bearerToken(): string | null {
  const loc = globalThis.location;
  const store = globalThis.sessionStorage;
  const m = loc?.hash.match(/(?:^#|&)token=([^&]+)/);
  if (m && store) {
    store.setItem("omicos.token", decodeURIComponent(m[1]));
    globalThis.history?.replaceState(null, "", loc.pathname + loc.search);
  }
  return store?.getItem("omicos.token") ?? null;
}

const token = bearerToken();

/** Whether the page holds a token to send. */
export function hasToken(): boolean {
  return !!token;
}

/** Keeps a token the person pasted (this tab only); the page reloads to use it. */
export function saveToken(t: string): void {
  globalThis.sessionStorage?.setItem("omicos.token", t.trim());
}

// An <img src="/files/…"> cannot send the header: the same token goes in a
// cookie that only this origin's /files/ requests carry (SameSite=Strict).
if (token && globalThis.document) {
  const secure = globalThis.location?.protocol === "https:" ? "; Secure" : "";
  globalThis.document.cookie = `omicos_token=${encodeURIComponent(token)}; Path=/files/; SameSite=Strict${secure}`;
}

const transport = createGrpcWebTransport({
  // Same origin: the orchestrator serves the page and gRPC-web on one port.
  baseUrl: globalThis.location?.origin ?? "http://127.0.0.1:7000",
  useBinaryFormat: true,
  interceptors: [
    (next) => async (req) => {
      if (token) req.header.set("authorization", `Bearer ${token}`);
      return next(req);
    },
  ],
});

/** Sessions, agents, Attach, approvals, cancel. */
export const orchestrator = createClient(Orchestrator, transport);
/** StartTurn and the client settings. */
export const web = createClient(OrchestratorWeb, transport);

/** Attach as the follower uses it. */
export const attachSource: AttachSource = {
  attach: (sessionId, sinceSeq, signal) => orchestrator.attach({ sessionId, sinceSeq: BigInt(sinceSeq) }, { signal }),
};

/**
 * A value an event or a session read carries cut, whole: ReadValue's
 * chunks (at most 1 MiB each) joined into one Blob.
 */
export async function readWholeValue(sessionId: string, value: ValueRef): Promise<Blob> {
  const parts: Uint8Array<ArrayBuffer>[] = [];
  for await (const chunk of orchestrator.readValue({ sessionId, value })) {
    parts.push(new Uint8Array(chunk.data));
  }
  return new Blob(parts, { type: "text/plain;charset=utf-8" });
}

/** A call's failure as a person reads it: the status name and the server's words. */
export function describeError(e: unknown): string {
  const ce = ConnectError.from(e);
  return `${Code[ce.code] ?? "Error"}: ${ce.rawMessage}`;
}

/** Whether a failure says the server could not be reached (not that it refused). */
export function isUnreachable(e: unknown): boolean {
  const code = ConnectError.from(e).code;
  return code === Code.Unavailable || code === Code.Unknown || code === Code.DeadlineExceeded;
}
