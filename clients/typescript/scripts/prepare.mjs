// Builds dist/ when the package is installed from its folder or a git clone (npm runs
// `prepare` there without installing its devDependencies) and before `npm pack`: installs
// what the build needs here first when it is missing, then compiles.
import { execSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = join(dirname(fileURLToPath(import.meta.url)), "..");
const run = (command) => execSync(command, { cwd: here, stdio: ["ignore", "inherit", "inherit"] });

if (!existsSync(join(here, "node_modules", "typescript")) || !existsSync(join(here, "node_modules", "@types", "express"))) {
  run("npm install --no-save --ignore-scripts --include=dev --no-audit --no-fund");
}
run(`node ${JSON.stringify(join(here, "node_modules", "typescript", "bin", "tsc"))} -p .`);
