import { expect, test } from "./fixtures/test";
import { E2E_SERVICE_KEY, signIn, waitForHydration } from "./fixtures/people";

test("history: switch ranges, see who was checked most, open a policy's page", async ({ page, request }, testInfo) => {
  const hydrated = testInfo.project.name === "hydrated";
  const user = `hist-${testInfo.project.name}`;
  // Traffic on the demo policy: this user is checked 40 times, more than anyone else.
  for (let i = 0; i < 40; i++) {
    const r = await request.post("/api/v1/check", {
      headers: { Authorization: `Bearer ${E2E_SERVICE_KEY}` },
      data: { policy: "demo", identifiers: { user } },
    });
    expect([200, 429]).toContain(r.status());
  }

  await signIn(page);
  const nav = page.getByRole("navigation", { name: "Main" });
  await nav.getByRole("link", { name: "History" }).click();
  await expect(page.getByRole("heading", { level: 1, name: "History · every policy" })).toBeVisible();
  await expect(page.getByTestId("range-24h")).toHaveAttribute("aria-current", "page");
  await expect(page.getByRole("heading", { level: 2, name: "Checks per hour, last 24h" })).toBeVisible();
  // The instances flush every 300 ms here: the user shows up in the top list.
  await expect(async () => {
    await page.reload();
    await expect(page.getByTestId("top-checked")).toContainText(`user=${user}`, { timeout: 1000 });
  }).toPass({ timeout: 10_000 });
  const chart = page.getByTestId("history-chart");
  await expect(chart).toBeVisible();
  // Each bar has its figures as a tooltip; the scale shows the busiest period.
  expect(await chart.locator("g.bar title").count()).toBe(24);
  await expect(chart.locator("g.bar title").last()).toContainText(/\d+ allowed, \d+ denied/);
  await page.screenshot({ path: test.info().outputPath("history-24h.png"), fullPage: true });

  // Another range: a link, so it works without JavaScript; hydrated, without a page load.
  if (hydrated) {
    await waitForHydration(page);
    await page.evaluate(() => ((window as any).__noReload = "history"));
  }
  await page.getByTestId("range-7d").click();
  await expect(page.getByTestId("range-7d")).toHaveAttribute("aria-current", "page");
  await expect(page.getByRole("heading", { level: 2, name: "Checks per hour, last 7d" })).toBeVisible();
  expect(await chart.locator("g.bar title").count()).toBe(168);
  if (hydrated) expect(await page.evaluate(() => (window as any).__noReload)).toBe("history");
  await page.getByTestId("range-30d").click();
  await expect(page.getByRole("heading", { level: 2, name: "Checks per day, last 30d" })).toBeVisible();
  await expect(page.getByTestId("top-checked")).toContainText(`user=${user}`);

  // The overview: filter the policies by name (a form: works without JavaScript), switch
  // it to a past range, and open a policy's page from its totals.
  await nav.getByRole("link", { name: "Overview" }).click();
  // Unfiltered, demo is a chart only while it is the busiest (other specs' traffic may be).
  await expect(page.getByTestId("status-strip")).toBeVisible();
  if (hydrated) await waitForHydration(page);
  await page.getByRole("searchbox", { name: "Policies" }).fill("dem");
  await page.getByRole("button", { name: "Filter" }).click();
  await expect(page).toHaveURL(/filter=dem/);
  await expect(page.getByTestId("rate-demo")).toBeVisible();
  await expect(page.locator('[data-testid^="rate-e2e-"]')).toHaveCount(0);
  await page.getByTestId("range-24h").click();
  await expect(page.getByRole("heading", { level: 2, name: "Policies, last 24h" })).toBeVisible();
  await expect(page.getByRole("searchbox", { name: "Policies" })).toHaveValue("dem");
  const totals = page.getByTestId("policy-totals");
  await expect(totals).toContainText("demo");
  await expect(totals).not.toContainText("e2e-");
  await page.screenshot({ path: test.info().outputPath("overview-24h.png"), fullPage: true });
  await totals.getByRole("link", { name: "demo" }).click();
  await expect(page.getByRole("heading", { level: 1, name: "History · demo" })).toBeVisible();
  await expect(page.getByTestId("policy-version")).toContainText("version 1");
  await expect(page.getByTestId("top-checked")).toContainText(`user=${user}`);
  await page.screenshot({ path: test.info().outputPath("history-policy.png"), fullPage: true });
  await page.getByRole("link", { name: "edit the policy" }).click();
  await expect(page).toHaveURL(/\/policy\?name=demo/);
});
