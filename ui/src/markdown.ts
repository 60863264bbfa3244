// Markdown for model text: marked to HTML, code blocks highlighted by
// highlight.js (a few languages, to keep the bundle small), then DOMPurify:
// model output is untrusted and never reaches the DOM unsanitised.

import { Marked } from "marked";
import DOMPurify from "dompurify";
import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import json from "highlight.js/lib/languages/json";
import javascript from "highlight.js/lib/languages/javascript";
import python from "highlight.js/lib/languages/python";
import rust from "highlight.js/lib/languages/rust";
import sql from "highlight.js/lib/languages/sql";
import typescript from "highlight.js/lib/languages/typescript";
import yaml from "highlight.js/lib/languages/yaml";
import r from "highlight.js/lib/languages/r";

hljs.registerLanguage("bash", bash);
hljs.registerLanguage("json", json);
hljs.registerLanguage("javascript", javascript);
hljs.registerLanguage("python", python);
hljs.registerLanguage("rust", rust);
hljs.registerLanguage("sql", sql);
hljs.registerLanguage("typescript", typescript);
hljs.registerLanguage("yaml", yaml);
hljs.registerLanguage("r", r);

function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** Highlighted HTML of `code` (escaped plain text for an unknown language). */
export function highlight(code: string, lang: string): string {
  const l = lang.trim().toLowerCase();
  if (l && hljs.getLanguage(l)) return hljs.highlight(code, { language: l, ignoreIllegals: true }).value;
  return escapeHtml(code);
}

const marked = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    code({ text, lang }) {
      const l = (lang ?? "").split(/\s/)[0] ?? "";
      const cls = l ? ` class="hljs language-${escapeHtml(l)}"` : ` class="hljs"`;
      // The copy button is handled by the chat (one listener for all blocks).
      return `<div class="code-block"><button type="button" class="copy copy-code">Copy</button><pre tabindex="0"><code${cls}>${highlight(text, l)}</code></pre></div>\n`;
    },
  },
});

let hooked = false;
function purify(html: string): string {
  if (!hooked) {
    hooked = true;
    // Links from the model open elsewhere and carry no opener.
    DOMPurify.addHook("afterSanitizeAttributes", (node) => {
      if (node.tagName === "A") {
        node.setAttribute("target", "_blank");
        node.setAttribute("rel", "noopener noreferrer");
      }
    });
  }
  const clean = DOMPurify.sanitize(html, { USE_PROFILES: { html: true } });
  // A wide table scrolls inside its own box, never the conversation.
  return clean.replace(/<table(\s[^>]*)?>/g, '<div class="table-wrap" tabindex="0">$&').replace(/<\/table>/g, "</table></div>");
}

const cache = new Map<string, string>();

/** Sanitised HTML of a markdown text; recent results are kept, since streaming re-renders the same prefixes. */
export function renderMarkdown(text: string): string {
  const hit = cache.get(text);
  if (hit !== undefined) return hit;
  const html = purify(marked.parse(text, { async: false }));
  if (cache.size > 200) cache.clear();
  cache.set(text, html);
  return html;
}
