// The page's clients: gRPC-web to the orchestrator that served the page.
//
// Unary calls and server streams only (a browser cannot hold a bidi
// stream): OrchestratorWeb/StartTurn starts a turn, Orchestrator/Attach
// follows it, ApproveTool and CancelTurn answer it.

import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { Orchestrator, OrchestratorWeb } from "./gen/omicos/v1/orchestrator_pb";
import type { AttachSource } from "./state/follow";

const transport = createGrpcWebTransport({
  // Same origin: the orchestrator serves the page and gRPC-web on one port.
  baseUrl: globalThis.location?.origin ?? "http://127.0.0.1:7000",
  useBinaryFormat: true,
});

/** Sessions, agents, Attach, approvals, cancel. */
export const orchestrator = createClient(Orchestrator, transport);
/** StartTurn and the client settings. */
export const web = createClient(OrchestratorWeb, transport);

/** Attach as the follower uses it. */
export const attachSource: AttachSource = {
  attach: (sessionId, sinceSeq, signal) => orchestrator.attach({ sessionId, sinceSeq: BigInt(sinceSeq) }, { signal }),
};

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
