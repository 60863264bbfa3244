// Files attached to a message (issue 42). The page uploads them with
// Orchestrator/UploadFiles when the message is sent and names the answer's
// paths in ChatRequest.attachments; the server then ends the message the
// model reads (and the log keeps) with one line naming each file, which is
// how a sent message shows its files again after a reload.

import { Code } from "@connectrpc/connect";

/** How the server's attachment line starts (services/orchestrator/src/service/uploads.rs, ATTACHED_FILES). */
export const ATTACHED_FILES = "Attached files (in the workspace):";

/** A file a sent message names: its workspace path and its size as the server wrote it. */
export interface SentFile {
  path: string;
  size: string;
}

/** A message as the log holds it, split into what the person typed and the files it named. */
export interface SplitMessage {
  text: string;
  files: SentFile[];
  /** The attachment line as the server wrote it ("" when none): an edited message keeps it. */
  line: string;
}

/** `12 bytes`, `1.5 KB`, `25 MB`: powers of 1024, as the server's messages write sizes. */
export function formatSize(bytes: number): string {
  const K = 1024;
  if (bytes < K) return `${bytes} bytes`;
  const [v, unit] = bytes < K * K ? [bytes / K, "KB"] : bytes < K * K * K ? [bytes / K / K, "MB"] : [bytes / K / K / K, "GB"];
  return v >= 10 || Number.isInteger(v) ? `${Math.round(v)} ${unit}` : `${v.toFixed(1)} ${unit}`;
}

const ENTRY = /^(.+?) \((\d+(?:\.\d+)? (?:bytes|KB|MB|GB))\)$/;

/**
 * Splits the server's attachment line off the end of a message. Entries are
 * `path (size)` joined with `, `; a path may itself hold `, ` or brackets, so
 * the line is cut only after a size. A last line that does not parse whole
 * stays part of the text.
 */
export function splitAttachments(message: string): SplitMessage {
  const at = message.lastIndexOf(ATTACHED_FILES);
  if (at < 0 || (at > 0 && !message.slice(0, at).endsWith("\n\n"))) return { text: message, files: [], line: "" };
  const line = message.slice(at);
  if (line.includes("\n")) return { text: message, files: [], line: "" };
  const rest = line.slice(ATTACHED_FILES.length).trim();
  const files: SentFile[] = [];
  // Cut after each ` (size)` followed by `, ` or the end.
  const cut = /\((\d+(?:\.\d+)? (?:bytes|KB|MB|GB))\)(?:, |$)/g;
  let start = 0;
  for (let m = cut.exec(rest); m; m = cut.exec(rest)) {
    const entry = rest.slice(start, m.index + m[0].length).replace(/, $/, "");
    const e = ENTRY.exec(entry);
    if (!e) return { text: message, files: [], line: "" };
    files.push({ path: e[1]!, size: e[2]! });
    start = m.index + m[0].length;
  }
  if (!files.length || start !== rest.length) return { text: message, files: [], line: "" };
  return { text: message.slice(0, at).replace(/\n\n$/, ""), files, line };
}

/** The message to send again with the same files (an edit keeps the attachment line as the model saw it). */
export function joinAttachments(text: string, line: string): string {
  if (!line) return text;
  return text.trim() ? `${text}\n\n${line}` : line;
}

/** The last part of a workspace path: `data (1).csv` of `uploads/data (1).csv`. */
export function baseName(path: string): string {
  return path.split("/").pop() || path;
}

/**
 * Why an upload failed, as a sentence that says what to do: the server's own
 * words (they name the file and the limit) without the config key, which is
 * the operator's business, and the next step. The typed message is kept.
 */
export function uploadFailure(code: Code, rawMessage: string, unreachable: boolean): string {
  const kept = "Your message and files are still here.";
  if (unreachable) return `The files were not sent: the server cannot be reached. Try again once the page has reconnected. ${kept}`;
  const said = rawMessage
    .replace(/ \(uploads\.[a-z_]+\)/g, "")
    .replace(/\.? ?Nothing was written;?/, ";")
    .replace(/;\s*$/, "")
    .replace(/;\s*send them in parts$/, "")
    .trim();
  // The server's sentences start with a file name, or with "the …".
  const first = !said ? "The server refused the files" : said.startsWith("the ") ? `T${said.slice(1)}` : said;
  if (code === Code.ResourceExhausted) {
    const what = /uploads\.max_file_bytes/.test(rawMessage)
      ? "Attach a smaller file."
      : /uploads\.max_request_bytes/.test(rawMessage)
        ? "Send the files in parts: fewer at a time."
        : /uploads\.max_files/.test(rawMessage)
          ? "Attach fewer files at a time."
          : "Remove a file, or free space in the workspace, and send again.";
    return `${first}. ${what} ${kept}`;
  }
  if (code === Code.InvalidArgument) return `${first}. Rename the file (a plain name, no folder) and attach it again. ${kept}`;
  return `The files were not attached: ${said || Code[code]}. Try again. ${kept}`;
}

/** UploadFiles' limits as GetClientConfig gives them; 0: unknown (not checked here). */
export interface UploadLimits {
  maxFileBytes: number;
  maxRequestBytes: number;
  maxFiles: number;
}

/**
 * What the server would refuse, said before anything is sent, in the words
 * of its refusal (see uploadFailure); null when the files fit or the limits
 * are unknown. The server checks again whatever the page said.
 */
export function overLimits(files: { name: string; size: number }[], l: UploadLimits): string | null {
  const refused = (raw: string) => uploadFailure(Code.ResourceExhausted, raw, false);
  if (l.maxFiles && files.length > l.maxFiles) {
    return refused(`${files.length} files in one upload; the limit is ${l.maxFiles} (uploads.max_files)`);
  }
  const big = files.find((f) => l.maxFileBytes && f.size > l.maxFileBytes);
  if (big) {
    return refused(`${big.name} is ${formatSize(big.size)}; the limit is ${formatSize(l.maxFileBytes)} (uploads.max_file_bytes)`);
  }
  const total = files.reduce((n, f) => n + f.size, 0);
  if (l.maxRequestBytes && total > l.maxRequestBytes) {
    return refused(
      `the files hold ${formatSize(total)} together; the limit of one upload is ${formatSize(l.maxRequestBytes)} (uploads.max_request_bytes)`,
    );
  }
  return null;
}
