// A value an event carries cut (ChatEvent.cut_values), offered whole:
// Orchestrator/ReadValue streams it and the page saves it as a file.

import { Code, ConnectError } from "@connectrpc/connect";
import { useState } from "preact/hooks";
import type { ValueRef } from "../gen/omicos/v1/orchestrator_pb";

/** Bytes as a person reads them: 73.4 MB. */
function sizeText(bytes: number): string {
  if (bytes < 1000) return `${bytes} bytes`;
  if (bytes < 1e6) return `${(bytes / 1e3).toFixed(1)} kB`;
  return `${(bytes / 1e6).toFixed(1)} MB`;
}

/** A value shown cut: its size, and a button that saves it whole (ReadValue). */
export function WholeValueOffer(props: {
  sessionId: string;
  value: ValueRef;
  name: string;
  readValue: ((sessionId: string, value: ValueRef) => Promise<Blob>) | null;
}) {
  const { readValue } = props;
  const [state, setState] = useState<"idle" | "reading" | string>("idle");
  if (!readValue || !props.sessionId) return null;
  const size = Number(props.value.sizeBytes);
  const save = () => {
    setState("reading");
    readValue(props.sessionId, props.value)
      .then((blob) => {
        const url = URL.createObjectURL(blob);
        const a = document.createElement("a");
        a.href = url;
        a.download = props.name;
        a.click();
        setTimeout(() => URL.revokeObjectURL(url), 60_000);
        setState("idle");
      })
      .catch((e: unknown) =>
        setState(
          [Code.Unavailable, Code.Unknown, Code.DeadlineExceeded].includes(ConnectError.from(e).code)
            ? "Not downloaded: the server cannot be reached. Try again once the page has reconnected."
            : `Not downloaded: ${ConnectError.from(e).rawMessage || "the server refused"}. Try again, or read it with \`omicos sessions value\`.`,
        ),
      );
  };
  return (
    <p class="muted whole-value" data-testid="whole-value">
      Shown cut: {sizeText(size)} in all.{" "}
      <button type="button" onClick={save} disabled={state === "reading"}>
        {state === "reading" ? "Reading…" : "Download it whole"}
      </button>
      {state !== "idle" && state !== "reading" && <span class="error-text"> {state}</span>}
    </p>
  );
}

