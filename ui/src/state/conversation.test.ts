import { describe, expect, it } from "vitest";
import { apply, applyAll, emptyConversation, resume, type Conversation } from "./conversation";
import { Log } from "./events.fixture";
import { create } from "@bufbuild/protobuf";
import { TurnDoneReason, ValueRefSchema } from "../gen/omicos/v1/orchestrator_pb";
import { Decision, Risk, ToolStatus } from "../gen/omicos/v1/common_pb";

/** The root frame's text of turn `i`. */
function rootText(c: Conversation, i = 0): string {
  const t = c.turns[i]!;
  return c.frames[t.rootFrame]!.items.map((x) => (x.t === "text" ? x.text : x.t === "call" ? `[${x.callId}]` : "")).join("");
}

function demoLog(): Log {
  const l = new Log();
  l.started("plot it", "data_analyst");
  l.text("Running ", "root", "data_analyst");
  l.text("the code.", "root", "data_analyst");
  l.call("c1", "run_python_code", '{"code":"1"}', "root", "data_analyst");
  l.ask("c1", "run_python_code");
  l.resolved("c1", Decision.ALLOW_ONCE);
  l.output("c1", "stdout", "a");
  l.output("c1", "stdout", "b\n");
  l.output("c1", "stderr", "warn");
  l.progress("c1", { current: 5, total: 10, percent: 50, etaS: 3 });
  l.progress("c1", { current: 10, total: 10, percent: 100, done: true });
  l.finished("c1", "run_python_code", '{"display_data":[{"png_path":".omicos/outputs/s1/1_c1_1.png"}]}');
  l.text("Done.", "root", "data_analyst");
  l.done();
  return l;
}

describe("event_seq order", () => {
  it("folds a whole turn", () => {
    const c = applyAll(emptyConversation("s1"), demoLog().events);
    expect(c.lastSeq).toBe(14);
    expect(c.live).toBeNull();
    expect(c.turns).toHaveLength(1);
    expect(c.turns[0]!.done).toBe(TurnDoneReason.COMPLETED);
    expect(rootText(c)).toBe("Running the code.[c1]Done.");
    const call = c.calls.c1!;
    expect(call.status).toBe("done");
    expect(call.output).toEqual([
      { stream: "stdout", text: "ab\n" },
      { stream: "stderr", text: "warn" },
    ]);
    expect(call.approval).toEqual({ decision: Decision.ALLOW_ONCE, source: "client" });
    expect(call.images).toEqual([".omicos/outputs/s1/1_c1_1.png"]);
    expect(call.elapsedMs).toBe(1234);
  });

  it("shows a steered message where it joined the turn", () => {
    const l = new Log();
    l.started("list the files");
    l.text("Listing.");
    l.call("c1", "file_manager__list", "{}");
    l.finished("c1", "file_manager__list", "[]");
    l.steer("count them too");
    l.text("None to count.");
    l.done();
    const c = applyAll(emptyConversation("s1"), l.events);
    const items = c.frames["t1|root"]!.items;
    expect(items.map((i) => i.t)).toEqual(["text", "call", "steer", "text"]);
    expect(items[2]).toEqual({ t: "steer", id: "s5", message: "count them too" });
    expect(c.turns).toHaveLength(1);
  });

  it("drops events it holds already (a replay that overlaps)", () => {
    const log = demoLog();
    const half = applyAll(emptyConversation("s1"), log.events.slice(0, 7));
    // The server replays from an older seq: every event again, then the rest.
    const again = applyAll(half, log.events);
    const once = applyAll(emptyConversation("s1"), log.events);
    expect(again).toEqual(once);
    const r = apply(once, log.events[3]!);
    expect(r.outcome).toBe("duplicate");
    expect(r.state).toBe(once);
  });

  it("refuses an event past a hole and asks to resume from lastSeq", () => {
    const log = demoLog();
    let c = applyAll(emptyConversation("s1"), log.events.slice(0, 3));
    const r = apply(c, log.events[5]!);
    expect(r.outcome).toBe("gap");
    expect(r.state.lastSeq).toBe(3);
    expect(r.state.gap).toEqual({ expected: 4, got: 6 });
    c = resume(r.state);
    expect(c.gap).toBeNull();
    // Resuming from seq 3 gets 4.. in order: the same end state as one clean pass.
    c = applyAll(c, log.events.slice(3));
    expect(c).toEqual(applyAll(emptyConversation("s1"), log.events));
  });

  it("takes a heartbeat ahead of lastSeq as missed events", () => {
    const log = demoLog();
    const c = applyAll(emptyConversation("s1"), log.events.slice(0, 4));
    expect(apply(c, log.heartbeat(4)).outcome).toBe("heartbeat");
    const r = apply(c, log.heartbeat(9));
    expect(r.outcome).toBe("gap");
    expect(r.state.lastSeq).toBe(4);
  });

  it("rebuilds the same conversation from the log after a reload", () => {
    const log = new Log();
    log.started("first");
    log.text("one");
    log.done();
    log.turnId = "t2";
    log.started("second");
    log.text("two ");
    log.call("c2", "run_python_code", "{}");
    // The page held everything up to here, then reloaded mid-turn.
    const before = applyAll(emptyConversation("s1"), log.events);
    expect(before.live).toBe("t2");
    log.output("c2", "stdout", "tick");
    log.finished("c2", "run_python_code", "{}");
    log.text("and done");
    log.done();
    const reloaded = applyAll(emptyConversation("s1"), log.events);
    const followed = applyAll(before, log.events.slice(before.lastSeq));
    expect(reloaded).toEqual(followed);
    expect(reloaded.turns.map((t) => t.message)).toEqual(["first", "second"]);
    expect(rootText(reloaded, 1)).toBe("two [c2]and done");
    expect(reloaded.live).toBeNull();
  });
});

describe("approvals", () => {
  it("queues several pending approvals, oldest first, and drops each when resolved", () => {
    const l = new Log();
    l.started("go");
    l.call("a", "run_python_code", "{}");
    l.call("b", "shell__run", "{}");
    l.ask("a", "run_python_code", Risk.PYTHON);
    l.ask("b", "shell__run", Risk.SHELL);
    let c = applyAll(emptyConversation("s1"), l.events);
    expect(c.approvals.map((a) => [a.callId, a.risk])).toEqual([
      ["a", Risk.PYTHON],
      ["b", Risk.SHELL],
    ]);
    expect(c.calls.a!.status).toBe("awaiting_approval");
    c = applyAll(c, [l.resolved("b", Decision.DENY)]);
    expect(c.approvals.map((a) => a.callId)).toEqual(["a"]);
    expect(c.calls.b!.status).toBe("denied");
    c = applyAll(c, [l.finished("b", "shell__run", "denied by user", ToolStatus.ERROR)]);
    expect(c.calls.b!.status).toBe("denied");
    c = applyAll(c, [l.resolved("a", Decision.ALLOW_SESSION, "client")]);
    expect(c.approvals).toEqual([]);
    expect(c.calls.a!.status).toBe("running");
  });

  it("clears a turn's approvals when it ends, and marks its running calls", () => {
    const l = new Log();
    l.started("go");
    l.call("a", "run_python_code", "{}");
    l.ask("a", "run_python_code");
    l.done(TurnDoneReason.CANCELLED);
    const c = applyAll(emptyConversation("s1"), l.events);
    expect(c.approvals).toEqual([]);
    expect(c.calls.a!.status).toBe("cancelled");
    expect(c.turns[0]!.done).toBe(TurnDoneReason.CANCELLED);
  });

  it("calls a call that failed because of a cancel cancelled", () => {
    const l = new Log();
    l.started("go");
    l.call("a", "run_python_code", "{}");
    l.call("b", "run_python_code", "{}");
    l.finished("a", "run_python_code", '{"status":"error","result":"cancelled by the user before it ran"}', ToolStatus.ERROR);
    l.finished("b", "run_python_code", '{"status":"error","result":"NameError: x"}', ToolStatus.ERROR);
    l.done(TurnDoneReason.CANCELLED);
    const c = applyAll(emptyConversation("s1"), l.events);
    expect([c.calls.a!.status, c.calls.b!.status]).toEqual(["cancelled", "error"]);
  });

  it("does not queue the same call twice", () => {
    const l = new Log();
    l.started("go");
    l.call("a", "x", "{}");
    l.ask("a", "x");
    l.ask("a", "x");
    expect(applyAll(emptyConversation("s1"), l.events).approvals).toHaveLength(1);
  });
});

describe("progress bars", () => {
  it("keeps one bar per bar_id, in first-seen order, and reaches 100 when done", () => {
    const l = new Log();
    l.started("go");
    l.call("c", "run_python_code", "{}");
    l.progress("c", { barId: "outer", current: 1, total: 4, percent: 25, etaS: 9, label: "epochs" });
    l.progress("c", { barId: "inner", current: 3, total: 10, percent: 30, etaS: 2 });
    l.progress("c", { barId: "outer", current: 2, total: 4, percent: 50, etaS: 6 });
    let c = applyAll(emptyConversation("s1"), l.events);
    expect(c.calls.c!.bars.map((b) => [b.id, b.percent, b.etaS])).toEqual([
      ["outer", 50, 6],
      ["inner", 30, 2],
    ]);
    c = applyAll(c, [l.progress("c", { barId: "outer", current: 4, total: 4, percent: 99.6, etaS: 0.1, done: true })]);
    const outer = c.calls.c!.bars[0]!;
    expect([outer.percent, outer.etaS, outer.done]).toEqual([100, 0, true]);
  });

  it("clamps nonsense percentages", () => {
    const l = new Log();
    l.started("go");
    l.call("c", "x", "{}");
    l.progress("c", { current: 1, total: 1, percent: 250 });
    l.progress("c", { barId: "n", current: 1, total: 0, percent: Number.NaN });
    const bars = applyAll(emptyConversation("s1"), l.events).calls.c!.bars;
    expect(bars.map((b) => b.percent)).toEqual([100, 0]);
  });

  it("fills a bar that reached its total when the call finishes", () => {
    const l = new Log();
    l.started("go");
    l.call("c", "x", "{}");
    l.progress("c", { current: 20, total: 20, percent: 95 });
    l.finished("c", "x", "{}");
    expect(applyAll(emptyConversation("s1"), l.events).calls.c!.bars[0]!.percent).toBe(100);
  });
});

describe("frames", () => {
  it("nests a delegated sub-turn under the call_agent call that opened it", () => {
    const l = new Log();
    l.started("go");
    l.text("asking");
    l.call("d1", "call_agent", '{"agent_name":"data_analyst"}');
    l.switchTo("generalist", "data_analyst", "delegate", 1);
    l.text("in sub-turn", "root/d1", "data_analyst");
    l.call("k1", "run_python_code", "{}", "root/d1", "data_analyst");
    l.text("deeper", "root/d1/k1", "coder");
    l.finished("k1", "run_python_code", "{}", ToolStatus.DONE, "", "root/d1");
    l.switchTo("data_analyst", "generalist", "return", 0);
    l.finished("d1", "call_agent", "answer");
    l.done();
    const c = applyAll(emptyConversation("s1"), l.events);
    expect(c.calls.d1!.childFrame).toBe("t1|root/d1");
    const sub = c.frames["t1|root/d1"]!;
    expect([sub.agentId, sub.depth]).toEqual(["data_analyst", 1]);
    expect(sub.items.map((i) => i.t)).toEqual(["text", "call"]);
    expect(c.calls.k1!.childFrame).toBe("t1|root/d1/k1");
    expect(c.frames["t1|root/d1/k1"]!.depth).toBe(2);
    expect(c.frames["t1|root"]!.items.map((i) => i.t)).toEqual(["text", "call", "switch", "switch"]);
  });

  it("shows a sub-turn whose call it never saw in the root frame", () => {
    const l = new Log();
    l.started("go");
    l.text("x", "root/zz", "coder");
    const c = applyAll(emptyConversation("s1"), l.events);
    expect(c.frames["t1|root"]!.items).toEqual([{ t: "frame", key: "t1|root/zz" }]);
  });
});

describe("values shown cut", () => {
  it("keeps where a call's whole arguments are, and nothing for a call shown whole", () => {
    const l = new Log();
    l.started("write it");
    const big = l.call("c1", "file_manager__write", '{"path":"big.txt","content":"aaa… [omicos: …]');
    big.cutValues = [
      create(ValueRefSchema, {
        at: { case: "event", value: { eventSeq: big.eventSeq, field: "tool_call_started.arguments" } },
        sizeBytes: 73_400_320n,
      }),
    ];
    l.call("c2", "shell", '{"cmd":"ls"}');
    const c = applyAll(emptyConversation("s1"), l.events);
    const cut = c.calls.c1!.argumentsCut!;
    expect(cut.sizeBytes).toBe(73_400_320n);
    expect(cut.at.case === "event" && cut.at.value.eventSeq).toBe(2n);
    expect(c.calls.c2!.argumentsCut).toBeNull();
  });

  it("keeps where an approval's whole arguments are: the person decides on the whole", () => {
    const l = new Log();
    l.started("run it");
    l.call("c1", "run_python_code", '{"code":"x = 1… [omicos: …]');
    const ask = l.ask("c1", "run_python_code");
    // A reference to the call's own arguments does not stand for the approval's.
    ask.cutValues = [
      create(ValueRefSchema, {
        at: { case: "event", value: { eventSeq: 2n, field: "tool_call_started.arguments" } },
        sizeBytes: 9n,
      }),
      create(ValueRefSchema, {
        at: { case: "event", value: { eventSeq: ask.eventSeq, field: "tool_approval_request.arguments" } },
        sizeBytes: 5_000_000n,
      }),
    ];
    l.ask("c2", "shell");
    const c = applyAll(emptyConversation("s1"), l.events);
    const [a, b] = c.approvals;
    expect(a!.argumentsCut!.sizeBytes).toBe(5_000_000n);
    expect(a!.argumentsCut!.at.case === "event" && a!.argumentsCut!.at.value.field).toBe("tool_approval_request.arguments");
    expect(b!.argumentsCut).toBeNull();
  });
});

describe("errors", () => {
  it("shows an error event in its turn, as it came", () => {
    const l = new Log();
    l.started("go");
    l.error("llm_unavailable", "connection refused (after 4 attempts)");
    l.done(TurnDoneReason.ERROR);
    const c = applyAll(emptyConversation("s1"), l.events);
    expect(c.frames["t1|root"]!.items).toEqual([
      { t: "error", id: "e2", kind: "llm_unavailable", message: "connection refused (after 4 attempts)" },
    ]);
  });

  it("keeps unlogged errors (event_seq 0) without counting them", () => {
    const l = new Log();
    const ev = l.error("session_busy", "a turn is running");
    ev.eventSeq = 0n;
    ev.turnId = "";
    const c = apply(emptyConversation("s1"), ev).state;
    expect(c.looseErrors).toEqual([{ kind: "session_busy", message: "a turn is running" }]);
    expect(c.lastSeq).toBe(0);
  });
});

describe("rewind", () => {
  function threeTurns(): Log {
    const l = new Log();
    for (const [id, msg] of [["t1", "first"], ["t2", "second"], ["t3", "third"]] as const) {
      l.turnId = id;
      l.started(msg);
      l.text(`answer to ${msg}`);
      l.call(`c-${id}`, "file_manager__write", "{}");
      l.finished(`c-${id}`, "file_manager__write", "ok");
      l.done();
    }
    return l;
  }

  it("takes the rewound turns, their frames and calls out of the view", () => {
    const l = threeTurns();
    l.turnId = "";
    l.rewound(["t2", "t3"], ["notes.txt"], ["big.bin"]);
    const c = applyAll(emptyConversation("s1"), l.events);
    expect(c.turns.map((t) => t.message)).toEqual(["first"]);
    expect(Object.keys(c.calls)).toEqual(["c-t1"]);
    expect(Object.values(c.frames).every((f) => f.turnId === "t1")).toBe(true);
    expect(c.rewinds).toEqual([{ turns: 2, filesRestored: ["notes.txt"], filesNotRestored: ["big.bin"], afterTurn: "t1" }]);
    expect(c.lastSeq).toBe(l.seq);
  });

  it("keeps them out on a replay, and a turn after the rewind shows in their place", () => {
    const l = threeTurns();
    l.turnId = "";
    l.rewound(["t3"]);
    l.turnId = "t4";
    l.started("third, edited");
    l.text("edited answer");
    l.done();
    const c = applyAll(emptyConversation("s1"), l.events);
    expect(c.turns.map((t) => t.message)).toEqual(["first", "second", "third, edited"]);
    expect(rootText(c, 2)).toBe("edited answer");
    // A reload replays the same log from seq 0: the same view.
    expect(applyAll(emptyConversation("s1"), l.events)).toEqual(c);
  });

  it("ends the live turn and its approvals when the rewind took it", () => {
    const l = new Log();
    l.started("go");
    l.call("c1", "shell", "{}");
    l.ask("c1", "shell");
    l.turnId = "";
    l.rewound(["t1"]);
    const c = applyAll(emptyConversation("s1"), l.events);
    expect(c.turns).toEqual([]);
    expect(c.live).toBeNull();
    expect(c.approvals).toEqual([]);
  });
});

describe("a turn moved to another replica", () => {
  it("drops the partial answer of a reissued model request and says so once", () => {
    const l = new Log();
    l.started("go");
    l.text("Listing.");
    l.call("c1", "file_manager__list", "{}");
    l.finished("c1", "file_manager__list", "[]");
    l.text("There are no fi");
    l.moved(true);
    l.text("There are no files.");
    l.done();
    const c = applyAll(emptyConversation("s1"), l.events);
    const items = c.frames[c.turns[0]!.rootFrame]!.items;
    expect(items.map((i) => i.t)).toEqual(["text", "call", "moved", "text"]);
    expect(rootText(c)).toBe("Listing.[c1]There are no files.");
    expect(items[2]).toMatchObject({ t: "moved", replica: "orch-2" });
  });

  it("keeps the text when the model request was not reissued, and names the lost calls", () => {
    const l = new Log();
    l.started("go");
    l.text("Running it.");
    l.call("c1", "run_python_code", "{}");
    l.moved(false, ["c1"]);
    l.finished("c1", "run_python_code", "lost", ToolStatus.ERROR);
    l.done();
    const c = applyAll(emptyConversation("s1"), l.events);
    const items = c.frames[c.turns[0]!.rootFrame]!.items;
    expect(items.map((i) => i.t)).toEqual(["text", "call", "moved"]);
    expect(items[2]).toMatchObject({ t: "moved", lostCalls: ["c1"] });
    expect(c.calls.c1!.status).toBe("error");
  });

  it("drops only the text of the sub-turn whose request was reissued", () => {
    const l = new Log();
    l.started("go");
    l.text("Asking the coder.");
    l.call("d1", "call_agent", '{"agent_name":"coder"}');
    l.text("Half a sub-answ", "root/d1", "coder");
    l.moved(true, [], "root/d1");
    l.text("The sub-answer.", "root/d1", "coder");
    const c = applyAll(emptyConversation("s1"), l.events);
    expect(rootText(c)).toBe("Asking the coder.[d1]");
    const sub = c.frames[c.calls.d1!.childFrame!]!.items;
    expect(sub.map((i) => (i.t === "text" ? i.text : i.t))).toEqual(["moved", "The sub-answer."]);
  });
});

describe("a moved turn whose sub-turn was streaming", () => {
  it("drops the sub-turn's partial text even when the notice is the root's", () => {
    const l = new Log();
    l.started("go");
    l.text("Asking the coder.");
    l.call("d1", "call_agent", '{"agent_name":"coder"}');
    l.text("Half a sub-answ", "root/d1", "coder");
    l.moved(true);
    l.text("The sub-answer.", "root/d1", "coder");
    const c = applyAll(emptyConversation("s1"), l.events);
    const root = c.frames[c.turns[0]!.rootFrame]!.items;
    expect(root.map((i) => i.t)).toEqual(["text", "call", "moved"]);
    const sub = c.frames[c.calls.d1!.childFrame!]!.items;
    expect(sub.map((i) => (i.t === "text" ? i.text : i.t))).toEqual(["The sub-answer."]);
  });
});
