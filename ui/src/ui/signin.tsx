// The sign-in banner: shown when the server refuses the page's token (or
// the page has none). It says what to do, and takes a pasted token.

import { useState } from "preact/hooks";

export function SignIn(props: { text: string; onToken: (t: string) => void }) {
  const [t, setT] = useState("");
  return (
    <section class="signin" aria-labelledby="signin-title" data-testid="signin">
      <h2 id="signin-title">Sign in to this omicos</h2>
      <p role="alert" data-testid="signin-text">
        {props.text}
      </p>
      <form
        onSubmit={(e) => {
          e.preventDefault();
          if (t.trim()) props.onToken(t.trim());
        }}
      >
        <label for="signin-token">Access token</label>
        <div class="rule-row">
          <input id="signin-token" type="password" autocomplete="off" value={t} onInput={(e) => setT(e.currentTarget.value)} />
          <button type="submit" class="primary" disabled={!t.trim()}>
            Sign in
          </button>
        </div>
      </form>
    </section>
  );
}
