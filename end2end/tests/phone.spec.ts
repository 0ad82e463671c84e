import { expect, test } from "./fixtures/test";
import { E2E_SERVICE_KEY, signIn } from "./fixtures/people";

test("every page fits a phone's width (390 px) without cutting a column", async ({ page, request }, testInfo) => {
  const user = `phone-${testInfo.project.name}`;
  for (let i = 0; i < 15; i++) {
    await request.post("/api/v1/check", {
      headers: { Authorization: `Bearer ${E2E_SERVICE_KEY}` },
      data: { policy: "demo", identifiers: { user } },
    });
  }
  await page.setViewportSize({ width: 390, height: 844 });
  await signIn(page);
  for (const path of [
    "/",
    "/?range=24h",
    "/history",
    "/history?policy=demo&range=7d",
    `/identifiers?id=user%3D${user}`,
    "/policies",
    "/policy?name=demo",
    "/audit",
    "/alerts",
    "/people",
    "/account",
  ]) {
    await page.goto(path);
    await expect(page.getByRole("heading", { level: 1 })).toBeVisible();
    const overflow = await page.evaluate(
      () => document.documentElement.scrollWidth - document.documentElement.clientWidth,
    );
    expect(overflow, `${path} is wider than the phone by ${overflow} px`).toBeLessThanOrEqual(0);
    if (path.startsWith("/identifiers")) {
      await page.screenshot({ path: test.info().outputPath("inspector-390.png"), fullPage: true });
    }
  }
});
