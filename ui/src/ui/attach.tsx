// Files attached to a message: the chips of the files chosen for the next
// message (above the message box), and the files a sent message names.

import { baseName, formatSize, type SentFile } from "../state/attachments";

/** A file chosen for the next message; `uploaded` once UploadFiles took it (a retry does not upload it again). */
export interface PendingFile {
  key: number;
  file: File;
  uploaded: { path: string; sizeBytes: bigint } | null;
}

/** Whether a drag carries files (not text or a link from the page). */
export function dragHasFiles(dt: DataTransfer | null): boolean {
  return !!dt && Array.from(dt.types).includes("Files");
}

/** The files chosen for the next message, each with a button that takes it off. */
export function FileChips(props: { files: PendingFile[]; onRemove: (key: number) => void }) {
  if (!props.files.length) return null;
  return (
    <ul class="chips" aria-label="Files to send with the message" data-testid="attach-chips">
      {props.files.map((f) => (
        <li class="chip" data-testid="attach-chip" key={f.key}>
          <span aria-hidden="true">📎 </span>
          <span class="chip-name" title={f.file.name}>
            {f.file.name}
          </span>
          <span class="chip-size muted">{formatSize(f.file.size)}</span>
          <button type="button" class="chip-remove" aria-label={`Remove ${f.file.name}`} title={`Remove ${f.file.name}`} onClick={() => props.onRemove(f.key)}>
            <span aria-hidden="true">×</span>
          </button>
        </li>
      ))}
    </ul>
  );
}

/** The files a sent message named: where they are in the workspace, and their size. */
export function SentFiles(props: { files: SentFile[] }) {
  if (!props.files.length) return null;
  return (
    <ul class="chips sent-files" aria-label={`Attached file${props.files.length > 1 ? "s" : ""}`} data-testid="sent-files">
      {props.files.map((f) => (
        <li class="chip" data-testid="sent-file" data-path={f.path} key={f.path} title={`${baseName(f.path)}: in the workspace at ${f.path}`}>
          <span aria-hidden="true">📎 </span>
          <code class="chip-name">{f.path}</code>
          <span class="chip-size">{f.size}</span>
        </li>
      ))}
    </ul>
  );
}
