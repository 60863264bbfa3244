import { defineConfig } from "vite";

// The orchestrator a dev server forwards gRPC-web and /files to.
const api = process.env.OMICOS_API ?? "http://127.0.0.1:7000";

export default defineConfig({
  // Preact's automatic JSX runtime, without a framework plugin.
  oxc: { jsx: { runtime: "automatic", importSource: "preact" } },
  build: {
    target: "es2022",
    outDir: "dist",
    emptyOutDir: true,
    // One small bundle; no source maps in the embedded copy.
    sourcemap: false,
    reportCompressedSize: true,
    chunkSizeWarningLimit: 400,
  },
  server: {
    proxy: {
      "/omicos.v1.": { target: api, changeOrigin: true },
      "/files/": { target: api, changeOrigin: true },
    },
  },
});
