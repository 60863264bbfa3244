import { describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import { TurnDoneReason } from "../gen/omicos/v1/orchestrator_pb";
import { accessFromCode, accessText, barText, connectionLost, doneText, linkText } from "./status-text";
import type { Bar } from "./conversation";

const bar = (b: Partial<Bar>): Bar => ({
  id: "0",
  label: "counting",
  current: 8,
  total: 20,
  percent: 40,
  elapsedS: 1,
  etaS: 2.4,
  unit: "it",
  done: false,
  message: "",
  ...b,
});

describe("status text", () => {
  it("says a refused token is a sign-in problem, never Connected", () => {
    expect(accessFromCode(Code.Unauthenticated, false)).toBe("no-token");
    expect(accessFromCode(Code.Unauthenticated, true)).toBe("bad-token");
    expect(accessFromCode(Code.Unavailable, true)).toBeNull();
    expect(accessFromCode(Code.NotFound, false)).toBeNull();
    expect(linkText("connected", "bad-token")).toBe("Not signed in");
    expect(linkText("connected", "ok")).toBe("Connected");
    for (const a of ["no-token", "bad-token"] as const) {
      const t = accessText(a);
      // A sentence that says what to do, not the wire's words.
      expect(t).toMatch(/^[A-Z].*\.\)?$/);
      expect(t).toContain("omicos up");
      expect(t).not.toMatch(/Bearer|authorization|UNAUTHENTICATED/i);
    }
  });

  it("counts reconnecting and offline as a lost connection", () => {
    expect(connectionLost("offline")).toBe(true);
    expect(connectionLost("reconnecting")).toBe(true);
    expect(connectionLost("connected")).toBe(false);
    expect(connectionLost("connecting")).toBe(false);
  });

  it("words a cancel this page did not ask for as an interruption", () => {
    expect(doneText(TurnDoneReason.CANCELLED, "", true)).toBe("Cancelled");
    expect(doneText(TurnDoneReason.CANCELLED, "", false)).toMatch(/^Interrupted/);
    expect(doneText(TurnDoneReason.INTERRUPTED, "", false)).toMatch(/^Interrupted/);
    expect(doneText(TurnDoneReason.BUDGET, "the token budget (1000) was reached", false)).toBe("Stopped: the token budget (1000) was reached");
  });

  it("shows a bar's eta only while its call runs", () => {
    expect(barText(bar({}), true)).toBe("40% · 8/20 it · eta 2.4 s");
    expect(barText(bar({}), false)).toBe("40% · 8/20 it · stopped");
    expect(barText(bar({ done: true, percent: 100, current: 20, etaS: 0 }), false)).toBe("100% · 20/20 it · done");
  });
});
