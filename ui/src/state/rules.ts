// The rule the approval dialog offers to allow for the rest of a session,
// suggested from the call waiting for an answer. The server decides: a rule
// must parse, name the call's tool exactly and match the call
// (docs/configuration.md, "Permission rules"); a suggestion here only saves
// typing, and one the person edits is checked there the same way.

/** A suggested session rule, or why there is none. */
export interface RuleSuggestion {
  /** The rule to prefill; empty: nothing sensible to offer. */
  rule: string;
  /** Said beside the field when there is no suggestion. */
  note?: string;
}

/** The argument names that hold a file tool's path (as the server reads them). */
const PATH_ARGS = ["path", "file_path", "notebook_path"];

/** The operators that make a command compound (or redirect it): no shell rule but the bare tool allows one. */
export function isCompound(cmd: string): boolean {
  return cmd.includes("$(") || /[;|&`\n\r<>]/.test(cmd);
}

/** Glob metacharacters in a literal path, made literal (`[*]`). */
function globLiteral(s: string): string {
  return s.replace(/[*?[\]{}]/g, (c) => `[${c}]`);
}

/** `a/./b/../c` as `a/c`; null when it climbs above where it starts. */
function lexical(path: string): string[] | null {
  const out: string[] = [];
  for (const part of path.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") {
      if (out.length === 0) return null;
      out.pop();
    } else {
      out.push(part);
    }
  }
  return out;
}

function shellRule(command: string): RuleSuggestion {
  const words = command.trim().split(/\s+/).filter(Boolean);
  if (words.length === 0) return { rule: "" };
  if (isCompound(command)) {
    return {
      rule: "",
      note: "A compound command (&&, ;, |, $( ), redirections) is never allowed by a shell rule: allow it once, or the whole tool for this session.",
    };
  }
  return { rule: `shell(${words[0]} *)` };
}

/** The directory of the call's path, as a gitignore-style glob of what is beneath it. */
function pathRule(tool: string, raw: string): RuleSuggestion {
  const absolute = raw.startsWith("/");
  const parts = lexical(raw);
  if (!parts || parts.length === 0) return { rule: "" };
  const dir = parts.slice(0, -1).map(globLiteral);
  const name = globLiteral(parts[parts.length - 1]!);
  if (absolute) {
    // `//…` is an absolute path in a rule.
    return { rule: dir.length ? `${tool}(//${dir.join("/")}/**)` : `${tool}(//${name})` };
  }
  if (dir.length === 0) {
    // A file at the workspace root: that file (a leading `/` anchors it there).
    return { rule: `${tool}(/${name})` };
  }
  const glob = `${dir.join("/")}/**`;
  // `docs:x/**` would read as an argument pattern (`key:glob`): anchor it instead.
  return { rule: /^[A-Za-z_][A-Za-z0-9_.-]*:/.test(glob) ? `${tool}(/${glob})` : `${tool}(${glob})` };
}

function domainRule(tool: string, url: string): RuleSuggestion {
  let host: string;
  try {
    host = new URL(url.trim()).hostname.replace(/\.$/, "").toLowerCase();
  } catch {
    return { rule: "" };
  }
  // An IPv6 literal has no host name a domain rule can name.
  if (!host || host.includes(":") || host.includes("[")) return { rule: "" };
  return { rule: `${tool}(domain:${host})` };
}

/**
 * The rule to offer for a call of `tool` with `argumentsJson` (the
 * arguments as the approval request carries them): `shell(git *)` for a
 * simple command, the directory of a file tool's path (`docs/**`), the host
 * of a URL (`domain:example.org`). Nothing for a compound command; for
 * other tools the bare tool name (every call of it).
 */
export function suggestRule(tool: string, argumentsJson: string): RuleSuggestion {
  let args: Record<string, unknown> = {};
  try {
    const v: unknown = JSON.parse(argumentsJson);
    if (v && typeof v === "object" && !Array.isArray(v)) args = v as Record<string, unknown>;
  } catch {
    // Arguments that are not JSON: only the bare tool can be offered.
  }
  if (tool === "shell" && typeof args.command === "string") return shellRule(args.command);
  for (const key of PATH_ARGS) {
    const p = args[key];
    if (typeof p === "string" && p.trim()) {
      const s = pathRule(tool, p.trim());
      if (s.rule) return s;
    }
  }
  if (typeof args.url === "string") {
    const s = domainRule(tool, args.url);
    if (s.rule) return s;
  }
  return { rule: tool };
}
