import { describe, expect, it } from "vitest";
import { create } from "@bufbuild/protobuf";
import { SessionSummarySchema } from "../gen/omicos/v1/orchestrator_pb";
import { filterSessions, titleProblem } from "./sessions";

const s = (sessionId: string, title: string, agent = "generalist") => create(SessionSummarySchema, { sessionId, title, agent });

describe("the session search", () => {
  const all = [s("a1", "Plot the squares", "data_analyst"), s("b2", "Fix make test", "coder"), s("c3", "")];
  it("keeps sessions holding every word, in any case", () => {
    expect(filterSessions(all, "SQUARES").map((x) => x.sessionId)).toEqual(["a1"]);
    expect(filterSessions(all, "fix coder").map((x) => x.sessionId)).toEqual(["b2"]);
    expect(filterSessions(all, "fix analyst")).toEqual([]);
    expect(filterSessions(all, "c3").map((x) => x.sessionId)).toEqual(["c3"]);
  });
  it("keeps all for an empty query", () => {
    expect(filterSessions(all, "  ")).toHaveLength(3);
  });
});

describe("a session's new title", () => {
  it("must hold something besides spaces", () => {
    expect(titleProblem("")).toBe("A title cannot be empty.");
    expect(titleProblem("   \n")).toBe("A title cannot be empty.");
  });
  it("is at most 200 characters after trimming, counted as characters, not bytes", () => {
    expect(titleProblem(`  ${"x".repeat(200)}  `)).toBeNull();
    expect(titleProblem("x".repeat(201))).toBe("A title is at most 200 characters; this one has 201.");
    expect(titleProblem("é".repeat(200))).toBeNull();
    expect(titleProblem("🦀".repeat(200))).toBeNull();
  });
});
