// History a session holds but its event log does not: a fork starts with
// the parent's history up to the fork point (ForkSession copies what the
// model sees, not the parent's events), so replaying the fork's log shows
// none of it. The page reads that history from GetSession (as `omicos
// sessions show` does) and shows the part before the log's first turn.

/** One message of the history, as the page shows it. */
export interface CarriedMessage {
  role: "user" | "assistant";
  text: string;
}

/** The text of a message's content: a string, or the text of its parts. */
function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content
      .map((p) => (p && typeof p === "object" && (p as { type?: unknown }).type === "text" ? String((p as { text?: unknown }).text ?? "") : ""))
      .join("");
  }
  return "";
}

/**
 * The user and assistant texts of `Session.messages_json` (OpenAI chat
 * shape, one JSON object per entry), oldest first. Tool calls and results,
 * system messages, empty texts and entries that do not parse are left out.
 */
export function parseHistory(messagesJson: string[]): CarriedMessage[] {
  const out: CarriedMessage[] = [];
  for (const raw of messagesJson) {
    let m: { role?: unknown; content?: unknown };
    try {
      m = JSON.parse(raw) as typeof m;
    } catch {
      continue;
    }
    if (m?.role !== "user" && m?.role !== "assistant") continue;
    const text = textOf(m.content).trim();
    if (text) out.push({ role: m.role, text });
  }
  return out;
}

/**
 * The part of `history` that comes before the log's first turn (its
 * message: `firstTurnMessage`; null: the log has no turn). With no turn,
 * all of it; with one whose message the history does not hold (compacted
 * away), nothing, since what the log shows cannot be placed.
 */
export function carriedPrefix(history: CarriedMessage[], firstTurnMessage: string | null): CarriedMessage[] {
  if (firstTurnMessage === null) return history;
  const i = history.findIndex((m) => m.role === "user" && m.text === firstTurnMessage.trim());
  return i > 0 ? history.slice(0, i) : [];
}
