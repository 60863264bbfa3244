// Settings: a model/provider override when the orchestrator says it honours
// one. The permission mode is chosen beside the message box (MODES).

import type { ClientConfig } from "../gen/omicos/v1/orchestrator_pb";

/** What the page sends with each turn. */
export interface Settings {
  /** read_only | auto | full; empty: the server's default. */
  mode: string;
  provider: string;
  model: string;
}

export const MODES: { value: string; short: string; help: string }[] = [
  { value: "read_only", short: "Read only", help: "Tools without side effects only." },
  { value: "auto", short: "Ask first", help: "Side effects wait for your approval." },
  { value: "full", short: "Full access", help: "Everything runs without asking." },
];

export function SettingsPanel(props: { settings: Settings; config: ClientConfig | null; onChange: (s: Settings) => void }) {
  const s = props.settings;
  const cfg = props.config;
  if (!cfg?.modelOverride) return null;
  return (
    <details class="settings">
      <summary>Settings</summary>
      <div class="settings-body">
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
      </div>
    </details>
  );
}
