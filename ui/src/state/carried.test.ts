import { describe, expect, it } from "vitest";
import { carriedPrefix, parseHistory } from "./carried";

const msgs = [
  JSON.stringify({ role: "system", content: "be brief" }),
  JSON.stringify({ role: "user", content: "the first question" }),
  JSON.stringify({ role: "assistant", content: null, tool_calls: [{ id: "c1" }] }),
  JSON.stringify({ role: "tool", tool_call_id: "c1", content: "[]" }),
  JSON.stringify({ role: "assistant", content: [{ type: "text", text: "The first " }, { type: "text", text: "answer." }] }),
  "not json",
  JSON.stringify({ role: "user", content: "a question after the fork" }),
  JSON.stringify({ role: "assistant", content: "Its answer." }),
];

describe("the history a fork carries over", () => {
  it("keeps the user and assistant texts, oldest first", () => {
    expect(parseHistory(msgs)).toEqual([
      { role: "user", text: "the first question" },
      { role: "assistant", text: "The first answer." },
      { role: "user", text: "a question after the fork" },
      { role: "assistant", text: "Its answer." },
    ]);
  });
  it("is all of it while the log has no turn, and what precedes the log's first turn after", () => {
    const h = parseHistory(msgs);
    expect(carriedPrefix(h, null)).toHaveLength(4);
    expect(carriedPrefix(h, "a question after the fork")).toEqual(h.slice(0, 2));
  });
  it("is nothing for a session whose log holds its whole history, or whose first turn was compacted away", () => {
    const h = parseHistory(msgs);
    expect(carriedPrefix(h, "the first question")).toEqual([]);
    expect(carriedPrefix(h, "a message the history no longer holds")).toEqual([]);
  });
});
