import { describe, expect, it } from "vitest";
import { create } from "@bufbuild/protobuf";
import { AgentInfoSchema } from "../gen/omicos/v1/orchestrator_pb";
import { categoryTitle, chooseActive, groupByCategory, toggleMember } from "./catalog";

const agent = (id: string, category: string, order: number, locked = false) =>
  create(AgentInfoSchema, { id, name: id, category, categoryOrder: order, locked });

describe("cards", () => {
  it("groups by category in category_order", () => {
    const groups = groupByCategory([
      agent("coder", "engineering", 3),
      agent("scout", "literature", 2),
      agent("analyst", "data_analysis", 1),
      agent("gen", "general", 0),
      agent("stats", "data_analysis", 1),
    ]);
    expect(groups.map((g) => [g.category, g.agents.map((a) => a.id)])).toEqual([
      ["general", ["gen"]],
      ["data_analysis", ["analyst", "stats"]],
      ["literature", ["scout"]],
      ["engineering", ["coder"]],
    ]);
    expect(categoryTitle("data_analysis")).toBe("Data analysis");
  });

  it("never picks a locked agent", () => {
    const locked = agent("lab", "x", 0, true);
    const t = { active: "gen", members: ["gen"] };
    expect(chooseActive(t, locked)).toBe(t);
    expect(toggleMember(t, locked)).toBe(t);
  });

  it("builds a team from the cards; the active agent stays a member", () => {
    const gen = agent("gen", "g", 0);
    const an = agent("analyst", "d", 1);
    let t = chooseActive({ active: "", members: [] }, gen);
    expect(t).toEqual({ active: "gen", members: [] });
    t = toggleMember(t, an);
    expect(t).toEqual({ active: "gen", members: ["gen", "analyst"] });
    t = toggleMember(t, gen);
    expect(t).toEqual({ active: "analyst", members: ["analyst"] });
  });
});
