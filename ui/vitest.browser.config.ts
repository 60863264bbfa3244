import { defineConfig } from "vitest/config";

// The browser scenarios (tests/): one file, run in order against a live
// stack at $OMICOS_UI_URL; each step waits for the page, not for a clock.
export default defineConfig({
  test: {
    include: ["tests/**/*.test.ts"],
    environment: "node",
    fileParallelism: false,
    sequence: { concurrent: false },
    testTimeout: 120_000,
    hookTimeout: 60_000,
    bail: 1,
  },
});
