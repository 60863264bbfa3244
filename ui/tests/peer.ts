// A scripted orchestrator for the page's own browser run (`npm run
// test:peer`): real gRPC-web over HTTP/1.1 (connect-node), the page from
// dist/, and /files/ from a temporary workspace, with the server semantics
// the page relies on: a gap-free event_seq log per session; Attach replays
// after since_seq, then follows the live turn until TurnDone, with
// heartbeats; StartTurn returns once TurnStarted is logged; ApproveTool and
// CancelTurn act on the running turn. Its turns play tests/stack-script.json,
// so browser.test.ts runs unchanged here and against the real stack. It
// checks the page, not the orchestrator: the real stack is what
// scripts/ui-test.sh is for.

import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { extname, join, normalize } from "node:path";
import { deflateSync } from "node:zlib";
import { EventEmitter, once } from "node:events";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import {
  AgentInfoSchema,
  ChatEventSchema,
  Orchestrator,
  OrchestratorWeb,
  SessionSummarySchema,
  TurnDoneReason,
  type ChatEvent,
  type ChatRequest,
} from "../src/gen/omicos/v1/orchestrator_pb";
import { Decision, PermissionMode, Risk, ToolStatus } from "../src/gen/omicos/v1/common_pb";

type Kind = NonNullable<MessageInitShape<typeof ChatEventSchema>["kind"]>;

interface Reply {
  text: string;
  chunks: number;
  chunk_delay_ms: number;
  tool_calls: { id: string; name: string; arguments: unknown }[];
}

const SCRIPT = JSON.parse(readFileSync(join(import.meta.dirname, "stack-script.json"), "utf8")) as { replies: (Reply & { turn: number })[] };
const HEARTBEAT_S = 2;

/** A small real PNG (a gradient), written the way a kernel's plot would be. */
function png(w = 64, h = 48): Buffer {
  const table = Array.from({ length: 256 }, (_, n) => {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    return c >>> 0;
  });
  const crc = (b: Buffer) => {
    let c = 0xffffffff;
    for (const x of b) c = table[(c ^ x) & 0xff]! ^ (c >>> 8);
    return (c ^ 0xffffffff) >>> 0;
  };
  const chunk = (type: string, data: Buffer) => {
    const td = Buffer.concat([Buffer.from(type, "ascii"), data]);
    const len = Buffer.alloc(4);
    len.writeUInt32BE(data.length);
    const sum = Buffer.alloc(4);
    sum.writeUInt32BE(crc(td));
    return Buffer.concat([len, td, sum]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0);
  ihdr.writeUInt32BE(h, 4);
  ihdr.set([8, 2, 0, 0, 0], 8);
  const rows: number[] = [];
  for (let y = 0; y < h; y++) {
    rows.push(0);
    for (let x = 0; x < w; x++) rows.push(Math.floor((255 * x) / w), Math.floor((255 * y) / h), 160);
  }
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk("IHDR", ihdr),
    chunk("IDAT", deflateSync(Buffer.from(rows))),
    chunk("IEND", Buffer.alloc(0)),
  ]);
}

class Session {
  readonly events: ChatEvent[] = [];
  readonly bus = new EventEmitter();
  live: string | null = null;
  turns = 0;
  title = "";
  agent = "";
  lastActive = Date.now();
  readonly approvals = new Map<string, { tool: string; args: Record<string, unknown>; resolve: (d: Decision, rule: string) => void }>();
  /** Tools and rules allowed for the rest of the session. */
  readonly grants: string[] = [];
  cancel: AbortController | null = null;
  constructor(readonly id: string) {
    this.bus.setMaxListeners(100);
  }

  emit(turnId: string, kind: Kind, ctx = "root", agent = "data_analyst"): ChatEvent {
    const ev = create(ChatEventSchema, {
      sessionId: this.id,
      turnId,
      eventSeq: BigInt(this.events.length + 1),
      executionContextId: ctx,
      agentId: agent,
      timestampMs: BigInt(Date.now()),
      kind,
    });
    this.events.push(ev);
    this.lastActive = Date.now();
    this.bus.emit("event", ev);
    return ev;
  }
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(t);
      resolve();
    }, { once: true });
  });
}

/**
 * A small stand-in for the server's rule check (services/rules): a bare
 * tool, `tool(dir/**)` or `tool(/file)` against the call's `path`. Null when
 * the rule grants the call; otherwise why not, in the server's words.
 */
function ruleRefusal(rule: string, tool: string, args: Record<string, unknown>): string | null {
  const m = /^([\w-]+)(?:\((.*)\))?$/.exec(rule.trim());
  if (!m) return `permission rule \`${rule}\`: the specifier must end with \`)\``;
  if (m[1] !== tool) return `the rule \`${rule}\` must name the approved tool \`${tool}\` exactly`;
  const spec = m[2];
  if (spec === undefined || spec === "*") return null;
  const path = String(args.path ?? "").replace(/^\.\//, "");
  const ok = spec.endsWith("/**") ? path.startsWith(`${spec.slice(0, -3).replace(/^\//, "")}/`) : path === spec.replace(/^\//, "");
  return ok ? null : `the rule \`${rule}\` does not match the approved call`;
}

/** Starts the peer on 127.0.0.1; returns its URL and a stop function. */
export async function startPeer(distDir: string): Promise<{ url: string; stop: () => Promise<void> }> {
  const workspace = mkdtempSync(join(tmpdir(), "omicos-ui-peer-"));
  const sessions = new Map<string, Session>();
  let nextId = 1;
  /** Turns across all sessions: the script's `turn` numbers count them so. */
  let turnsPlayed = 0;

  async function play(s: Session, turnId: string, replies: Reply[], signal: AbortSignal): Promise<void> {
    let n = 0;
    for (const r of replies) {
      const words = r.text.match(new RegExp(`[\\s\\S]{1,${Math.max(1, Math.ceil(r.text.length / r.chunks))}}`, "g")) ?? [];
      for (const w of words) {
        if (signal.aborted) return;
        s.emit(turnId, { case: "textDelta", value: { text: w } });
        await sleep(r.chunk_delay_ms, signal);
      }
      for (const call of r.tool_calls) {
        const args = JSON.stringify(call.arguments);
        const callArgs = call.arguments as Record<string, unknown>;
        s.emit(turnId, { case: "toolCallStarted", value: { callId: call.id, name: call.name, arguments: args } });
        const started = Date.now();
        const write = call.name === "file_manager__write";
        if (!s.grants.some((g) => ruleRefusal(g, call.name, callArgs) === null)) {
          const summary = write ? `Write ${String(callArgs.path)}` : `Run Python code (${args.length} characters) in the session's kernel`;
          s.emit(turnId, { case: "toolApprovalRequest", value: { callId: call.id, toolName: call.name, risk: write ? Risk.FILE_WRITE : Risk.PYTHON, summary, arguments: args } });
          const decision = await new Promise<Decision | null>((resolve) => {
            s.approvals.set(call.id, {
              tool: call.name,
              args: callArgs,
              resolve: (d, rule) => {
                if (d === Decision.ALLOW_SESSION) s.grants.push(rule || call.name);
                resolve(d);
              },
            });
            signal.addEventListener("abort", () => resolve(null), { once: true });
          });
          s.approvals.delete(call.id);
          if (decision === null) return;
          s.emit(turnId, { case: "toolApprovalResolved", value: { callId: call.id, decision, source: "client" } });
          if (decision === Decision.DENY) {
            s.emit(turnId, { case: "toolCallFinished", value: { callId: call.id, name: call.name, status: ToolStatus.ERROR, result: "denied by user", elapsedMs: BigInt(Date.now() - started) } });
            continue;
          }
        }
        if (write) {
          const result = `wrote ${String(callArgs.content ?? "").length} bytes to ${String(callArgs.path)}`;
          s.emit(turnId, { case: "toolCallFinished", value: { callId: call.id, name: call.name, status: ToolStatus.DONE, result, elapsedMs: BigInt(Date.now() - started) } });
          continue;
        }
        const code = (call.arguments as { code: string }).code;
        if (code.includes("tqdm")) {
          for (let i = 0; i <= 20; i++) {
            if (signal.aborted) return;
            s.emit(turnId, { case: "toolProgress", value: { callId: call.id, progress: { barId: "0", label: "counting", current: i, total: 20, percent: i * 5, elapsedS: i * 0.15, etaS: (20 - i) * 0.15, unit: "it", done: i === 20 } } });
            await sleep(150, signal);
          }
          const rel = `.omicos/outputs/${s.id}/${Date.now()}_${call.id}_1.png`;
          mkdirSync(join(workspace, ".omicos/outputs", s.id), { recursive: true });
          writeFileSync(join(workspace, rel), png());
          s.emit(turnId, { case: "toolOutputChunk", value: { callId: call.id, chunk: { stream: "stdout", text: "plotted\n" } } });
          const result = JSON.stringify({ status: "done", result: JSON.stringify({ stdout: "plotted\n", stderr: "", display_data: [{ "text/plain": "<IPython.core.display.Image object>", png_path: rel }] }) });
          s.emit(turnId, { case: "toolCallFinished", value: { callId: call.id, name: call.name, status: ToolStatus.DONE, result, elapsedMs: BigInt(Date.now() - started) } });
        } else if (!code.includes("range(1200)")) {
          const out = code.match(/print\("([^"]*)"\)/)?.[1] ?? "";
          s.emit(turnId, { case: "toolOutputChunk", value: { callId: call.id, chunk: { stream: "stdout", text: `${out}\n` } } });
          const result = JSON.stringify({ status: "done", result: JSON.stringify({ stdout: `${out}\n`, stderr: "" }) });
          s.emit(turnId, { case: "toolCallFinished", value: { callId: call.id, name: call.name, status: ToolStatus.DONE, result, elapsedMs: BigInt(Date.now() - started) } });
        } else {
          for (let i = 0; !signal.aborted; i++) {
            s.emit(turnId, { case: "toolOutputChunk", value: { callId: call.id, chunk: { stream: "stdout", text: `${i}\n` } } });
            await sleep(250, signal);
          }
          s.emit(turnId, { case: "toolCallFinished", value: { callId: call.id, name: call.name, status: ToolStatus.ERROR, result: "cancelled", elapsedMs: BigInt(Date.now() - started) } });
          return;
        }
      }
      n++;
    }
    if (n) s.emit(turnId, { case: "usage", value: { inputTokens: 1200n, outputTokens: 80n, model: "scripted" } });
  }

  const routes = (router: ConnectRouter) => {
    router.service(OrchestratorWeb, {
      async startTurn(req: ChatRequest) {
        if (!req.message.trim()) throw new ConnectError("message is empty", Code.InvalidArgument);
        let s: Session | undefined;
        if (req.sessionId) {
          s = sessions.get(req.sessionId);
          if (!s) throw new ConnectError(`session \`${req.sessionId}\` does not exist`, Code.NotFound);
        } else {
          s = new Session(`peer-${nextId++}`);
          s.title = req.message.slice(0, 60);
          sessions.set(s.id, s);
        }
        if (s.live) throw new ConnectError(`session \`${s.id}\` is running turn ${s.live}`, Code.FailedPrecondition);
        s.turns += 1;
        turnsPlayed += 1;
        const turnNo = turnsPlayed;
        s.agent = req.agent;
        const turnId = `${s.id}-t${s.turns}`;
        const mode = req.permissionMode === "full" ? PermissionMode.FULL : req.permissionMode === "read_only" ? PermissionMode.READ_ONLY : PermissionMode.AUTO;
        const start = s.emit(turnId, { case: "turnStarted", value: { message: req.message, agent: req.agent, teamMembers: req.teamMembers, permissionMode: mode } });
        s.live = turnId;
        const ac = new AbortController();
        s.cancel = ac;
        const replies = SCRIPT.replies.filter((r) => r.turn === turnNo);
        const session = s;
        void play(session, turnId, replies, ac.signal).then(() => {
          session.emit(turnId, { case: "turnDone", value: { reason: ac.signal.aborted ? TurnDoneReason.CANCELLED : TurnDoneReason.COMPLETED } });
          session.live = null;
        });
        return { sessionId: s.id, turnId, startSeq: start.eventSeq };
      },
      async getClientConfig() {
        return { providers: ["replay", "openai"], defaultModel: "scripted", modelOverride: true, defaultPermissionMode: PermissionMode.READ_ONLY, deploymentTier: "community", heartbeatSecs: HEARTBEAT_S };
      },
    });
    router.service(Orchestrator, {
      async *attach(req, ctx) {
        const s = sessions.get(req.sessionId);
        if (!s) throw new ConnectError(`session \`${req.sessionId}\` does not exist`, Code.NotFound);
        let last = Number(req.sinceSeq);
        const queue: ChatEvent[] = [];
        const wake = new EventEmitter();
        const onEvent = (ev: ChatEvent) => {
          queue.push(ev);
          wake.emit("x");
        };
        const following = s.live;
        s.bus.on("event", onEvent);
        try {
          for (const ev of s.events.filter((e) => Number(e.eventSeq) > last)) {
            last = Number(ev.eventSeq);
            yield ev;
          }
          if (!following) return;
          while (!ctx.signal.aborted) {
            while (queue.length) {
              const ev = queue.shift()!;
              if (Number(ev.eventSeq) <= last) continue;
              last = Number(ev.eventSeq);
              yield ev;
              if (ev.kind.case === "turnDone" && ev.turnId === following) return;
            }
            const hb = sleep(HEARTBEAT_S * 1000, ctx.signal).then(() => "hb");
            const got = await Promise.race([once(wake, "x").then(() => "ev"), hb]);
            if (got === "hb" && !queue.length) {
              yield create(ChatEventSchema, { sessionId: s.id, turnId: following, eventSeq: BigInt(last), executionContextId: "root", timestampMs: BigInt(Date.now()), kind: { case: "heartbeat", value: {} } });
            }
          }
        } finally {
          s.bus.off("event", onEvent);
        }
      },
      async cancelTurn(req) {
        const s = sessions.get(req.sessionId);
        if (!s?.live || !s.cancel) return { cancelled: false };
        s.cancel.abort();
        return { cancelled: true };
      },
      async approveTool(req) {
        const pending = sessions.get(req.sessionId)?.approvals.get(req.callId);
        if (!pending) throw new ConnectError(`no approval is pending for call \`${req.callId}\``, Code.NotFound);
        const rule = req.rule.trim();
        if (rule) {
          if (req.decision !== Decision.ALLOW_SESSION) throw new ConnectError("rule: a rule can only come with ALLOW_SESSION", Code.InvalidArgument);
          const why = ruleRefusal(rule, pending.tool, pending.args);
          if (why) throw new ConnectError(`rule: ${why}`, Code.InvalidArgument);
        }
        pending.resolve(req.decision, rule);
        return {};
      },
      async listAgents() {
        const a = (id: string, name: string, icon: string, category: string, order: number, summary: string, useWhen: string, prompts: string[], tier = "community", locked = false) =>
          create(AgentInfoSchema, { id, name, icon, category, categoryOrder: order, summary, useWhen, examplePrompts: prompts, tier, locked });
        return {
          deploymentTier: "community",
          agents: [
            a("coder", "Coder", "🛠️", "engineering", 3, "Reads, writes and tests code.", "Scripts, bugs, pipelines.", ["Add a --min-genes flag to scripts/qc.py."]),
            a("data_analyst", "Data Analyst", "📊", "data_analysis", 1, "Analyses data in a persistent Python kernel.", "Tables, statistics, plots.", ["Count to twenty and plot the squares.", "Compare two groups."]),
            a("generalist", "Generalist", "🧭", "general", 0, "Plans the work and delegates.", "When unsure which agent fits.", ["What should I do next with my h5ad file?"]),
            a("lab_robot", "Lab Robot", "🧪", "data_analysis", 1, "Drives the lab's instruments.", "Wet-lab runs.", ["Run plate 3."], "lab", true),
          ],
        };
      },
      async deleteSession(req) {
        const s = sessions.get(req.sessionId);
        if (!s) throw new ConnectError(`session \`${req.sessionId}\` does not exist`, Code.NotFound);
        s.cancel?.abort();
        sessions.delete(req.sessionId);
        return {};
      },
      async listSessions() {
        return {
          sessions: [...sessions.values()]
            .sort((x, y) => y.lastActive - x.lastActive)
            .map((s) => create(SessionSummarySchema, { sessionId: s.id, title: s.title, agent: s.agent, lastActiveMs: BigInt(s.lastActive), createdMs: BigInt(s.lastActive), lastEventSeq: BigInt(s.events.length) })),
        };
      },
    });
  };

  const MIME: Record<string, string> = { ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".png": "image/png", ".txt": "text/plain; charset=utf-8" };
  const send = (res: ServerResponse, path: string) => {
    res.writeHead(200, { "content-type": MIME[extname(path)] ?? "application/octet-stream" });
    res.end(readFileSync(path));
  };
  const fallback = (req: IncomingMessage, res: ServerResponse) => {
    const url = new URL(req.url ?? "/", "http://x");
    const path = decodeURIComponent(url.pathname);
    if (path.startsWith("/files/")) {
      const rel = normalize(path.slice("/files/".length));
      const full = join(workspace, rel);
      if ((rel.startsWith(".omicos/outputs/") || rel.startsWith(".omicos/tool_outputs/")) && existsSync(full) && statSync(full).isFile()) return send(res, full);
      res.writeHead(404).end();
      return;
    }
    const asset = join(distDir, normalize(path));
    if (path !== "/" && asset.startsWith(distDir) && existsSync(asset) && statSync(asset).isFile()) return send(res, asset);
    if (extname(path)) {
      res.writeHead(404).end();
      return;
    }
    send(res, join(distDir, "index.html"));
  };
  const grpcWeb = connectNodeAdapter({ routes, grpcWeb: true, connect: false, grpc: false });
  const server = createServer((req, res) => {
    if ((req.headers["content-type"] ?? "").startsWith("application/grpc-web")) grpcWeb(req, res);
    else fallback(req, res);
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const addr = server.address();
  if (!addr || typeof addr === "string") throw new Error("no address");
  return {
    url: `http://127.0.0.1:${addr.port}`,
    stop: async () => {
      for (const s of sessions.values()) s.cancel?.abort();
      server.closeAllConnections();
      server.close();
      rmSync(workspace, { recursive: true, force: true });
    },
  };
}
