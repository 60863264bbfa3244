import { describe, expect, it } from "vitest";
import { isCompound, suggestRule } from "./rules";

const args = (v: unknown) => JSON.stringify(v);

describe("suggestRule", () => {
  it("offers the first word of a simple shell command", () => {
    expect(suggestRule("shell", args({ command: "git status --short" })).rule).toBe("shell(git *)");
    expect(suggestRule("shell", args({ command: "  ls  " })).rule).toBe("shell(ls *)");
  });

  it("offers no shell rule for a compound command, and says why", () => {
    for (const command of ["git status && rm -rf x", "ls | wc -l", "echo $(id)", "cat a > b", "a; b", "sleep 1 &", "echo `id`", "a\nb"]) {
      expect(isCompound(command)).toBe(true);
      const s = suggestRule("shell", args({ command }));
      expect(s.rule, command).toBe("");
      expect(s.note).toContain("compound");
    }
  });

  it("offers the directory of a file tool's path", () => {
    expect(suggestRule("file_manager__write", args({ path: "docs/notes/a.md", content: "x" })).rule).toBe("file_manager__write(docs/notes/**)");
    expect(suggestRule("file_manager__edit", args({ file_path: "./src/../lib/x.rs" })).rule).toBe("file_manager__edit(lib/**)");
    // A file at the workspace root: that file, anchored there.
    expect(suggestRule("file_manager__write", args({ path: "a.txt" })).rule).toBe("file_manager__write(/a.txt)");
    // An absolute path: the rule's `//` form.
    expect(suggestRule("file_manager__write", args({ path: "/srv/ws/out/a.csv" })).rule).toBe("file_manager__write(//srv/ws/out/**)");
    // Glob characters in a name are literal; a `key:` look-alike is anchored.
    expect(suggestRule("file_manager__write", args({ path: "data[1]/x.csv" })).rule).toBe("file_manager__write(data[[]1[]]/**)");
    expect(suggestRule("file_manager__write", args({ path: "notes:2024/x.md" })).rule).toBe("file_manager__write(/notes:2024/**)");
  });

  it("offers a URL's host as a domain rule", () => {
    expect(suggestRule("web_fetch", args({ url: "https://Docs.RS/tokio/latest/" })).rule).toBe("web_fetch(domain:docs.rs)");
    expect(suggestRule("web_fetch", args({ url: "http://[::1]:8080/" })).rule).toBe("web_fetch");
  });

  it("falls back to the bare tool", () => {
    expect(suggestRule("run_python_code", args({ code: "print(1)" })).rule).toBe("run_python_code");
    expect(suggestRule("file_manager__write", args({ path: "../outside.txt" })).rule).toBe("file_manager__write");
    expect(suggestRule("shell", "not json").rule).toBe("shell");
  });
});
