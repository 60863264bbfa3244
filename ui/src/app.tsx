// The page: sessions on the side; agent cards, settings, the conversation
// and the composer in the middle; the approval dialog over it.

import { useCallback, useEffect, useLayoutEffect, useMemo, useRef, useState } from "preact/hooks";
import { Code, ConnectError } from "@connectrpc/connect";
import type { AgentInfo, ClientConfig, SessionSummary } from "./gen/omicos/v1/orchestrator_pb";
import { Decision, PermissionMode } from "./gen/omicos/v1/common_pb";
import { attachSource, describeError, isUnreachable, orchestrator, web } from "./api";
import { emptyConversation, type Conversation, type PendingApproval } from "./state/conversation";
import { Follower, type LinkState } from "./state/follow";
import { chooseActive, toggleMember, type TeamChoice } from "./state/catalog";
import { AgentCards } from "./ui/cards";
import { ChatLog } from "./ui/chat";
import { ApprovalDialog } from "./ui/approval";
import { SessionList } from "./ui/sessions";
import { SettingsPanel, type Settings } from "./ui/settings";

const DEFAULT_HEARTBEAT_S = 15;

function load<T>(key: string, fallback: T): T {
  try {
    const v = localStorage.getItem(key);
    return v ? ({ ...fallback, ...JSON.parse(v) } as T) : fallback;
  } catch {
    return fallback;
  }
}

function save(key: string, v: unknown): void {
  try {
    localStorage.setItem(key, JSON.stringify(v));
  } catch {
    // Private mode: settings last for this page only.
  }
}

/** The session in the address (`/s/<id>`), if any. */
function routeSession(): string | null {
  const m = /^\/s\/([^/]+)\/?$/.exec(location.pathname);
  return m ? decodeURIComponent(m[1]!) : null;
}

function modeName(m: PermissionMode): string {
  return m === PermissionMode.READ_ONLY ? "read_only" : m === PermissionMode.FULL ? "full" : "auto";
}

/** Collects state updates and hands them over once per frame: streams are fast, paint is not. */
function useFrameState<T>(initial: T): [T, (v: T) => void] {
  const [v, setV] = useState(initial);
  const pending = useRef<{ v: T } | null>(null);
  const set = useCallback((next: T) => {
    const first = pending.current === null;
    pending.current = { v: next };
    if (first) {
      requestAnimationFrame(() => {
        const p = pending.current;
        pending.current = null;
        if (p) setV(p.v);
      });
    }
  }, []);
  return [v, set];
}

export function App() {
  const [sessionId, setSessionId] = useState<string | null>(routeSession());
  const [conv, setConv] = useFrameState<Conversation>(emptyConversation(sessionId ?? ""));
  const [agents, setAgents] = useState<AgentInfo[]>([]);
  const [tier, setTier] = useState("");
  const [config, setConfig] = useState<ClientConfig | null>(null);
  const [sessions, setSessions] = useState<SessionSummary[]>([]);
  const [settings, setSettingsState] = useState<Settings>(load("omicos.settings", { mode: "auto", provider: "", model: "" }));
  const [team, setTeamState] = useState<TeamChoice>(load("omicos.team", { active: "", members: [] }));
  const [draft, setDraft] = useState("");
  const [notice, setNotice] = useState<string | null>(null);
  const [streamLink, setStreamLink] = useState<LinkState | null>(null);
  const [pingLink, setPingLink] = useState<LinkState>("connecting");
  const [approvalsHidden, setApprovalsHidden] = useState(false);
  const [showCards, setShowCards] = useState(sessionId === null);
  const [sending, setSending] = useState(false);
  const follower = useRef<Follower | null>(null);
  const composer = useRef<HTMLTextAreaElement>(null);
  const heardAt = useRef(0);
  const mainRef = useRef<HTMLElement>(null);
  /** Whether the view follows new output (the reader is at the bottom). */
  const stick = useRef(true);

  const heartbeatMs = (config?.heartbeatSecs || DEFAULT_HEARTBEAT_S) * 1000;

  const setSettings = (s: Settings) => {
    setSettingsState(s);
    save("omicos.settings", s);
  };
  const setTeam = (t: TeamChoice) => {
    setTeamState(t);
    save("omicos.team", t);
  };

  const refreshSessions = useCallback(async () => {
    try {
      const r = await orchestrator.listSessions({ limit: 50 });
      setSessions(r.sessions);
      heardAt.current = Date.now();
      setPingLink("connected");
    } catch (e) {
      setPingLink(isUnreachable(e) ? "offline" : "connected");
    }
  }, []);

  // The catalog, the settings the server offers, the sessions.
  useEffect(() => {
    orchestrator
      .listAgents({})
      .then((r) => {
        setAgents(r.agents);
        setTier(r.deploymentTier);
      })
      .catch((e) => setNotice(`Could not load the agents: ${describeError(e)}`));
    web
      .getClientConfig({})
      .then((c) => {
        setConfig(c);
        if (!localStorage.getItem("omicos.settings") && c.defaultPermissionMode !== PermissionMode.UNSPECIFIED) {
          setSettingsState((s) => ({ ...s, mode: modeName(c.defaultPermissionMode) }));
        }
      })
      // An orchestrator without it still serves the page: no overrides offered.
      .catch(() => setConfig(null));
    void refreshSessions();
  }, [refreshSessions]);

  // Honest "connected": a ping when nothing has been heard for a heartbeat period.
  useEffect(() => {
    const t = setInterval(() => {
      if (Date.now() - heardAt.current >= heartbeatMs) void refreshSessions();
    }, Math.max(2000, heartbeatMs / 2));
    return () => clearInterval(t);
  }, [heartbeatMs, refreshSessions]);

  // One follower per open session: replay from seq 0, then follow.
  useEffect(() => {
    follower.current?.close();
    follower.current = null;
    setStreamLink(null);
    setConv(emptyConversation(sessionId ?? ""));
    if (!sessionId) return;
    const f = new Follower(attachSource, sessionId, {
      onState: (c) => {
        heardAt.current = Date.now();
        setPingLink("connected");
        setConv(c);
      },
      onLink: (l) => {
        if (l === "connected") {
          heardAt.current = Date.now();
          setPingLink("connected");
        }
        setStreamLink(l);
      },
      onFatal: (e: ConnectError) => {
        setNotice(e.code === Code.NotFound ? `Session ${sessionId} does not exist.` : `Cannot open the session: ${describeError(e)}`);
      },
      stallMs: heartbeatMs * 2 + 5000,
    });
    follower.current = f;
    f.follow();
    return () => f.close();
  }, [sessionId, heartbeatMs, setConv]);

  useEffect(() => {
    const onPop = () => setSessionId(routeSession());
    addEventListener("popstate", onPop);
    return () => removeEventListener("popstate", onPop);
  }, []);

  // New output scrolls into view while the reader is at the bottom; scrolling up stops that.
  useLayoutEffect(() => {
    const m = mainRef.current;
    if (m && stick.current) m.scrollTop = m.scrollHeight;
  }, [conv]);

  // A turn that ends changes its session's last activity (and maybe its title).
  const wasLive = useRef(false);
  useEffect(() => {
    if (wasLive.current && conv.live === null) void refreshSessions();
    wasLive.current = conv.live !== null;
  }, [conv.live, refreshSessions]);

  // New approvals bring the dialog back.
  const approvalCount = conv.approvals.length;
  useEffect(() => {
    if (approvalCount > 0) setApprovalsHidden(false);
  }, [approvalCount]);

  const open = (id: string | null) => {
    history.pushState(null, "", id ? `/s/${encodeURIComponent(id)}` : "/");
    setSessionId(id);
    setShowCards(id === null);
    setNotice(null);
  };

  const live = conv.live !== null;

  const send = async (e?: Event) => {
    e?.preventDefault();
    const message = draft.trim();
    if (!message || live || sending) return;
    setSending(true);
    setNotice(null);
    try {
      const r = await web.startTurn({
        sessionId: sessionId ?? "",
        message,
        agent: team.active,
        teamMembers: team.members,
        permissionMode: settings.mode,
        model: config?.modelOverride ? settings.model : "",
        provider: config?.modelOverride ? settings.provider : "",
      });
      setDraft("");
      setShowCards(false);
      if (r.sessionId !== sessionId) {
        open(r.sessionId);
      } else {
        follower.current?.follow();
      }
      void refreshSessions();
    } catch (err) {
      setNotice(`The turn did not start: ${describeError(err)}`);
    } finally {
      setSending(false);
    }
  };

  const cancel = async () => {
    if (!sessionId) return;
    try {
      const r = await orchestrator.cancelTurn({ sessionId });
      if (!r.cancelled) setNotice("Nothing to cancel: the turn had already ended.");
    } catch (err) {
      setNotice(`Cancel failed: ${describeError(err)}`);
    }
  };

  /** Answers an approval; resolves to the server's reason when it refused the rule (the call still waits). */
  const decide = async (a: PendingApproval, decision: Decision, rule = ""): Promise<string | null> => {
    if (!sessionId) return null;
    try {
      await orchestrator.approveTool({ sessionId, callId: a.callId, decision, rule });
    } catch (err) {
      const ce = ConnectError.from(err);
      // The call still waits: the dialog says why, and it can be answered again.
      if (rule && ce.code === Code.InvalidArgument) return ce.rawMessage.replace(/^rule:\s*/, "");
      setNotice(
        ce.code === Code.NotFound
          ? `The approval for ${a.toolName} was no longer pending (answered elsewhere, or timed out).`
          : `The decision was not delivered: ${describeError(err)}`,
      );
    }
    composer.current?.focus();
    return null;
  };

  const pickPrompt = (a: AgentInfo, p: string) => {
    setTeam(chooseActive(team, a));
    setDraft(p);
    composer.current?.focus();
  };

  // A follower that is (re)connecting says so; otherwise what was last heard:
  // stream events and heartbeats, or the ping that runs when they are quiet.
  const link: LinkState = streamLink && streamLink !== "connected" ? streamLink : pingLink;
  const linkText = useMemo(
    () => ({ connecting: "Connecting…", connected: "Connected", reconnecting: "Reconnecting…", offline: "Offline" })[link],
    [link],
  );
  const title = sessions.find((s) => s.sessionId === sessionId)?.title || (sessionId ? "Session" : "New chat");

  return (
    <div class="layout">
      <a class="skip" href="#composer">
        Skip to the message box
      </a>
      <aside class="side">
        <SessionList sessions={sessions} current={sessionId} onOpen={open} onNew={() => open(null)} />
      </aside>
      <div class="main-col">
        <header class="top">
          <h1>
            <span aria-hidden="true">◆ </span>omicos <span class="muted title">· {title}</span>
          </h1>
          <div class="top-right">
            <span class={`link link-${link}`} role="status" data-testid="link" data-link={link}>
              <span class="dot" aria-hidden="true" />
              {linkText}
            </span>
            <SettingsPanel settings={settings} config={config} onChange={setSettings} />
          </div>
        </header>
        <main
          class="main"
          id="main"
          ref={mainRef}
          onScroll={(e) => {
            const m = e.currentTarget;
            stick.current = m.scrollHeight - m.scrollTop - m.clientHeight < 80;
          }}
        >
          <section class="agents" aria-labelledby="agents-title">
            <div class="agents-head">
              <h2 id="agents-title">Agents</h2>
              <button type="button" aria-expanded={showCards} aria-controls="agent-cards" onClick={() => setShowCards(!showCards)}>
                {showCards ? "Hide agents" : "Choose agents"}
              </button>
            </div>
            <div id="agent-cards" hidden={!showCards}>
              <AgentCards
                agents={agents}
                tier={tier}
                team={team}
                onActive={(a) => setTeam(chooseActive(team, a))}
                onToggle={(a) => setTeam(toggleMember(team, a))}
                onPrompt={pickPrompt}
              />
            </div>
          </section>
          <ChatLog conv={conv} />
          {approvalCount > 0 && approvalsHidden && (
            <button type="button" class="pending" onClick={() => setApprovalsHidden(false)}>
              {approvalCount} approval{approvalCount > 1 ? "s" : ""} waiting
            </button>
          )}
        </main>
        <div class="notice" role="alert" data-testid="notice">
          {notice}
        </div>
        <form class="composer" onSubmit={send} aria-label="Message">
          <label for="composer" class="visually-hidden">
            Message{team.active ? ` to ${team.active}` : ""}
          </label>
          <textarea
            id="composer"
            ref={composer}
            rows={3}
            value={draft}
            placeholder={team.active ? `Message ${team.active}… (Enter sends, Shift+Enter: new line)` : "Message… (Enter sends, Shift+Enter: new line)"}
            onInput={(e) => setDraft(e.currentTarget.value)}
            onKeyDown={(e) => {
              if (e.key === "Enter" && !e.shiftKey && !e.isComposing) void send(e);
            }}
          />
          <div class="composer-actions">
            {live ? (
              <button type="button" class="danger" onClick={cancel}>
                Cancel turn
              </button>
            ) : null}
            <button type="submit" class="primary" disabled={!draft.trim() || live || sending}>
              Send
            </button>
          </div>
        </form>
      </div>
      <ApprovalDialog queue={conv.approvals} hidden={approvalsHidden} onDecide={decide} onHide={() => setApprovalsHidden(true)} />
    </div>
  );
}
