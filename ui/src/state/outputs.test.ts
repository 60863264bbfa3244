import { describe, expect, it } from "vitest";
import { fileUrl, outputFiles } from "./outputs";

describe("output files", () => {
  it("finds the images a kernel result names, once each", () => {
    const result = JSON.stringify({
      stdout: "",
      display_data: [
        { "image/png": "iVBORw0KGgo=", png_path: ".omicos/outputs/s-1/17_call_a_1.png" },
        { png_path: ".omicos/outputs/s-1/17_call_a_2.png" },
      ],
      note: "again .omicos/outputs/s-1/17_call_a_1.png",
    });
    expect(outputFiles(result)).toEqual([".omicos/outputs/s-1/17_call_a_1.png", ".omicos/outputs/s-1/17_call_a_2.png"]);
    // Escaped inside an envelope, the path still ends at the quote.
    expect(outputFiles(JSON.stringify({ result })).length).toBe(2);
    expect(outputFiles("no pictures, only demo/plot.png")).toEqual([]);
  });

  it("builds /files/ URLs only under the served roots", () => {
    expect(fileUrl(".omicos/outputs/s 1/a#b.png")).toBe("/files/.omicos/outputs/s%201/a%23b.png");
    expect(fileUrl(".omicos/tool_outputs/17__c.txt")).toBe("/files/.omicos/tool_outputs/17__c.txt");
    expect(fileUrl(".omicos/outputs/../sessions.db")).toBeNull();
    expect(fileUrl("notes/x.md")).toBeNull();
    expect(fileUrl("/etc/passwd")).toBeNull();
  });
});
