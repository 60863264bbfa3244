import { defineConfig } from "vitest/config";

// Unit tests of the page's logic (reducers, grouping, parsing): node, no DOM.
export default defineConfig({
  oxc: { jsx: { runtime: "automatic", importSource: "preact" } },
  test: {
    include: ["src/**/*.test.ts"],
    environment: "node",
  },
});
