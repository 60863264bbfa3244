// Settings: the permission mode, and a model/provider override when the
// orchestrator says it honours one.

import type { ClientConfig } from "../gen/omicos/v1/orchestrator_pb";

/** What the page sends with each turn. */
export interface Settings {
  /** read_only | auto | full; empty: the server's default. */
  mode: string;
  provider: string;
  model: string;
}

export const MODES: { value: string; label: string }[] = [
  { value: "read_only", label: "Read only: tools without side effects" },
  { value: "auto", label: "Ask first: side effects need my approval" },
  { value: "full", label: "Full: run everything without asking" },
];

export function SettingsPanel(props: { settings: Settings; config: ClientConfig | null; onChange: (s: Settings) => void }) {
  const s = props.settings;
  const cfg = props.config;
  return (
    <details class="settings">
      <summary>Settings</summary>
      <div class="settings-body">
        <label for="mode">Permission mode</label>
        <select id="mode" value={s.mode} onChange={(e) => props.onChange({ ...s, mode: e.currentTarget.value })}>
          {MODES.map((m) => (
            <option value={m.value} key={m.value}>
              {m.label}
            </option>
          ))}
        </select>
        {cfg?.modelOverride && (
          <>
            {cfg.providers.length > 1 && (
              <>
                <label for="provider">Provider</label>
                <select id="provider" value={s.provider} onChange={(e) => props.onChange({ ...s, provider: e.currentTarget.value })}>
                  <option value="">Default ({cfg.providers[0]})</option>
                  {cfg.providers.map((p) => (
                    <option value={p} key={p}>
                      {p}
                    </option>
                  ))}
                </select>
              </>
            )}
            <label for="model">Model</label>
            <input
              id="model"
              type="text"
              value={s.model}
              placeholder={cfg.defaultModel ? `Default: ${cfg.defaultModel}` : "Default"}
              onInput={(e) => props.onChange({ ...s, model: e.currentTarget.value })}
            />
          </>
        )}
      </div>
    </details>
  );
}
