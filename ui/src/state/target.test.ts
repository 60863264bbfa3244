import { describe, expect, it } from "vitest";
import { create } from "@bufbuild/protobuf";
import { SessionSummarySchema } from "../gen/omicos/v1/orchestrator_pb";
import { applyAll, emptyConversation } from "./conversation";
import { composerTarget, sessionTarget } from "./target";
import { Log } from "./events.fixture";

const global = { active: "coder", members: [] };

describe("whom the next message goes to", () => {
  it("sends a reopened session's next message to the session's own agent, not the last global pick", () => {
    const log = new Log("s1");
    log.started("plot it", "data_analyst");
    const conv = applyAll(emptyConversation("s1"), log.events);
    expect(sessionTarget(conv, undefined)?.agent).toBe("data_analyst");
    expect(composerTarget("s1", conv, undefined, {}, global)).toEqual({ agent: "data_analyst", team: [] });
  });

  it("knows the session's agent from the session list before its log has replayed", () => {
    const summary = create(SessionSummarySchema, { sessionId: "s1", agent: "data_analyst", teamMembers: ["data_analyst", "generalist"] });
    expect(composerTarget("s1", emptyConversation("s1"), summary, {}, global)).toEqual({
      agent: "data_analyst",
      team: ["data_analyst", "generalist"],
    });
  });

  it("keeps a pick made in a session to that session, adding it to a narrow team", () => {
    const summary = create(SessionSummarySchema, { sessionId: "s1", agent: "data_analyst", teamMembers: ["data_analyst"] });
    const picks = { s1: "coder" };
    expect(composerTarget("s1", emptyConversation("s1"), summary, picks, global)).toEqual({ agent: "coder", team: ["data_analyst", "coder"] });
    expect(composerTarget("s2", emptyConversation("s2"), undefined, picks, { active: "generalist", members: [] }).agent).toBe("generalist");
  });

  it("uses the global pick for a new chat", () => {
    expect(composerTarget(null, emptyConversation(), undefined, { s1: "x" }, global)).toEqual({ agent: "coder", team: [] });
  });
});
