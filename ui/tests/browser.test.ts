// The page in a real browser against a real stack (scripts/ui-test.sh):
// Debian's headless chromium driven by playwright-core, the orchestrator at
// $OMICOS_UI_URL serving the page and gRPC-web, its model following
// tests/stack-script.json, every tool running for real. The steps run in
// order on one page, as a person would use it; each saves a screenshot
// under test-artifacts/, and axe-core checks the page at four points.

import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import AxeBuilder from "@axe-core/playwright";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startPeer } from "./peer";

let BASE = process.env.OMICOS_UI_URL ?? "";
let stopPeer: (() => Promise<void>) | null = null;
const ARTIFACTS = process.env.OMICOS_UI_ARTIFACTS ?? join(import.meta.dirname, "..", "test-artifacts");
const SCRIPT = JSON.parse(readFileSync(join(import.meta.dirname, "stack-script.json"), "utf8")) as {
  agent: string;
  replies: { text: string; tool_calls: { id: string; name: string }[] }[];
};

/** As PITFALLS says for this machine: no background traffic into the closed network. */
const CHROMIUM_FLAGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

let profile = "";
let context: BrowserContext;
let page: Page;
const consoleErrors: string[] = [];

async function shot(name: string): Promise<void> {
  await page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });
}

/** axe-core on the page as it stands: no serious or critical violation. */
async function axe(name: string): Promise<void> {
  const r = await new AxeBuilder({ page }).withTags(["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]).analyze();
  writeFileSync(join(ARTIFACTS, `axe-${name}.json`), JSON.stringify(r.violations, null, 2));
  const bad = r.violations.filter((v) => v.impact === "serious" || v.impact === "critical");
  expect(bad.map((v) => `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(" ")).join(", ")}`)).toEqual([]);
}

/** What a person sees of the conversation, to compare before and after a reload. */
async function transcript(): Promise<{ turns: number; texts: string[]; tools: string[]; images: number }> {
  return page.evaluate(() => ({
    turns: document.querySelectorAll("[data-testid=turn]").length,
    texts: [...document.querySelectorAll("[data-testid=agent-text]")].map((e) => e.textContent ?? ""),
    tools: [...document.querySelectorAll("[data-testid=tool-card]")].map((e) => `${e.getAttribute("data-call")}:${e.getAttribute("data-status")}`),
    images: document.querySelectorAll("img[data-testid=tool-image]").length,
  }));
}

beforeAll(async () => {
  if (!BASE && process.env.OMICOS_UI_PEER) {
    // The page's own run: the scripted peer (tests/peer.ts) serves dist/.
    const peer = await startPeer(join(import.meta.dirname, "..", "dist"));
    BASE = peer.url;
    stopPeer = peer.stop;
  }
  if (!BASE) throw new Error("OMICOS_UI_URL is not set: run scripts/ui-test.sh against a running stack (or OMICOS_UI_PEER=1 for the scripted peer)");
  mkdirSync(ARTIFACTS, { recursive: true });
  profile = mkdtempSync(join(tmpdir(), "omicos-ui-chromium-"));
  context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.OMICOS_CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    args: CHROMIUM_FLAGS,
    viewport: { width: 1280, height: 900 },
  });
  page = context.pages()[0] ?? (await context.newPage());
  page.on("console", (m) => {
    if (m.type() === "error") consoleErrors.push(m.text());
  });
  page.on("pageerror", (e) => consoleErrors.push(String(e)));
});

afterAll(async () => {
  writeFileSync(join(ARTIFACTS, "console-errors.txt"), consoleErrors.join("\n"));
  await context?.close();
  await stopPeer?.();
  if (profile) rmSync(profile, { recursive: true, force: true });
});

describe("the page on a live stack", () => {
  it("shows the agent cards and picks one through an example prompt", async () => {
    await page.goto(BASE);
    await expect.poll(() => page.getAttribute("[data-testid=link]", "data-link"), { timeout: 20_000 }).toBe("connected");
    const card = page.locator(`[data-testid=agent-card][data-agent=${SCRIPT.agent}]`);
    await card.waitFor();
    // Categories come in category_order: the first heading is the lowest order's.
    const headings = await page.locator(".category h3").allTextContents();
    expect(headings.length).toBeGreaterThan(1);
    await axe("cards");
    // Settings: ask before side effects, so run_python_code needs an approval.
    await page.getByText("Settings", { exact: true }).click();
    await page.getByLabel("Permission mode").selectOption("auto");
    await page.getByText("Settings", { exact: true }).click();
    const prompt = card.locator("button.prompt").first();
    const text = (await prompt.textContent()) ?? "";
    expect(text.length).toBeGreaterThan(0);
    await prompt.click();
    await expect.poll(() => page.inputValue("#composer")).toBe(text);
    await expect.poll(() => card.getByRole("button", { name: "Active" }).getAttribute("aria-pressed")).toBe("true");
    await shot("01-card-and-prompt");
  });

  it("streams the model's text in", async () => {
    await page.getByRole("button", { name: "Send" }).click();
    await page.waitForURL(/\/s\/[^/]+$/, { timeout: 20_000 });
    const first = page.locator("[data-testid=agent-text]").first();
    await first.waitFor({ timeout: 20_000 });
    // Sample the text while it arrives: several lengths short of the whole.
    const seen = new Set<number>();
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      const t = (await first.textContent()) ?? "";
      seen.add(t.length);
      if (t.includes("squares")) break;
      await page.waitForTimeout(40);
    }
    expect((await first.textContent()) ?? "").toContain("progress bar");
    expect(seen.size).toBeGreaterThanOrEqual(3);
    // The code block is highlighted.
    await expect.poll(() => page.locator("[data-testid=agent-text] pre code.language-python span").count()).toBeGreaterThan(0);
    await shot("02-streaming");
  });

  it("asks before run_python_code runs, and runs it once allowed", async () => {
    const dialog = page.getByRole("dialog");
    await dialog.waitFor({ timeout: 30_000 });
    await expect.poll(() => dialog.getByRole("heading").textContent()).toContain("run_python_code");
    expect(await dialog.textContent()).toContain("runs Python code");
    expect(await dialog.locator("pre").textContent()).toContain("tqdm");
    // The text before the call is complete now. Model text is untrusted: no
    // script element and no javascript: link survive into the page.
    expect(await page.locator("[data-testid=agent-text] a").count()).toBe(1);
    expect(await page.locator("[data-testid=agent-text] script").count()).toBe(0);
    expect(await page.locator("[data-testid=agent-text] a[href^='javascript']").count()).toBe(0);
    expect(await page.evaluate(() => (window as unknown as { __omicosXss?: number }).__omicosXss)).toBeUndefined();
    await axe("approval-dialog");
    await shot("03-approval");
    await dialog.getByRole("button", { name: "Allow once" }).click();
    await dialog.waitFor({ state: "hidden" });
    const card = page.locator(`[data-testid=tool-card][data-call=${SCRIPT.replies[0]!.tool_calls[0]!.id}]`);
    await expect.poll(() => card.getAttribute("data-status"), { timeout: 20_000 }).not.toBe("awaiting_approval");
    expect(await card.textContent()).toContain("allowed once");
  });

  it("shows the tqdm progress bar climbing to 100%", async () => {
    const bar = page.locator("[data-testid=progress]").first();
    await bar.waitFor({ timeout: 60_000 });
    const seen = new Set<number>();
    const deadline = Date.now() + 60_000;
    while (Date.now() < deadline) {
      const p = Number(await bar.getAttribute("data-percent"));
      seen.add(p);
      if (p === 100) break;
      await page.waitForTimeout(50);
    }
    expect(seen.has(100)).toBe(true);
    expect([...seen].some((p) => p > 0 && p < 100)).toBe(true);
    expect(await bar.textContent()).toContain("counting");
    await shot("04-progress");
  });

  it("shows the PNG the kernel drew", async () => {
    const img = page.locator("img[data-testid=tool-image]").first();
    await img.waitFor({ timeout: 60_000 });
    await expect.poll(() => img.evaluate((e: HTMLImageElement) => e.complete && e.naturalWidth), { timeout: 20_000 }).toBeGreaterThan(0);
    const src = (await img.getAttribute("src")) ?? "";
    expect(src).toMatch(/^\/files\/\.omicos\/outputs\/.+\.png$/);
    const res = await page.request.get(new URL(src, BASE).toString());
    expect(res.headers()["content-type"]).toBe("image/png");
    await page.getByText(SCRIPT.replies[1]!.text.split(" ")[0]!, { exact: false }).last().waitFor({ timeout: 30_000 });
    await expect.poll(() => page.locator("[data-testid=turn][aria-busy=false]").count(), { timeout: 30_000 }).toBe(1);
    await shot("05-image");
  });

  it("shows the whole conversation again after a reload, nothing lost or doubled", async () => {
    const before = await transcript();
    expect(before.turns).toBe(1);
    expect(before.images).toBe(1);
    await page.reload();
    await expect.poll(() => page.getAttribute("[data-testid=link]", "data-link"), { timeout: 20_000 }).toBe("connected");
    await expect.poll(transcript, { timeout: 20_000 }).toEqual(before);
    await axe("after-reload");
    await shot("06-reloaded");
  });

  it("cancels a long call", async () => {
    await page.fill("#composer", "now run something long");
    await page.getByRole("button", { name: "Send" }).click();
    const dialog = page.getByRole("dialog");
    await dialog.waitFor({ timeout: 30_000 });
    await dialog.getByRole("button", { name: "Allow for this session" }).click();
    const card = page.locator(`[data-testid=tool-card][data-call=${SCRIPT.replies[2]!.tool_calls[0]!.id}]`);
    await expect.poll(() => card.getAttribute("data-status"), { timeout: 30_000 }).toBe("running");
    // Live output arrives while it runs.
    await expect.poll(() => card.locator("[data-testid=tool-output]").textContent(), { timeout: 30_000 }).toMatch(/\d/);
    await shot("07-long-call");
    await page.getByRole("button", { name: "Cancel turn" }).click();
    await expect.poll(() => page.locator("[data-testid=turn-done]").last().textContent(), { timeout: 30_000 }).toBe("Cancelled");
    await expect.poll(() => card.getAttribute("data-status")).not.toBe("running");
    await expect.poll(() => page.getByRole("button", { name: "Send" }).isVisible()).toBe(true);
    expect(await page.getByRole("button", { name: "Cancel turn" }).count()).toBe(0);
    await shot("08-cancelled");
  });

  it("answers an approval as a rule: a matching call then runs without asking, another still asks", async () => {
    const [first, second, outside] = SCRIPT.replies.slice(3, 6).map((r) => r.tool_calls[0]!.id);
    await page.fill("#composer", "now write some notes");
    await page.getByRole("button", { name: "Send" }).click();
    const dialog = page.getByRole("dialog");
    await dialog.waitFor({ timeout: 30_000 });
    await expect.poll(() => dialog.getByRole("heading").textContent()).toContain("file_manager__write");
    expect(await dialog.textContent()).toContain("writes workspace files");
    const rule = dialog.getByLabel("Allow as a rule for this session");
    // Prefilled from the call: the directory of its path.
    expect(await rule.inputValue()).toBe("file_manager__write(notes/**)");
    // A rule that does not match the call is refused by the server, said in
    // the dialog, and the question stays open.
    await rule.fill("file_manager__write(other/**)");
    await dialog.getByRole("button", { name: "Allow as a rule" }).click();
    const refused = dialog.getByTestId("approval-rule-refused");
    await refused.waitFor({ timeout: 10_000 });
    expect(await refused.textContent()).toContain("does not match the approved call");
    expect(await dialog.isVisible()).toBe(true);
    const card = (id: string) => page.locator(`[data-testid=tool-card][data-call=${id}]`);
    expect(await card(first!).getAttribute("data-status")).toBe("awaiting_approval");
    await axe("approval-rule-refused");
    await shot("09-rule-refused");
    await rule.fill("file_manager__write(notes/**)");
    await dialog.getByRole("button", { name: "Allow as a rule" }).click();
    await expect.poll(() => card(first!).getAttribute("data-status"), { timeout: 20_000 }).toBe("done");
    expect(await card(first!).locator(".approval-note").textContent()).toContain("allowed for the session");
    // The next write under notes/ runs without a question; the one outside asks.
    await expect.poll(() => card(second!).getAttribute("data-status"), { timeout: 30_000 }).toBe("done");
    expect(await card(second!).locator(".approval-note").count()).toBe(0);
    await dialog.waitFor({ timeout: 30_000 });
    await expect.poll(() => card(outside!).getAttribute("data-status")).toBe("awaiting_approval");
    expect(await dialog.locator("pre").textContent()).toContain("elsewhere.md");
    expect(await dialog.getByLabel("Allow as a rule for this session").inputValue()).toBe("file_manager__write(/elsewhere.md)");
    await shot("10-outside-the-rule");
    await dialog.getByRole("button", { name: "Deny" }).click();
    await dialog.waitFor({ state: "hidden" });
    await expect.poll(() => card(outside!).getAttribute("data-status"), { timeout: 20_000 }).toBe("denied");
    await page.getByText(SCRIPT.replies[6]!.text.split(";")[0]!, { exact: false }).last().waitFor({ timeout: 30_000 });
    await expect.poll(() => page.locator("[data-testid=turn][aria-busy=false]").count(), { timeout: 30_000 }).toBe(3);
    await shot("11-rule-turn-done");
  });
});
