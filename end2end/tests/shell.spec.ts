import { expect, test } from "@playwright/test";
import { OverviewPage } from "./fixtures/overview-page";

test.describe("app shell", () => {
  test("navigation reaches every section", async ({ page }) => {
    const overview = new OverviewPage(page);
    await overview.goto();
    const nav = page.getByRole("navigation", { name: "Main" });
    for (const [link, heading] of [
      ["Identifiers", "Identifier inspector"],
      ["Policies", "Policies"],
      ["Audit", "Audit log"],
      ["Overview", "Overview"],
    ]) {
      await nav.getByRole("link", { name: link }).click();
      await expect(page.getByRole("heading", { level: 1, name: heading })).toBeVisible();
      await expect(nav.getByRole("link", { name: link })).toHaveAttribute("aria-current", "page");
    }
    await page.screenshot({ path: test.info().outputPath("overview.png"), fullPage: true });
  });

  test("the overview shows Redis status read on the server", async ({ page }) => {
    const overview = new OverviewPage(page);
    await overview.goto();
    await expect(overview.redisStatus).toContainText("up");
    await expect(overview.redisClock).toHaveText(/^\d\d:\d\d:\d\d\.\d{3} UTC$/);
  });

  test("checking again asks Redis again", async ({ page }, testInfo) => {
    const overview = new OverviewPage(page);
    await overview.goto();
    const hydrated = testInfo.project.name === "hydrated";
    if (hydrated) {
      await overview.waitForHydration();
      // A marker that only survives if the page is not reloaded.
      await page.evaluate(() => ((window as any).__noReload = "still here"));
    }
    const before = await overview.redisClock.textContent();
    await expect(overview.probeCount).toHaveText("Checks this visit: 0");
    await overview.checkAgain.click();
    await expect(overview.probeCount).toHaveText("Checks this visit: 1");
    await expect(overview.redisClock).not.toHaveText(before ?? "");
    await overview.checkAgain.click();
    await expect(overview.probeCount).toHaveText("Checks this visit: 2");
    if (hydrated) {
      expect(await page.evaluate(() => (window as any).__noReload)).toBe("still here");
    }
  });

  test("unknown pages answer 404", async ({ page }) => {
    const response = await page.goto("/no-such-page");
    expect(response?.status()).toBe(404);
    await expect(page.getByRole("heading", { name: "Page not found" })).toBeVisible();
  });
});
