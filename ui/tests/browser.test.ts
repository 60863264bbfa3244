// The page in a real browser against a real stack (scripts/ui-test.sh):
// Debian's headless chromium driven by playwright-core, the orchestrator at
// $OMICOS_UI_URL serving the page and gRPC-web, its model following
// tests/stack-script.json, every tool running for real. The steps run in
// order on one page, as a person would use it; each saves a screenshot
// under test-artifacts/, and axe-core checks every screen (the cards, a
// conversation, an approval, the phone layout): no violation at all.

import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chromium, type BrowserContext, type Locator, type Page } from "playwright-core";
import AxeBuilder from "@axe-core/playwright";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startPeer } from "./peer";

let BASE = process.env.OMICOS_UI_URL ?? "";
const PEER = !!process.env.OMICOS_UI_PEER && !process.env.OMICOS_UI_URL;
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

/** axe-core on the page as it stands: no violation, whatever its impact. */
async function axe(name: string, on: Page = page): Promise<void> {
  const r = await new AxeBuilder({ page: on }).withTags(["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]).analyze();
  writeFileSync(join(ARTIFACTS, `axe-${name}.json`), JSON.stringify(r.violations, null, 2));
  expect(r.violations.map((v) => `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(" ")).join(", ")}`)).toEqual([]);
}

/** WCAG contrast of a button's label on its fill while the pointer is on it. */
async function hoverContrast(button: Locator): Promise<number> {
  await button.hover();
  await page.waitForTimeout(50);
  return button.evaluate((el) => {
    const rgb = (c: string) => (c.match(/[\d.]+/g) ?? []).slice(0, 3).map(Number);
    const lum = (c: string) => {
      const [r, g, b] = rgb(c).map((v) => {
        const x = v / 255;
        return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4;
      });
      return 0.2126 * r! + 0.7152 * g! + 0.0722 * b!;
    };
    const st = getComputedStyle(el);
    const [a, b] = [lum(st.color), lum(st.backgroundColor)].sort((x, y) => y - x);
    return (a! + 0.05) / (b! + 0.05);
  });
}

/** Whether the element's box lies within the conversation's visible part. */
async function inView(loc: Locator): Promise<boolean> {
  return loc.evaluate((el) => {
    const m = document.getElementById("main")!.getBoundingClientRect();
    const r = el.getBoundingClientRect();
    return r.top >= m.top - 1 && r.bottom <= m.bottom + 1;
  });
}

/** Notifications the page fired (the init script records them). */
async function notifications(on: Page = page): Promise<string[]> {
  return on.evaluate(() => (window as unknown as { __omicosNotes?: string[] }).__omicosNotes ?? []);
}

/** What a person sees of the conversation, to compare before and after a reload. */
async function transcript(): Promise<{ turns: number; texts: string[]; tools: string[]; images: number }> {
  return page.evaluate(() => ({
    turns: document.querySelectorAll("[data-testid=turn]").length,
    // The text without the copy buttons' labels (they change when clicked).
    texts: [...document.querySelectorAll("[data-testid=agent-text]")].map((e) => {
      const c = e.cloneNode(true) as Element;
      c.querySelectorAll("button").forEach((b) => b.remove());
      return c.textContent ?? "";
    }),
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
  // The page's notifications, recorded where the test can read them.
  await context.addInitScript(() => {
    const w = window as unknown as { __omicosNotes: string[]; Notification: unknown };
    w.__omicosNotes = [];
    class Recorded {
      static permission = "default";
      static requestPermission = async () => (Recorded.permission = "granted");
      constructor(title: string) {
        w.__omicosNotes.push(title);
      }
      close() {}
    }
    w.Notification = Recorded;
  });
  const origin = new URL(BASE).origin;
  await context.grantPermissions(["clipboard-read", "clipboard-write", "notifications"], { origin });
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
    // The first view opens at the top of the cards, and stays there.
    await page.waitForTimeout(500);
    expect(await page.$eval("#main", (m) => m.scrollTop)).toBe(0);
    expect(await page.$eval("#main", (m) => m.scrollHeight > m.clientHeight)).toBe(true);
    // The mode in force is beside the message box: read only unless chosen.
    const mode = page.getByLabel("Permissions");
    expect(await mode.inputValue()).toBe("read_only");
    expect(await page.getByTestId("mode-help").textContent()).toContain("without side effects");
    expect(await page.title()).toBe("New chat · omicos");
    // Notifications of approvals: asked for once, by the person.
    const notify = page.getByRole("button", { name: "Notify me about approvals" });
    await notify.click();
    await notify.waitFor({ state: "detached" });
    await axe("empty-state");
    // Ask before side effects, so run_python_code needs an approval.
    await mode.selectOption("auto");
    expect(await page.getByTestId("mode-help").textContent()).toContain("approval");
    // Primary buttons keep a readable label under the pointer.
    expect(await hoverContrast(page.locator(".side").getByRole("button", { name: "New chat" }))).toBeGreaterThanOrEqual(4.5);
    const prompt = card.locator("button.prompt").first();
    const text = (await prompt.textContent()) ?? "";
    expect(text.length).toBeGreaterThan(0);
    await prompt.click();
    await expect.poll(() => page.inputValue("#composer")).toBe(text);
    await expect.poll(() => card.getByRole("button", { name: "Active" }).getAttribute("aria-pressed")).toBe("true");
    expect(await page.getByTestId("agent-pick").inputValue()).toBe(SCRIPT.agent);
    expect(await hoverContrast(page.getByRole("button", { name: "Send" }))).toBeGreaterThanOrEqual(4.5);
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
    // The tab says a question waits, and a notification went out.
    expect(await page.title()).toBe("(1) approval waiting · omicos");
    await expect.poll(() => notifications()).toEqual(["omicos: allow run_python_code?"]);
    // Put aside, then reopened from "1 approval waiting": focus follows.
    await dialog.getByRole("button", { name: "Later" }).click();
    await dialog.waitFor({ state: "hidden" });
    const waiting = page.getByRole("button", { name: "1 approval waiting" });
    await expect.poll(() => waiting.evaluate((el) => el === document.activeElement)).toBe(true);
    expect(await hoverContrast(waiting)).toBeGreaterThanOrEqual(4.5);
    await waiting.click();
    await dialog.waitFor();
    expect(await hoverContrast(dialog.getByRole("button", { name: "Allow once" }))).toBeGreaterThanOrEqual(4.5);
    // An answer that cannot reach the server says so in words, and the
    // notice goes once the page has reconnected; the question still waits.
    await context.setOffline(true);
    await dialog.getByRole("button", { name: "Allow once" }).click();
    const notice = page.getByTestId("notice");
    await expect.poll(() => notice.textContent()).toContain("the server cannot be reached");
    expect(await notice.textContent()).not.toMatch(/Failed to fetch|Unknown/);
    await context.setOffline(false);
    await expect.poll(() => page.getAttribute("[data-testid=link]", "data-link"), { timeout: 30_000 }).toBe("connected");
    await expect.poll(() => notice.textContent(), { timeout: 10_000 }).toBe("");
    expect(await dialog.isVisible()).toBe(true);
    await dialog.getByRole("button", { name: "Allow once" }).click();
    await dialog.waitFor({ state: "hidden" });
    // Answered: focus is in the message box, not lost to the page body.
    await expect.poll(() => page.evaluate(() => document.activeElement?.id)).toBe("composer");
    await expect.poll(() => page.title()).not.toContain("waiting");
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
    // Copy a code block, and the whole answer.
    const clip = () => page.evaluate(() => navigator.clipboard.readText());
    await page.locator("[data-testid=agent-text] .code-block").first().hover();
    await page.getByRole("button", { name: "Copy", exact: true }).first().click();
    await expect.poll(clip).toBe("squares = [n * n for n in range(1, 5)]");
    await page.getByTestId("copy-answer").first().click();
    await expect.poll(clip).toContain("Done: the plot of the squares is above.");
    expect(await clip()).toContain("I will **count** to twenty");
    // The chat names agents as the cards do.
    expect(await page.locator("[data-testid=user-message] .who").first().textContent()).toBe("You → Data Analyst");
    // Each tool card is its own landmark: tool name and call.
    const labels = await page.locator("[data-testid=tool-card]").evaluateAll((els) => els.map((e) => e.getAttribute("aria-label") ?? ""));
    expect(labels.length).toBeGreaterThan(0);
    expect(new Set(labels).size).toBe(labels.length);
    expect(labels[0]).toBe(`run_python_code, call ${SCRIPT.replies[0]!.tool_calls[0]!.id}`);
    await shot("05-image");
  });

  it("shows the whole conversation again after a reload, nothing lost or doubled", async () => {
    const before = await transcript();
    expect(before.turns).toBe(1);
    expect(before.images).toBe(1);
    await page.reload();
    await expect.poll(() => page.getAttribute("[data-testid=link]", "data-link"), { timeout: 20_000 }).toBe("connected");
    await expect.poll(transcript, { timeout: 20_000 }).toEqual(before);
    // Reopened at its end, the conversation is in view.
    await expect.poll(() => inView(page.getByTestId("turn").last().locator("[data-testid=agent-text]").last())).toBe(true);
    await axe("conversation");
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
    // The server out of reach: the page says so, and offers no cancel it cannot deliver.
    await context.setOffline(true);
    const lost = page.getByTestId("turn-lost");
    await lost.waitFor({ timeout: 60_000 });
    expect(await lost.textContent()).toContain("Connection lost, reconnecting");
    expect(await page.getByRole("button", { name: "Cancel turn" }).count()).toBe(0);
    expect(await page.getAttribute("[data-testid=link]", "data-link")).not.toBe("connected");
    expect(await page.locator(".turn-foot .working").count()).toBe(0);
    await shot("07b-connection-lost");
    await context.setOffline(false);
    await expect.poll(() => page.getAttribute("[data-testid=link]", "data-link"), { timeout: 30_000 }).toBe("connected");
    await lost.waitFor({ state: "detached", timeout: 30_000 });
    expect(await page.getByTestId("notice").textContent()).toBe("");
    await page.getByRole("button", { name: "Cancel turn" }).click();
    await expect.poll(() => page.locator("[data-testid=turn-done]").last().textContent(), { timeout: 30_000 }).toBe("Cancelled");
    await expect.poll(() => card.getAttribute("data-status")).not.toBe("running");
    // A stopped call says why where it can be read.
    await expect.poll(() => card.getByTestId("tool-reason").isVisible()).toBe(true);
    expect(((await card.getByTestId("tool-reason").textContent()) ?? "").length).toBeGreaterThan("Why: ".length);
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
    await expect.poll(() => card(outside!).getByTestId("tool-reason").isVisible()).toBe(true);
    await page.getByText(SCRIPT.replies[6]!.text.split(";")[0]!, { exact: false }).last().waitFor({ timeout: 30_000 });
    await expect.poll(() => page.locator("[data-testid=turn][aria-busy=false]").count(), { timeout: 30_000 }).toBe(3);
    await shot("11-rule-turn-done");
  });

  it("sends a reopened session's message to that session's agent, and brings it into view", async () => {
    const first = new URL(page.url()).pathname;
    // A new chat with another agent picked (Coder has no run_python_code).
    await page.locator(".side").getByRole("button", { name: "New chat" }).click();
    await page.waitForURL((u) => u.pathname === "/");
    // Back to the empty state: it opens at the top of the cards, not where the conversation was.
    await page.waitForTimeout(300);
    expect(await page.$eval("#main", (m) => m.scrollTop)).toBe(0);
    await page.locator("[data-testid=agent-card][data-agent=coder]").getByRole("button", { name: "Talk to Coder" }).click();
    expect(await page.getByTestId("agent-pick").inputValue()).toBe("coder");
    // Reopen the first session: its own agent answers there.
    await page.locator(`[data-testid=session-link][href="${first}"]`).click();
    await page.waitForURL((u) => u.pathname === first);
    await expect.poll(() => page.locator("[data-testid=turn]").count(), { timeout: 20_000 }).toBe(3);
    await expect.poll(() => page.getByTestId("agent-pick").inputValue()).toBe(SCRIPT.agent);
    // Scrolled up to the top, then Send: the new message comes into view.
    await page.$eval("#main", (m) => (m.scrollTop = 0));
    await page.waitForTimeout(200);
    await page.fill("#composer", "plot it again");
    await page.getByRole("button", { name: "Send" }).click();
    const mine = page.locator("[data-testid=user-message]", { hasText: "plot it again" });
    await mine.waitFor({ timeout: 20_000 });
    await expect.poll(() => inView(mine), { timeout: 10_000 }).toBe(true);
    // run_python_code was allowed for this session in turn 2: it runs without a question.
    const again = page.locator(`[data-testid=tool-card][data-call=${SCRIPT.replies[7]!.tool_calls[0]!.id}]`);
    await expect.poll(() => again.getAttribute("data-status"), { timeout: 30_000 }).toBe("done");
    await expect.poll(() => page.locator("[data-testid=turn][aria-busy=false]").count(), { timeout: 30_000 }).toBe(4);
    expect(await page.locator("[data-testid=error-event]").count()).toBe(0);
    expect(await mine.locator(".who").textContent()).toBe("You → Data Analyst");
    await page.locator(".table-wrap").waitFor();
    await shot("12-reopened-session");
  });

  it("fits a phone: sessions in a drawer, New chat at hand, wide content scrolls in its own box", async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    try {
      await page.waitForTimeout(300);
      // No sideways scroll of the page or the conversation.
      expect(await page.evaluate(() => document.documentElement.scrollWidth)).toBeLessThanOrEqual(390);
      expect(await page.$eval("#main", (m) => m.scrollWidth - m.clientWidth)).toBeLessThanOrEqual(0);
      // The table scrolls inside its own box; the image shrinks to fit.
      const wrap = page.locator(".table-wrap").last();
      expect(await wrap.evaluate((w) => w.scrollWidth > w.clientWidth)).toBe(true);
      const img = page.locator("[data-testid=agent-text] img").last();
      const mainWidth = await page.$eval("#main", (m) => m.clientWidth);
      expect(await img.evaluate((e) => e.getBoundingClientRect().width)).toBeLessThanOrEqual(mainWidth);
      const newChat = page.locator(".top").getByRole("button", { name: "New chat" });
      expect(await newChat.isVisible()).toBe(true);
      const links = page.locator("[data-testid=session-link]");
      expect(await links.first().isVisible()).toBe(false);
      await axe("phone");
      await shot("13-phone");
      const toggle = page.getByRole("button", { name: "Sessions", exact: true });
      await toggle.click();
      expect(await toggle.getAttribute("aria-expanded")).toBe("true");
      await links.first().waitFor();
      expect(await links.first().isVisible()).toBe(true);
      await axe("phone-drawer");
      await shot("14-phone-drawer");
      await page.keyboard.press("Escape");
      await expect.poll(() => links.first().isVisible()).toBe(false);
    } finally {
      await page.setViewportSize({ width: 1280, height: 900 });
    }
  });

  it("finds sessions by search and deletes one", async () => {
    await page.locator(".side").getByRole("button", { name: "New chat" }).click();
    await page.waitForURL((u) => u.pathname === "/");
    await page.fill("#composer", "a throwaway question");
    await page.getByRole("button", { name: "Send" }).click();
    await page.waitForURL(/\/s\/[^/]+$/, { timeout: 20_000 });
    const gone = new URL(page.url()).pathname;
    await page.getByText(SCRIPT.replies[9]!.text).waitFor({ timeout: 30_000 });
    const links = page.locator("[data-testid=session-link]");
    await expect.poll(() => links.count(), { timeout: 20_000 }).toBe(2);
    const search = page.getByLabel("Search sessions");
    await search.fill("throwaway");
    await expect.poll(() => links.count()).toBe(1);
    expect(await links.first().getAttribute("href")).toBe(gone);
    await search.fill("no such words here");
    await expect.poll(() => links.count()).toBe(0);
    expect(await page.locator(".sessions").textContent()).toContain("No session matches");
    await search.fill("");
    await expect.poll(() => links.count()).toBe(2);
    page.once("dialog", (d) => void d.accept());
    await page.locator(".session-item", { has: page.locator(`a[href="${gone}"]`) }).getByRole("button", { name: /^Delete session/ }).click();
    await page.waitForURL((u) => u.pathname === "/");
    await expect.poll(() => links.count(), { timeout: 10_000 }).toBe(1);
    // Gone at the server too, not only from this list.
    await page.reload();
    await expect.poll(() => page.locator("[data-testid=session-link]").count(), { timeout: 20_000 }).toBe(1);
    expect(await page.locator(`[data-testid=session-link][href="${gone}"]`).count()).toBe(0);
  });

  // Past-turn actions need the server's RewindSession, ForkSession and
  // RenameSession, and the fake model's {{user_messages}}: the real stack only.
  const turnsDone = () => page.locator("[data-testid=turn][aria-busy=false]").count();
  const userTexts = () => page.locator("[data-testid=user-message] .user-text").allTextContents();
  const lastAnswer = async () => (await page.locator("[data-testid=agent-text]").last().textContent()) ?? "";

  // The scripted peer has no RewindSession or RenameSession: the page must say so, never fail silently.
  it.runIf(PEER)("says so when the server refuses a rewind or a rename", async () => {
    await page.locator("[data-testid=session-link]").first().click();
    await expect.poll(() => page.getByTestId("turn").count(), { timeout: 20_000 }).toBeGreaterThan(0);
    const turns = await page.getByTestId("turn").count();
    await page.getByTestId("turn").first().getByTestId("edit-message").click();
    await page.getByLabel(/^Edit your message/).fill("an edit the server cannot take");
    await page.getByRole("button", { name: "Rewind and ask again" }).click();
    const notice = page.getByTestId("notice");
    await expect.poll(() => notice.textContent(), { timeout: 10_000 }).toContain("was not rewound");
    expect(await notice.textContent()).toContain("Unimplemented");
    // Nothing was taken away, and the edit is still there to try again.
    expect(await page.getByTestId("turn").count()).toBe(turns);
    expect(await page.getByLabel(/^Edit your message/).inputValue()).toBe("an edit the server cannot take");
    await page.getByRole("button", { name: "Discard edit" }).click();
    const here = new URL(page.url()).pathname;
    await page.locator(".session-item", { has: page.locator(`a[href="${here}"]`) }).getByRole("button", { name: /^Rename session/ }).click();
    await page.getByLabel(/^New title for/).fill("a title the server cannot take");
    await page.getByRole("button", { name: "Save title" }).click();
    await expect.poll(() => page.getByTestId("rename-error").textContent(), { timeout: 10_000 }).toContain("Unimplemented");
    await axe("refused-rename");
    await page.getByRole("button", { name: "Keep title" }).click();
  });

  it.skipIf(PEER)("edits a past message and asks again: the old turn is gone, for the model too, and stays gone on reload", async () => {
    await page.locator(".side").getByRole("button", { name: "New chat" }).click();
    await page.waitForURL((u) => u.pathname === "/");
    await page.fill("#composer", "the first question");
    await page.getByRole("button", { name: "Send" }).click();
    await page.waitForURL(/\/s\/[^/]+$/, { timeout: 20_000 });
    await page.getByText(SCRIPT.replies[10]!.text).waitFor({ timeout: 30_000 });
    await expect.poll(turnsDone, { timeout: 30_000 }).toBe(1);
    await page.fill("#composer", "the second question");
    await page.getByRole("button", { name: "Send" }).click();
    await page.getByText(SCRIPT.replies[11]!.text).waitFor({ timeout: 30_000 });
    await expect.poll(turnsDone, { timeout: 30_000 }).toBe(2);
    const second = page.getByTestId("turn").nth(1);
    await second.getByTestId("edit-message").click();
    const box = page.getByLabel(/^Edit your message/);
    expect(await box.inputValue()).toBe("the second question");
    await box.fill("the second question, edited");
    await axe("edit-message");
    await shot("16-edit-message");
    await page.getByRole("button", { name: "Rewind and ask again" }).click();
    await page.getByText("Answered the edit", { exact: false }).waitFor({ timeout: 30_000 });
    await expect.poll(turnsDone, { timeout: 30_000 }).toBe(2);
    expect(await page.getByTestId("notice").textContent()).toBe("");
    expect(await userTexts()).toEqual(["the first question", "the second question, edited"]);
    // The model was sent the edited question, and not the one it replaced.
    await expect.poll(lastAnswer, { timeout: 10_000 }).toContain("the model saw: ");
    const saw = await lastAnswer();
    expect(saw).toContain("the first question | the second question, edited");
    expect(saw).not.toMatch(/the second question( \||$)/);
    expect(await page.getByText(SCRIPT.replies[11]!.text).count()).toBe(0);
    await shot("17-edited");
    // The log keeps the old turn, marked rewound: a reload must not bring it back.
    const before = await transcript();
    await page.reload();
    await expect.poll(() => page.getAttribute("[data-testid=link]", "data-link"), { timeout: 20_000 }).toBe("connected");
    await expect.poll(transcript, { timeout: 20_000 }).toEqual(before);
    expect(await userTexts()).toEqual(["the first question", "the second question, edited"]);
    expect(await page.getByText(SCRIPT.replies[11]!.text).count()).toBe(0);
  });

  it.skipIf(PEER)("regenerates the last answer from the same message", async () => {
    await page.getByTestId("regenerate").click();
    await page.getByText("Regenerated; the model saw:", { exact: false }).waitFor({ timeout: 30_000 });
    await expect.poll(turnsDone, { timeout: 30_000 }).toBe(2);
    expect(await page.getByTestId("notice").textContent()).toBe("");
    expect(await userTexts()).toEqual(["the first question", "the second question, edited"]);
    expect(await lastAnswer()).toContain("the model saw: the first question | the second question, edited");
    expect(await page.getByText("Answered the edit", { exact: false }).count()).toBe(0);
    await axe("regenerated");
    await shot("18-regenerated");
  });

  it.skipIf(PEER)("forks a new session from a turn, and the page switches to it", async () => {
    const original = new URL(page.url()).pathname;
    const links = page.locator("[data-testid=session-link]");
    const sessionsBefore = await links.count();
    await page.getByTestId("turn").first().getByRole("button", { name: /^Fork from here/ }).click();
    await page.waitForURL((u) => u.pathname !== original && /^\/s\/[^/]+$/.test(u.pathname), { timeout: 20_000 });
    expect(await page.getByTestId("notice").textContent()).toBe("");
    // The fork holds the history up to that turn: its own log's turns, or
    // (a fork copies what the model sees, not the parent's events) the
    // history GetSession gives, shown above as carried over.
    const shown = () =>
      page.locator("[data-testid=user-message] .user-text, [data-testid=carried-user] .user-text").allTextContents();
    await expect.poll(shown, { timeout: 20_000 }).toEqual(["the first question"]);
    expect(await page.getByText(SCRIPT.replies[10]!.text).count()).toBe(1);
    expect(await page.getByText("the second question", { exact: false }).count()).toBe(0);
    await axe("forked");
    // It is in the list, beside the session it came from.
    const fork = new URL(page.url()).pathname;
    await expect.poll(() => links.count(), { timeout: 10_000 }).toBe(sessionsBefore + 1);
    expect(await page.locator(`[data-testid=session-link][href="${fork}"]`).getAttribute("aria-current")).toBe("page");
    expect(await page.locator(`[data-testid=session-link][href="${original}"]`).count()).toBe(1);
    await shot("19-forked");
  });

  it.skipIf(PEER)("renames a session in the list, refusing an empty or too long title", async () => {
    const here = new URL(page.url()).pathname;
    const item = page.locator(".session-item", { has: page.locator(`a[href="${here}"]`) });
    await item.getByRole("button", { name: /^Rename session/ }).click();
    const box = page.getByLabel(/^New title for/);
    await expect.poll(() => box.evaluate((el) => el === document.activeElement)).toBe(true);
    await box.fill("   ");
    await page.getByRole("button", { name: "Save title" }).click();
    const error = page.getByTestId("rename-error");
    await expect.poll(() => error.textContent()).toBe("A title cannot be empty.");
    await box.fill("x".repeat(201));
    await page.getByRole("button", { name: "Save title" }).click();
    await expect.poll(() => error.textContent()).toContain("at most 200 characters");
    expect(await box.getAttribute("aria-invalid")).toBe("true");
    await axe("rename-refused");
    await shot("20-rename-refused");
    await box.fill("Forked from the first question");
    await page.getByRole("button", { name: "Save title" }).click();
    const link = page.locator(`[data-testid=session-link][href="${here}"]`);
    await expect.poll(() => link.locator(".s-title").textContent(), { timeout: 10_000 }).toBe("Forked from the first question");
    await expect.poll(() => page.title()).toBe("Forked from the first question · omicos");
    // Kept by the server, not only by this page.
    await page.reload();
    await expect.poll(() => page.locator(`[data-testid=session-link][href="${here}"] .s-title`).textContent(), { timeout: 20_000 }).toBe("Forked from the first question");
  });

  it.skipIf(PEER)("steers a running turn from the composer: the message shows where it joined, and the model reads it", async () => {
    const turnsBefore = await page.getByTestId("turn").count();
    await page.fill("#composer", "count the files");
    await page.getByRole("button", { name: "Send" }).click();
    await page.getByText("Counting the files", { exact: false }).waitFor({ timeout: 30_000 });
    // The turn runs: the composer stays usable, and Send steers.
    const send = page.getByTestId("send");
    await expect.poll(() => send.getAttribute("data-steer")).toBe("true");
    await page.fill("#composer", "and name the biggest one");
    expect(await send.isEnabled()).toBe(true);
    expect(await page.getByTestId("turn").last().getByTestId("edit-message").isDisabled()).toBe(true);
    await send.click();
    const steer = page.getByTestId("steer");
    await steer.waitFor({ timeout: 30_000 });
    expect(await steer.locator(".user-text").textContent()).toBe("and name the biggest one");
    expect(await page.inputValue("#composer")).toBe("");
    await page.getByText("Listed; the model saw:", { exact: false }).waitFor({ timeout: 30_000 });
    expect(await lastAnswer()).toContain("count the files | and name the biggest one");
    // In the fork, what it carried over still shows above its own first turn.
    await expect
      .poll(() => page.locator("[data-testid=user-message] .user-text, [data-testid=carried-user] .user-text").allTextContents(), { timeout: 10_000 })
      .toEqual(["the first question", "count the files"]);
    expect(await page.getByTestId("notice").textContent()).toBe("");
    // One turn, not two: the steered message joined the running one.
    await expect.poll(turnsDone, { timeout: 30_000 }).toBe(turnsBefore + 1);
    expect(await page.getByTestId("turn").count()).toBe(turnsBefore + 1);
    await axe("steered");
    await shot("21-steered");
  });

  // UploadFiles and the attachment line are the server's: the real stack only.
  const WORKSPACE = process.env.OMICOS_UI_WORKSPACE ?? "";
  const UPLOAD_LIMIT = Number(process.env.OMICOS_UI_UPLOAD_LIMIT || 25 << 20);
  const ATTACHED = "Attached files (in the workspace):";
  /** The bytes of `rel` in the stack's workspace (the caller's: the root or a tenant's folder under it); null when absent. */
  const inWorkspace = (rel: string): Buffer | null => {
    const walk = (dir: string): string[] =>
      readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? walk(join(dir, e.name)) : e.isFile() ? [join(dir, e.name)] : []));
    const found = walk(WORKSPACE).filter((p) => p.endsWith(`/${rel}`));
    expect(found.length, `${rel} in ${WORKSPACE}: ${found.join(", ")}`).toBeLessThanOrEqual(1);
    return found.length ? readFileSync(found[0]!) : null;
  };
  /** The chips above the message box: `name (size)`. */
  const chips = () =>
    page.getByTestId("attach-chip").evaluateAll((els) => els.map((e) => `${e.querySelector(".chip-name")?.textContent} (${e.querySelector(".chip-size")?.textContent})`));
  const sentFiles = () => page.getByTestId("sent-file").evaluateAll((els) => els.map((e) => e.getAttribute("data-path")));

  it.skipIf(PEER)("attaches files to a message: the button, a drop, a clash, a file over the limit", async () => {
    const csv = "city,temp\nOslo,-3\nLisboa,17\n";
    await page.locator(".side").getByRole("button", { name: "New chat" }).click();
    await page.waitForURL((u) => u.pathname === "/");
    // The Attach button comes right after the message box, by keyboard too,
    // and opens the browser's file chooser. (Waited for before the key is
    // pressed: playwright turns the chooser's interception on asynchronously.)
    const chosen = page.waitForEvent("filechooser", { timeout: 20_000 });
    await page.focus("#composer");
    await page.keyboard.press("Tab");
    const attach = page.getByRole("button", { name: "Attach files" });
    await expect.poll(() => attach.evaluate((el) => el === document.activeElement)).toBe(true);
    await page.waitForTimeout(300);
    await page.keyboard.press("Enter");
    const chooser = await chosen;
    expect(chooser.isMultiple()).toBe(true);
    await chooser.setFiles({ name: "data.csv", mimeType: "text/csv", buffer: Buffer.from(csv) });
    await expect.poll(chips).toEqual([`data.csv (${csv.length} bytes)`]);
    // Taken off by its remove button, then chosen again through the input.
    await page.getByRole("button", { name: "Remove data.csv" }).click();
    await expect.poll(chips).toEqual([]);
    const input = page.getByTestId("attach-input");
    await input.setInputFiles({ name: "data.csv", mimeType: "text/csv", buffer: Buffer.from(csv) });
    await expect.poll(chips).toEqual([`data.csv (${csv.length} bytes)`]);
    await page.fill("#composer", "which city is warmer?");
    await axe("attached");
    await shot("22-attached");
    await page.getByRole("button", { name: "Send" }).click();
    await page.waitForURL(/\/s\/[^/]+$/, { timeout: 20_000 });
    // The model was told where the file is; its file tool read the same bytes.
    await page.getByText("Reading the attached file", { exact: false }).waitFor({ timeout: 30_000 });
    await page.getByText(SCRIPT.replies[17]!.text).waitFor({ timeout: 30_000 });
    const saw = (await page.locator("[data-testid=agent-text]", { hasText: "Reading the attached file" }).textContent()) ?? "";
    expect(saw).toContain("which city is warmer?");
    expect(saw).toContain(`${ATTACHED} uploads/data.csv (${csv.length} bytes)`);
    const read = page.locator(`[data-testid=tool-card][data-call=${SCRIPT.replies[16]!.tool_calls[0]!.id}]`);
    await expect.poll(() => read.getAttribute("data-status"), { timeout: 30_000 }).toBe("done");
    for (const line of csv.trim().split("\n")) expect(await read.textContent()).toContain(line);
    if (WORKSPACE) expect(inWorkspace("uploads/data.csv")?.toString()).toBe(csv);
    // Sent: the chips are gone from the composer and the message shows its file.
    expect(await chips()).toEqual([]);
    expect(await userTexts()).toEqual(["which city is warmer?"]);
    expect(await sentFiles()).toEqual(["uploads/data.csv"]);
    expect(await page.getByTestId("sent-file").textContent()).toContain(`${csv.length} bytes`);
    await expect.poll(turnsDone, { timeout: 30_000 }).toBe(1);
    // The session is named by what was typed, not by the attachment line.
    await expect.poll(() => page.title(), { timeout: 10_000 }).toBe("which city is warmer? · omicos");

    // A file dropped on the conversation, and the same name again: the server keeps both.
    const dropped = await page.evaluateHandle(() => {
      const dt = new DataTransfer();
      dt.items.add(new File(["dropped\n"], "notes.txt", { type: "text/plain" }));
      return dt;
    });
    await page.dispatchEvent("#main", "dragenter", { dataTransfer: dropped });
    await page.dispatchEvent("#main", "dragover", { dataTransfer: dropped });
    await expect.poll(() => page.locator(".drop-hint").count()).toBe(1);
    await page.dispatchEvent("#main", "drop", { dataTransfer: dropped });
    await expect.poll(() => page.locator(".drop-hint").count()).toBe(0);
    await input.setInputFiles({ name: "data.csv", mimeType: "text/csv", buffer: Buffer.from("second\n") });
    await expect.poll(chips).toEqual(["notes.txt (8 bytes)", "data.csv (7 bytes)"]);
    await page.fill("#composer", "and these two");
    await page.getByRole("button", { name: "Send" }).click();
    await page.getByText("Got the second batch", { exact: false }).waitFor({ timeout: 30_000 });
    // Streamed in two pieces: wait for the whole answer.
    await expect.poll(lastAnswer, { timeout: 10_000 }).toContain("(7 bytes)");
    const saw2 = await lastAnswer();
    expect(saw2).toContain("and these two");
    expect(saw2).toContain(`${ATTACHED} uploads/notes.txt (8 bytes), uploads/data (1).csv (7 bytes)`);
    expect(await sentFiles()).toEqual(["uploads/data.csv", "uploads/notes.txt", "uploads/data (1).csv"]);
    if (WORKSPACE) {
      expect(inWorkspace("uploads/data.csv")?.toString()).toBe(csv);
      expect(inWorkspace("uploads/data (1).csv")?.toString()).toBe("second\n");
      expect(inWorkspace("uploads/notes.txt")?.toString()).toBe("dropped\n");
    }
    await expect.poll(turnsDone, { timeout: 30_000 }).toBe(2);

    // A file pasted into the message box (a screenshot) becomes a chip, and
    // no text; taken off again, focus goes back to the message box.
    await page.locator("#composer").evaluate((el) => {
      const dt = new DataTransfer();
      dt.items.add(new File([new Uint8Array([137, 80, 78, 71])], "image.png", { type: "image/png" }));
      el.dispatchEvent(new ClipboardEvent("paste", { clipboardData: dt, bubbles: true, cancelable: true }));
    });
    await expect.poll(chips).toEqual(["image.png (4 bytes)"]);
    expect(await page.inputValue("#composer")).toBe("");
    await page.getByRole("button", { name: "Remove image.png" }).click();
    await expect.poll(chips).toEqual([]);
    expect(await page.evaluate(() => document.activeElement?.id)).toBe("composer");

    // A file over the limit: refused with a sentence that says what to do;
    // the message and the file stay, no turn starts, nothing is written.
    // The page knows the limit (GetClientConfig) and says so without sending the bytes.
    const uploads: string[] = [];
    const seen = (r: { url(): string }) => {
      if (r.url().includes("/UploadFiles")) uploads.push(r.url());
    };
    page.on("request", seen);
    await page.fill("#composer", "summarise the big one");
    await input.setInputFiles({ name: "big.bin", mimeType: "application/octet-stream", buffer: Buffer.alloc(UPLOAD_LIMIT + (1 << 20), 7) });
    await page.getByRole("button", { name: "Send" }).click();
    const notice = page.getByTestId("notice");
    const mb = (n: number) => `${Math.round(n / (1 << 20))} MB`;
    await expect.poll(() => notice.textContent(), { timeout: 20_000 }).toContain(`big.bin is ${mb(UPLOAD_LIMIT + (1 << 20))}; the limit is ${mb(UPLOAD_LIMIT)}. Attach a smaller file.`);
    expect(await notice.textContent()).not.toContain("uploads.max_file_bytes");
    expect(await page.inputValue("#composer")).toBe("summarise the big one");
    expect(await chips()).toEqual([`big.bin (${mb(UPLOAD_LIMIT + (1 << 20))})`]);
    expect(await page.getByTestId("turn").count()).toBe(2);
    if (WORKSPACE) expect(inWorkspace("uploads/big.bin")).toBeNull();
    page.off("request", seen);
    expect(uploads, "the refused file was never sent").toEqual([]);
    await axe("attach-refused");
    await shot("23-attach-refused");

    // The phone: the chip and the buttons fit, nothing scrolls sideways.
    await page.setViewportSize({ width: 390, height: 844 });
    try {
      await page.waitForTimeout(300);
      expect(await page.evaluate(() => document.documentElement.scrollWidth)).toBeLessThanOrEqual(390);
      expect(await page.getByRole("button", { name: "Attach files" }).isVisible()).toBe(true);
      expect(await page.getByRole("button", { name: "Remove big.bin" }).isVisible()).toBe(true);
      await axe("phone-attached");
      await shot("24-phone-attached");
    } finally {
      await page.setViewportSize({ width: 1280, height: 900 });
    }
    await page.getByRole("button", { name: "Remove big.bin" }).click();
    await page.fill("#composer", "");

    // A reload shows the sent files again: they come from the log.
    const before = await transcript();
    await page.reload();
    await expect.poll(() => page.getAttribute("[data-testid=link]", "data-link"), { timeout: 20_000 }).toBe("connected");
    await expect.poll(transcript, { timeout: 20_000 }).toEqual(before);
    expect(await userTexts()).toEqual(["which city is warmer?", "and these two"]);
    expect(await sentFiles()).toEqual(["uploads/data.csv", "uploads/notes.txt", "uploads/data (1).csv"]);
    await axe("attached-reloaded");
  });

  it.skipIf(PEER)("offers a tool call's cut arguments whole, byte for byte, through ReadValue", async () => {
    const call = SCRIPT.replies[19]!.tool_calls[0]!;
    // What the model sent: the script's {{repeat:…}} expanded by the fake.
    const whole = JSON.stringify({ path: "0123456789".repeat(7000) });
    await page.locator(".side").getByRole("button", { name: "New chat" }).click();
    await page.waitForURL((u) => u.pathname === "/");
    await page.fill("#composer", "read the file with the long name");
    await page.getByRole("button", { name: "Send" }).click();
    await page.waitForURL(/\/s\/[^/]+$/, { timeout: 20_000 });
    await page.getByText(SCRIPT.replies[20]!.text).waitFor({ timeout: 30_000 });
    const card = page.locator(`[data-testid=tool-card][data-call=${call.id}]`);
    // Under the card's Arguments, with the head that was shown.
    await card.locator("details.args > summary").click();
    const offer = card.getByTestId("whole-value");
    await offer.waitFor({ timeout: 20_000 });
    expect(await offer.textContent()).toContain(`Shown cut: ${(whole.length / 1e3).toFixed(1)} kB in all.`);
    // The card shows the head, not the whole value.
    const shown = (await card.textContent()) ?? "";
    expect(shown.length).toBeLessThan(whole.length);
    const downloaded = page.waitForEvent("download", { timeout: 20_000 });
    await offer.getByRole("button", { name: "Download it whole" }).click();
    const file = await (await downloaded).path();
    expect(readFileSync(file).toString()).toBe(whole);
    await axe("cut-value");
    await shot("25-cut-value");
    // After a reload the offer is still there (the reference is in the log).
    await page.reload();
    await expect.poll(() => page.getAttribute("[data-testid=link]", "data-link"), { timeout: 20_000 }).toBe("connected");
    await card.locator("details.args > summary").click();
    await card.getByTestId("whole-value").waitFor({ timeout: 20_000 });
  });

  it.skipIf(PEER)("offers an approval's cut arguments whole before the person decides", async () => {
    const call = SCRIPT.replies[21]!.tool_calls[0]!;
    const whole = JSON.stringify({ code: `x = '${"0123456789".repeat(7000)}'` });
    await page.locator(".side").getByRole("button", { name: "New chat" }).click();
    await page.waitForURL((u) => u.pathname === "/");
    // The data analyst (it has run_python_code), asking before side effects.
    await page
      .locator(`[data-testid=agent-card][data-agent=${SCRIPT.agent}]`)
      .getByRole("button", { name: /^Talk to / })
      .click();
    await expect.poll(() => page.getByTestId("agent-pick").inputValue()).toBe(SCRIPT.agent);
    await page.getByLabel("Permissions").selectOption("auto");
    await page.fill("#composer", "run the long cell");
    await page.getByRole("button", { name: "Send" }).click();
    const dialog = page.getByRole("dialog");
    await dialog.waitFor({ timeout: 30_000 });
    await expect.poll(() => dialog.getByRole("heading").textContent()).toContain(call.name);
    // The dialog shows the head only, and says so, with the whole a click away.
    const offer = dialog.getByTestId("whole-value");
    await offer.waitFor({ timeout: 20_000 });
    expect(await offer.textContent()).toContain(`Shown cut: ${(whole.length / 1e3).toFixed(1)} kB in all.`);
    expect(((await dialog.locator("pre").textContent()) ?? "").length).toBeLessThan(whole.length);
    const downloaded = page.waitForEvent("download", { timeout: 20_000 });
    await offer.getByRole("button", { name: "Download it whole" }).click();
    const file = await (await downloaded).path();
    expect(readFileSync(file).toString()).toBe(whole);
    // Still asking: reading the whole decided nothing.
    await expect.poll(() => dialog.isVisible()).toBe(true);
    await axe("approval-cut-value");
    await shot("26-approval-cut-value");
    await dialog.getByRole("button", { name: "Deny" }).click();
    await page.getByText(SCRIPT.replies[22]!.text).waitFor({ timeout: 30_000 });
    const card = page.locator(`[data-testid=tool-card][data-call=${call.id}]`);
    await expect.poll(() => card.getAttribute("data-status"), { timeout: 20_000 }).toBe("denied");
  });

  it.skipIf(PEER)("says what to do when the token is missing or wrong, and stops asking", async () => {
    const token = /#token=([^&]+)/.exec(BASE)?.[1];
    expect(token, "the stack's page URL carries its token").toBeTruthy();
    const origin = new URL(BASE).origin;
    const other = await context.newPage();
    try {
      const asked: string[] = [];
      other.on("request", (r) => {
        if (r.url().includes("/ListSessions")) asked.push(r.url());
      });
      // No token at all.
      await other.goto(`${origin}/`);
      const link = () => other.getAttribute("[data-testid=link]", "data-link");
      await expect.poll(link, { timeout: 20_000 }).toBe("signed-out");
      const text = other.getByTestId("signin-text");
      expect(await text.textContent()).toMatch(/^This page is not signed in\. .*omicos up/);
      const page_ = (await other.textContent("body")) ?? "";
      expect(page_).not.toMatch(/Bearer|authorization|Unauthenticated/i);
      expect(page_).not.toContain("catalog is empty");
      expect(page_).not.toContain("Connected");
      await axe("signed-out", other);
      await other.screenshot({ path: join(ARTIFACTS, "15-no-token.png") });
      // A refused token is not asked again and again (the ping runs every 7.5 s).
      const before = asked.length;
      await other.waitForTimeout(17_000);
      expect(asked.length - before).toBe(0);
      expect(await link()).toBe("signed-out");
      // A wrong token says so.
      await other.goto(`${origin}/#token=not-the-token`);
      await other.reload();
      await expect.poll(link, { timeout: 20_000 }).toBe("signed-out");
      expect(await text.textContent()).toContain("refused");
      // The right one, pasted: signed in.
      await other.getByLabel("Access token").fill(decodeURIComponent(token!));
      await other.getByRole("button", { name: "Sign in" }).click();
      await expect.poll(link, { timeout: 20_000 }).toBe("connected");
      expect(await other.getByTestId("signin").count()).toBe(0);
      await other.locator(`[data-testid=agent-card][data-agent=${SCRIPT.agent}]`).waitFor();
    } finally {
      await other.close();
    }
  });
});
