import { expect, test } from "./fixtures/test";
import { signIn } from "./fixtures/people";

test.describe("app shell", () => {
  test("signing in is required, and the navigation reaches every section", async ({ page }) => {
    const response = await page.goto("/audit");
    expect(new URL(page.url()).pathname).toBe("/login");
    expect(response?.headers()["content-security-policy"]).toContain("frame-ancestors 'none'");
    await page.screenshot({ path: test.info().outputPath("login.png"), fullPage: true });

    await signIn(page);
    const nav = page.getByRole("navigation", { name: "Main" });
    for (const [link, heading] of [
      ["Identifiers", "Identifier inspector"],
      ["Policies", "Policies"],
      ["Audit", "Audit log"],
      ["Users & keys", "Users and API keys"],
      ["Overview", "Overview"],
    ]) {
      await nav.getByRole("link", { name: link }).click();
      await expect(page.getByRole("heading", { level: 1, name: heading })).toBeVisible();
      await expect(nav.getByRole("link", { name: link })).toHaveAttribute("aria-current", "page");
    }
    await expect(page.getByTestId("redis-status")).toContainText("up");
    await expect(page.getByTestId("redis-clock")).toHaveText(/^\d\d:\d\d:\d\d\.\d{3} UTC$/);

    // Their own account, from the name in the top bar.
    await page.getByTestId("whoami").click();
    await expect(page.getByRole("heading", { level: 1, name: "Your account" })).toBeVisible();
    await expect(page.getByText("Signed in as e2e-admin (admin).")).toBeVisible();
    await page.screenshot({ path: test.info().outputPath("account.png"), fullPage: true });
  });

  test("a wrong password gets one generic answer", async ({ page }) => {
    await page.goto("/login");
    await page.getByLabel("User name").fill("e2e-admin");
    await page.getByLabel("Password").fill("not the password at all");
    await page.getByRole("button", { name: "Sign in" }).click();
    await expect(page.getByRole("alert")).toHaveText("Wrong user name or password.");
  });

  test("signing out ends the session", async ({ page }) => {
    await signIn(page, "e2e-support");
    await expect(page.getByRole("link", { name: "Users & keys" })).toHaveCount(0);
    await page.getByRole("button", { name: "Sign out" }).click();
    await expect(page).toHaveURL(/\/login/);
    await page.goto("/");
    await expect(page).toHaveURL(/\/login\?next=/);
  });

  test("unknown pages answer 404", async ({ page }) => {
    await signIn(page);
    const response = await page.goto("/no-such-page");
    expect(response?.status()).toBe(404);
    await expect(page.getByRole("heading", { name: "Page not found" })).toBeVisible();
  });
});
