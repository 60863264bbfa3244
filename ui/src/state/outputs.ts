// Files a tool result points at, and the URLs the page fetches them from.
//
// The orchestrator serves `GET /files/<workspace-relative path>` for paths
// under `.omicos/outputs/` (images a kernel drew, generated images) and
// `.omicos/tool_outputs/` (spooled large results), read-only.

/** Image files under .omicos/outputs/ named in a result text, first seen first. */
const IMAGE = /\.omicos\/outputs\/[^\s"'\\<>]+?\.(?:png|jpe?g|gif|webp)\b/gi;

/** The workspace paths of the images a result names, without repeats. */
export function outputFiles(result: string): string[] {
  const seen = new Set<string>();
  for (const m of result.matchAll(IMAGE)) seen.add(m[0]);
  return [...seen];
}

/** The roots `/files/` serves. */
export const FILE_ROOTS = [".omicos/outputs/", ".omicos/tool_outputs/"] as const;

/** The URL of a workspace file, or null when the route would refuse it. */
export function fileUrl(path: string): string | null {
  const p = path.replace(/^\.\//, "");
  if (!FILE_ROOTS.some((r) => p.startsWith(r))) return null;
  const parts = p.split("/");
  if (parts.some((s) => s === ".." || s === "." || s === "")) return null;
  return "/files/" + parts.map(encodeURIComponent).join("/");
}
