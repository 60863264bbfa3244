// The page: sessions on the side; agent cards, settings, the conversation
// and the composer in the middle; the approval dialog over it.

import { useCallback, useEffect, useLayoutEffect, useMemo, useRef, useState } from "preact/hooks";
import { Code, ConnectError } from "@connectrpc/connect";
import type { AgentInfo, ClientConfig, SessionSummary } from "./gen/omicos/v1/orchestrator_pb";
import { Decision, PermissionMode } from "./gen/omicos/v1/common_pb";
import { attachSource, describeError, hasToken, isUnreachable, orchestrator, readWholeValue, saveToken, web } from "./api";
import { emptyConversation, type Conversation, type PendingApproval } from "./state/conversation";
import { Follower, type LinkState } from "./state/follow";
import { chooseActive, toggleMember, type TeamChoice } from "./state/catalog";
import { AgentCards } from "./ui/cards";
import { ChatLog } from "./ui/chat";
import { ApprovalDialog } from "./ui/approval";
import { SessionList } from "./ui/sessions";
import { SignIn } from "./ui/signin";
import { MODES, SettingsPanel, type Settings } from "./ui/settings";
import { accessFromCode, accessText, connectionLost, linkText as linkWords, type Access } from "./state/status-text";
import { composerTarget } from "./state/target";
import { carriedPrefix, parseHistory, type CarriedMessage } from "./state/carried";
import { overLimits, uploadFailure } from "./state/attachments";
import { FileChips, dragHasFiles, type PendingFile } from "./ui/attach";

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
  // Read only until the person or the server says otherwise: nothing runs with side effects by surprise.
  const [settings, setSettingsState] = useState<Settings>(load("omicos.settings", { mode: "read_only", provider: "", model: "" }));
  const [team, setTeamState] = useState<TeamChoice>(load("omicos.team", { active: "", members: [] }));
  /** Agents picked inside a session, by session: they hold there only. */
  const [picks, setPicks] = useState<Record<string, string>>(load("omicos.picks", {}));
  const [draft, setDraft] = useState("");
  /** Files chosen for the next message (the file picker, a drop, a paste): uploaded when it is sent. */
  const [files, setFiles] = useState<PendingFile[]>([]);
  const fileKey = useRef(0);
  const fileInput = useRef<HTMLInputElement>(null);
  /** Files are dragged over the conversation or the composer. */
  const [dropping, setDropping] = useState(false);
  /** A notice, and whether it is about reaching the server (then a reconnect clears it). */
  const [notice, setNoticeState] = useState<{ text: string; link: boolean } | null>(null);
  const setNotice = (text: string | null, link = false) => setNoticeState(text === null ? null : { text, link });
  const [access, setAccess] = useState<Access>("ok");
  const [drawer, setDrawer] = useState(false);
  /** Whether the page may still ask to send notifications (the browser has not been asked). */
  const [canAskNotify, setCanAskNotify] = useState(typeof Notification !== "undefined" && Notification.permission === "default");
  const [streamLink, setStreamLink] = useState<LinkState | null>(null);
  const [pingLink, setPingLink] = useState<LinkState>("connecting");
  const [approvalsHidden, setApprovalsHidden] = useState(false);
  const [showCards, setShowCards] = useState(sessionId === null);
  const [sending, setSending] = useState(false);
  /** The history GetSession holds for the open session (a fork's starts before its log does). */
  const [heldHistory, setHeldHistory] = useState<{ sessionId: string; messages: CarriedMessage[] } | null>(null);
  /** Sessions this page created with StartTurn: their log holds all their history. */
  const createdHere = useRef(new Set<string>());
  const follower = useRef<Follower | null>(null);
  const composer = useRef<HTMLTextAreaElement>(null);
  const heardAt = useRef(0);
  const mainRef = useRef<HTMLElement>(null);
  const pendingRef = useRef<HTMLButtonElement>(null);
  /** Whether the view follows new output (the reader is at the bottom). */
  const stick = useRef(true);
  /** Turns held when Send was pressed: the next one is brought into view, wherever the reader was. */
  const sentAt = useRef<number | null>(null);
  /** Turns this page cancelled (kept across reloads): only those read "Cancelled". */
  const [cancelledHere, setCancelledHere] = useState<string[]>(load<{ ids: string[] }>("omicos.cancelled", { ids: [] }).ids);

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
      const a = accessFromCode(ConnectError.from(e).code, hasToken());
      if (a) setAccess(a);
      else setPingLink(isUnreachable(e) ? "offline" : "connected");
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
      .catch((e) => {
        const a = accessFromCode(ConnectError.from(e).code, hasToken());
        if (a) setAccess(a);
        else setNotice(`Could not load the agents: ${describeError(e)}`, isUnreachable(e));
      });
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

  // Honest "connected": a ping when nothing has been heard for a heartbeat
  // period. A refused token is not retried: it will not mend by itself.
  useEffect(() => {
    if (access !== "ok") return;
    const t = setInterval(() => {
      if (Date.now() - heardAt.current >= heartbeatMs) void refreshSessions();
    }, Math.max(2000, heartbeatMs / 2));
    return () => clearInterval(t);
  }, [heartbeatMs, refreshSessions, access]);

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
        const a = accessFromCode(e.code, hasToken());
        if (a) return setAccess(a);
        setNotice(e.code === Code.NotFound ? `Session ${sessionId} does not exist.` : `Cannot open the session: ${describeError(e)}`);
      },
      stallMs: heartbeatMs * 2 + 5000,
    });
    follower.current = f;
    f.follow();
    return () => f.close();
  }, [sessionId, heartbeatMs, setConv]);

  // A session's history as the model sees it: a fork holds its parent's up
  // to the fork point without the parent's events, shown above its own turns.
  // Read again when the log's first turn changes (a fork's first own turn, a
  // rewind), so that turn's message places the carried part; the old copy
  // stays shown meanwhile (the view only uses a copy of the open session).
  const firstTurn = conv.turns[0]?.id ?? "";
  useEffect(() => {
    if (!sessionId || createdHere.current.has(sessionId)) return;
    let stale = false;
    orchestrator
      .getSession({ sessionId })
      .then((s) => {
        if (!stale) setHeldHistory({ sessionId, messages: parseHistory(s.messagesJson) });
      })
      // The log still shows the session; only what a fork carried over is missing.
      .catch(() => {});
    return () => {
      stale = true;
    };
  }, [sessionId, firstTurn]);

  // The browser knows when the network goes: say so at once, and try again the moment it is back.
  useEffect(() => {
    const down = () => {
      setPingLink("offline");
      follower.current?.dropLink();
    };
    const up = () => {
      follower.current?.follow();
      void refreshSessions();
    };
    addEventListener("offline", down);
    addEventListener("online", up);
    return () => {
      removeEventListener("offline", down);
      removeEventListener("online", up);
    };
  }, [refreshSessions]);

  useEffect(() => {
    const onPop = () => setSessionId(routeSession());
    addEventListener("popstate", onPop);
    return () => removeEventListener("popstate", onPop);
  }, []);

  // New output scrolls into view while the reader is at the bottom; scrolling
  // up stops that, and Send starts it again. Nothing to follow (the cards):
  // the view stays where it opened, at the top.
  useLayoutEffect(() => {
    const m = mainRef.current;
    if (!m || conv.turns.length === 0) return;
    if (sentAt.current !== null && conv.turns.length > sentAt.current) {
      sentAt.current = null;
      stick.current = true;
    }
    if (stick.current) m.scrollTop = m.scrollHeight;
  }, [conv]);

  // A turn that ends changes its session's last activity (and maybe its title).
  const wasLive = useRef(false);
  useEffect(() => {
    if (wasLive.current && conv.live === null) void refreshSessions();
    wasLive.current = conv.live !== null;
  }, [conv.live, refreshSessions]);

  // New approvals bring the dialog back, and a notification when the person allowed them.
  const approvalCount = conv.approvals.length;
  useEffect(() => {
    if (approvalCount > 0) setApprovalsHidden(false);
  }, [approvalCount]);
  const notified = useRef(new Set<string>());
  useEffect(() => {
    for (const a of conv.approvals) {
      if (notified.current.has(a.callId)) continue;
      notified.current.add(a.callId);
      if (typeof Notification !== "undefined" && Notification.permission === "granted") {
        try {
          new Notification(`omicos: allow ${a.toolName}?`, { body: a.summary, tag: a.callId });
        } catch {
          // Some browsers allow notifications only from a service worker.
        }
      }
    }
  }, [conv.approvals]);

  // A follower that is (re)connecting says so; otherwise what was last heard:
  // stream events and heartbeats, or the ping that runs when they are quiet.
  const link: LinkState = streamLink && streamLink !== "connected" ? streamLink : pingLink;

  // A reconnect clears what was said about the server being out of reach.
  const prevLink = useRef(link);
  useEffect(() => {
    if (link === "connected" && prevLink.current !== "connected") setNoticeState((n) => (n?.link ? null : n));
    prevLink.current = link;
  }, [link]);

  // Put aside, the questions leave focus on the button that brings them back.
  useEffect(() => {
    if (approvalsHidden) pendingRef.current?.focus();
  }, [approvalsHidden]);

  // Escape closes the phone's sessions drawer.
  useEffect(() => {
    if (!drawer) return;
    const onKey = (e: KeyboardEvent) => {
      if (e.key === "Escape") {
        setDrawer(false);
        document.querySelector<HTMLElement>(".drawer-toggle")?.focus();
      }
    };
    addEventListener("keydown", onKey);
    return () => removeEventListener("keydown", onKey);
  }, [drawer]);

  const open = (id: string | null) => {
    history.pushState(null, "", id ? `/s/${encodeURIComponent(id)}` : "/");
    // Files chosen and not sent yet stay chosen; another session may work in
    // another workspace, so they are uploaded again there.
    setFiles((fs) => (fs.some((f) => f.uploaded) ? fs.map((f) => ({ ...f, uploaded: null })) : fs));
    setSessionId(id);
    setShowCards(id === null);
    setNotice(null);
    setDrawer(false);
    stick.current = true;
    if (id === null && mainRef.current) mainRef.current.scrollTop = 0;
  };

  const live = conv.live !== null;
  const lost = access === "ok" && connectionLost(link);

  /**
   * Starts a turn with `message` (or, `steer`, hands it to the running one);
   * true once the server took it. A refusal is said in the notice.
   */
  const startTurn = async (message: string, steer = false, attachments: { path: string; sizeBytes: bigint }[] = []): Promise<boolean> => {
    // The reader asked for this turn: bring it into view even if they had scrolled up.
    stick.current = true;
    if (!steer) sentAt.current = conv.sessionId === (sessionId ?? "") ? conv.turns.length : 0;
    try {
      const r = await web.startTurn({
        sessionId: sessionId ?? "",
        message,
        agent: target.agent,
        teamMembers: target.team,
        permissionMode: settings.mode,
        model: config?.modelOverride ? settings.model : "",
        provider: config?.modelOverride ? settings.provider : "",
        steer,
        attachments,
      });
      setShowCards(false);
      if (r.sessionId !== sessionId) {
        createdHere.current.add(r.sessionId);
        open(r.sessionId);
      } else {
        follower.current?.follow();
      }
      void refreshSessions();
      return true;
    } catch (err) {
      sentAt.current = null;
      setNotice(
        isUnreachable(err)
          ? "The message was not sent: the server cannot be reached. Try again once the page has reconnected."
          : steer
            ? `The message did not reach the running turn: ${describeError(err)}`
            : `The turn did not start: ${describeError(err)}`,
        isUnreachable(err),
      );
      return false;
    }
  };

  const addFiles = (list: FileList | File[] | null | undefined) => {
    const picked = Array.from(list ?? []);
    if (!picked.length) return;
    setFiles((fs) => [...fs, ...picked.map((file) => ({ key: ++fileKey.current, file, uploaded: null }))]);
  };

  /**
   * Uploads the chosen files not uploaded yet (UploadFiles, into the
   * workspace this session works in); the attachments to name in the
   * message, or null when the upload failed (said in the notice; the
   * message and the files stay, to send again).
   */
  const uploadChosen = async (): Promise<{ path: string; sizeBytes: bigint }[] | null> => {
    let chosen = files;
    const todo = chosen.filter((f) => !f.uploaded);
    if (todo.length) {
      // Over the deployment's limits: said now, without sending the bytes.
      const over =
        config &&
        overLimits(
          todo.map((f) => ({ name: f.file.name, size: f.file.size })),
          {
            maxFileBytes: Number(config.uploadMaxFileBytes),
            maxRequestBytes: Number(config.uploadMaxRequestBytes),
            maxFiles: config.uploadMaxFiles,
          },
        );
      if (over) {
        setNotice(over);
        return null;
      }
      let contents: { name: string; content: Uint8Array }[];
      try {
        contents = await Promise.all(todo.map(async (f) => ({ name: f.file.name, content: new Uint8Array(await f.file.arrayBuffer()) })));
      } catch (err) {
        setNotice(`A file could not be read from this computer (${String(err)}). Remove it and choose it again.`);
        return null;
      }
      try {
        const r = await orchestrator.uploadFiles({ sessionId: sessionId ?? "", files: contents });
        const got = new Map(todo.map((f, i) => [f.key, r.files[i]]));
        chosen = chosen.map((f) => {
          const u = got.get(f.key);
          return u ? { ...f, uploaded: { path: u.path, sizeBytes: u.sizeBytes } } : f;
        });
        setFiles(chosen);
      } catch (err) {
        const ce = ConnectError.from(err);
        setNotice(uploadFailure(ce.code, ce.rawMessage, isUnreachable(err)), isUnreachable(err));
        return null;
      }
    }
    return chosen.flatMap((f) => (f.uploaded ? [f.uploaded] : []));
  };

  /** Send: a new turn, or while one runs, a message steered into it (it joins at its next model request). */
  const send = async (e?: Event) => {
    e?.preventDefault();
    const message = draft.trim();
    if ((!message && !files.length) || sending || (live && lost)) return;
    setSending(true);
    setNotice(null);
    try {
      const attachments = files.length ? await uploadChosen() : [];
      if (attachments === null) return;
      if (await startTurn(message, live, attachments)) {
        setDraft("");
        setFiles([]);
      }
    } finally {
      setSending(false);
    }
  };

  /** Why rewinding and forking are not offered now (the server refuses them while a turn runs). */
  const blocked = live ? "Not while a turn runs: wait for it to end, or cancel it." : sending ? "Busy with the last request." : lost ? "The server cannot be reached." : null;

  /** Edit-and-resend: rewind to `turnId` (it and every later turn), then ask `message` in its place. */
  const editResend = async (turnId: string, message: string): Promise<boolean> => {
    if (!sessionId || blocked) return false;
    setSending(true);
    setNotice(null);
    try {
      await orchestrator.rewindSession({ sessionId, to: { case: "turnId", value: turnId } });
    } catch (err) {
      setSending(false);
      setNotice(`The conversation was not rewound, so the edited message was not sent: ${describeError(err)}`, isUnreachable(err));
      return false;
    }
    // The Rewound event takes the turns out of the view (the log keeps them).
    follower.current?.follow();
    try {
      return await startTurn(message);
    } finally {
      setSending(false);
    }
  };

  /** Regenerate: rewind the last turn and ask its message again. */
  const regenerate = async (): Promise<void> => {
    if (!sessionId || blocked) return;
    setSending(true);
    setNotice(null);
    try {
      const r = await orchestrator.rewindSession({ sessionId, to: { case: "lastTurns", value: 1 } });
      follower.current?.follow();
      if (!r.firstMessage) {
        setNotice("The last turn was rewound, but the server did not say what its message was: type it again to ask.");
        return;
      }
      await startTurn(r.firstMessage);
    } catch (err) {
      setNotice(`The answer was not regenerated: ${describeError(err)}`, isUnreachable(err));
    } finally {
      setSending(false);
    }
  };

  /** Fork: a new session holding this one up to and including `turnId`; the page opens it. */
  const fork = async (turnId: string): Promise<void> => {
    if (!sessionId || blocked) return;
    setSending(true);
    setNotice(null);
    try {
      const r = await orchestrator.forkSession({ sessionId, at: { case: "turnId", value: turnId } });
      await refreshSessions();
      open(r.sessionId);
    } catch (err) {
      setNotice(`The session was not forked: ${describeError(err)}`, isUnreachable(err));
    } finally {
      setSending(false);
    }
  };

  /** Renames a session; resolves to the server's refusal in words (shown by the list), or null. */
  const renameSession = async (id: string, title: string): Promise<string | null> => {
    try {
      await orchestrator.renameSession({ sessionId: id, title });
      await refreshSessions();
      return null;
    } catch (err) {
      const ce = ConnectError.from(err);
      if (ce.code === Code.InvalidArgument) return ce.rawMessage;
      return `Not renamed: ${describeError(err)}`;
    }
  };

  const cancel = async () => {
    if (!sessionId) return;
    const turn = conv.live;
    if (turn) {
      const ids = [...cancelledHere.filter((t) => t !== turn), turn].slice(-200);
      setCancelledHere(ids);
      save("omicos.cancelled", { ids });
    }
    try {
      const r = await orchestrator.cancelTurn({ sessionId });
      if (!r.cancelled) setNotice("Nothing to cancel: the turn had already ended.");
    } catch (err) {
      setNotice(
        isUnreachable(err) ? "Could not cancel: the server cannot be reached. Try again once the page has reconnected." : `Cancel failed: ${describeError(err)}`,
        isUnreachable(err),
      );
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
          : isUnreachable(err)
            ? `The decision on ${a.toolName} was not delivered: the server cannot be reached. Answer again once the page has reconnected.`
            : `The decision was not delivered: ${describeError(err)}`,
        isUnreachable(err),
      );
    }
    return null;
  };

  /** An agent picked in a session holds there; in a new chat it is the global pick. */
  const pickAgent = (a: AgentInfo) => {
    if (sessionId) {
      const next = { ...picks, [sessionId]: a.id };
      setPicks(next);
      save("omicos.picks", next);
    } else {
      setTeam(chooseActive(team, a));
    }
  };
  const pickPrompt = (a: AgentInfo, p: string) => {
    pickAgent(a);
    setDraft(p);
    composer.current?.focus();
  };

  const deleteSession = async (id: string) => {
    try {
      await orchestrator.deleteSession({ sessionId: id });
      if (id === sessionId) open(null);
    } catch (err) {
      setNotice(`The session was not deleted: ${describeError(err)}`, isUnreachable(err));
    }
    void refreshSessions();
  };

  const linkText = linkWords(link, access);
  const summary = sessions.find((s) => s.sessionId === sessionId);
  const title = summary?.title || (sessionId ? "Session" : "New chat");
  const target = composerTarget(sessionId, conv, summary, picks, team);
  const names = useMemo(() => new Map(agents.map((a) => [a.id, a.name || a.id])), [agents]);
  const nameOf = useCallback((id: string) => names.get(id) ?? id, [names]);
  const modeText = MODES.find((m) => m.value === settings.mode) ?? MODES[0]!;

  // The tab says when a question waits, so a person in another tab sees it.
  useEffect(() => {
    document.title = approvalCount > 0 ? `(${approvalCount}) approval${approvalCount > 1 ? "s" : ""} waiting · omicos` : `${title} · omicos`;
  }, [approvalCount, title]);

  const agentOptions = agents.filter((a) => !a.locked || a.id === target.agent);
  if (target.agent && !agents.some((a) => a.id === target.agent)) {
    agentOptions.push({ id: target.agent, name: target.agent } as AgentInfo);
  }

  return (
    <div class={`layout${drawer ? " drawer-open" : ""}`}>
      <a class="skip" href="#composer">
        Skip to the message box
      </a>
      <aside class="side" id="side" aria-label="Sessions and new chat">
        <button
          type="button"
          class="phone-only close-drawer"
          onClick={() => {
            setDrawer(false);
            document.querySelector<HTMLElement>(".drawer-toggle")?.focus();
          }}
        >
          Close
        </button>
        <SessionList sessions={sessions} current={sessionId} onOpen={open} onNew={() => open(null)} onDelete={deleteSession} onRename={renameSession} />
      </aside>
      {drawer && <div class="scrim phone-only" aria-hidden="true" onClick={() => setDrawer(false)} />}
      <div
        class={`main-col${dropping ? " dropping" : ""}`}
        onDragOver={(e) => {
          if (!dragHasFiles(e.dataTransfer)) return;
          e.preventDefault();
          e.dataTransfer!.dropEffect = "copy";
          setDropping(true);
        }}
        onDragLeave={(e) => {
          const to = e.relatedTarget as Node | null;
          if (!to || !e.currentTarget.contains(to)) setDropping(false);
        }}
        onDrop={(e) => {
          setDropping(false);
          if (!e.dataTransfer?.files.length) return;
          e.preventDefault();
          addFiles(e.dataTransfer.files);
          composer.current?.focus();
        }}
      >
        {dropping && (
          <div class="drop-hint" aria-hidden="true">
            Drop the files to attach them to your message
          </div>
        )}
        <header class="top">
          <div class="top-left">
            <button
              type="button"
              class="phone-only drawer-toggle"
              aria-expanded={drawer}
              aria-controls="side"
              onClick={() => {
                setDrawer(!drawer);
                // Opened: focus moves into the drawer, where the person is going.
                if (!drawer) requestAnimationFrame(() => document.querySelector<HTMLElement>(".close-drawer")?.focus());
              }}
            >
              Sessions
            </button>
            <h1>
              <span aria-hidden="true">◆ </span>omicos <span class="muted title">· {title}</span>
            </h1>
          </div>
          <div class="top-right">
            <button type="button" class="primary phone-only" onClick={() => open(null)}>
              New chat
            </button>
            {canAskNotify && (
              <button
                type="button"
                class="link"
                onClick={() => {
                  void Notification.requestPermission().finally(() => setCanAskNotify(Notification.permission === "default"));
                }}
              >
                Notify me about approvals
              </button>
            )}
            <span class={`link link-${access === "ok" ? link : "signed-out"}`} role="status" data-testid="link" data-link={access === "ok" ? link : "signed-out"}>
              <span class="dot" aria-hidden="true" />
              {linkText}
            </span>
            <SettingsPanel settings={settings} config={config} onChange={setSettings} />
          </div>
        </header>
        {access !== "ok" && <SignIn text={accessText(access)} onToken={(t) => (saveToken(t), location.reload())} />}
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
                team={sessionId ? { active: target.agent, members: target.team } : team}
                blocked={access !== "ok"}
                nameOf={nameOf}
                onActive={pickAgent}
                onToggle={(a) => setTeam(toggleMember(team, a))}
                onPrompt={pickPrompt}
              />
            </div>
          </section>
          <ChatLog
            conv={conv}
            nameOf={nameOf}
            lost={lost}
            cancelledHere={cancelledHere}
            actions={{ editResend, regenerate, fork, blocked }}
            readValue={readWholeValue}
            carried={heldHistory && heldHistory.sessionId === sessionId ? carriedPrefix(heldHistory.messages, conv.turns[0]?.message ?? null) : []}
          />
          {approvalCount > 0 && approvalsHidden && (
            <button type="button" class="pending" ref={pendingRef} onClick={() => setApprovalsHidden(false)}>
              {approvalCount} approval{approvalCount > 1 ? "s" : ""} waiting
            </button>
          )}
        </main>
        <div class="notice" role="alert" data-testid="notice">
          {notice?.text}
        </div>
        <form class="composer" onSubmit={send} aria-label="Message">
          <div class="composer-opts">
            <label>
              <span>Agent</span>
              <select data-testid="agent-pick" value={target.agent} onChange={(e) => {
                const a = agents.find((x) => x.id === e.currentTarget.value);
                if (a) pickAgent(a);
                else if (!sessionId) setTeam({ ...team, active: "" });
              }}>
                {!target.agent && <option value="">First agent of the team</option>}
                {agentOptions.map((a) => (
                  <option value={a.id} key={a.id}>
                    {a.name || a.id}
                  </option>
                ))}
              </select>
            </label>
            <label>
              <span>Permissions</span>
              <select data-testid="mode-pick" aria-describedby="mode-help" value={settings.mode} onChange={(e) => setSettings({ ...settings, mode: e.currentTarget.value })}>
                {MODES.map((m) => (
                  <option value={m.value} key={m.value}>
                    {m.short}
                  </option>
                ))}
              </select>
            </label>
            <span class="muted mode-help" id="mode-help" data-testid="mode-help">
              {modeText.help}
            </span>
          </div>
          <FileChips
            files={files}
            onRemove={(key) => {
              setFiles(files.filter((f) => f.key !== key));
              // The button is gone with its chip: focus goes back to the message.
              composer.current?.focus();
            }}
          />
          <div class="composer-row">
            <label for="composer" class="visually-hidden">
              Message{target.agent ? ` to ${nameOf(target.agent)}` : ""}
            </label>
            <textarea
              id="composer"
              ref={composer}
              rows={3}
              value={draft}
              placeholder={
                live
                  ? "Add to the running turn… (it reads this at its next step)"
                  : target.agent
                    ? `Message ${nameOf(target.agent)}… (Enter sends, Shift+Enter: new line)`
                    : "Message… (Enter sends, Shift+Enter: new line)"
              }
              onInput={(e) => setDraft(e.currentTarget.value)}
              onKeyDown={(e) => {
                if (e.key === "Enter" && !e.shiftKey && !e.isComposing) void send(e);
              }}
              onPaste={(e) => {
                // Pasted files (a screenshot, files copied in a file manager) are attached.
                const cd = e.clipboardData;
                if (!cd?.files.length) return;
                addFiles(cd.files);
                if (!cd.types.includes("text/plain")) e.preventDefault();
              }}
            />
            <div class="composer-actions">
              <input
                ref={fileInput}
                type="file"
                multiple
                hidden
                data-testid="attach-input"
                onChange={(e) => {
                  addFiles(e.currentTarget.files);
                  // The same file can be chosen again (a second copy).
                  e.currentTarget.value = "";
                  composer.current?.focus();
                }}
              />
              <button type="button" class="attach" data-testid="attach" title="Attach files (you can also drop or paste them here)" onClick={() => fileInput.current?.click()}>
                <span aria-hidden="true">📎 </span>Attach files
              </button>
              {live && !lost ? (
                <button type="button" class="danger" onClick={cancel}>
                  Cancel turn
                </button>
              ) : null}
              <button type="submit" class="primary" data-testid="send" data-steer={live ? "true" : undefined} disabled={(!draft.trim() && !files.length) || sending || (live && lost)} title={live ? "Sends the message into the running turn: it joins at the turn's next model request." : undefined}>
                {live ? "Send to the running turn" : "Send"}
              </button>
            </div>
          </div>
        </form>
      </div>
      <ApprovalDialog
        queue={conv.approvals}
        hidden={approvalsHidden}
        nameOf={nameOf}
        onDecide={decide}
        onHide={() => setApprovalsHidden(true)}
        onAnswered={() => composer.current?.focus()}
        sessionId={conv.sessionId}
        readValue={readWholeValue}
      />
    </div>
  );
}
