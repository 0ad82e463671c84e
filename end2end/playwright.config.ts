import { defineConfig, devices } from "@playwright/test";

// The server is the release build, started with its own redis-server on a free port by
// ../scripts/e2e-server.sh. `make test-e2e` picks E2E_PORT.
const port = Number(process.env.E2E_PORT ?? 3100);
// Known to the specs (tests/fixtures/people.ts) and to the server script, which creates the
// users and accepts the key.
export const E2E_PASSWORD = "e2e password that is long enough";
export const E2E_SERVICE_KEY = "spw_svc_e2e_0123456789abcdef0123456789abcdef";

const chromium = {
  ...devices["Desktop Chrome"],
  launchOptions: {
    executablePath: "/usr/bin/chromium",
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  },
};

export default defineConfig({
  testDir: "./tests",
  timeout: 30_000,
  expect: { timeout: 5_000 },
  fullyParallel: false,
  workers: 1,
  retries: 0,
  forbidOnly: !!process.env.CI,
  reporter: [["list"]],
  outputDir: "test-results",
  use: {
    baseURL: `http://127.0.0.1:${port}`,
    trace: "retain-on-failure",
    screenshot: "only-on-failure",
  },
  // Every spec runs twice: hydrated, and as a browser with JavaScript off would see it.
  projects: [
    { name: "hydrated", use: { ...chromium, javaScriptEnabled: true } },
    { name: "no-js", use: { ...chromium, javaScriptEnabled: false } },
  ],
  webServer: {
    command: "../scripts/e2e-server.sh",
    url: `http://127.0.0.1:${port}/readyz`,
    env: { E2E_PORT: String(port), E2E_PASSWORD, E2E_SERVICE_KEY },
    timeout: 60_000,
    reuseExistingServer: false,
    stdout: "pipe",
    stderr: "pipe",
  },
});
