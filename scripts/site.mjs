// The browser bundle's site (scripts/build.sh runs it after the wasm32 cargo build): what
// `cargo leptos build --release --split --precompress` did after compiling, without
// building cargo-leptos (about 6 minutes of a fresh clone's first run on 2 cores).
//
//   node scripts/site.mjs WASM
//
// WASM is the cargo output (target/front/wasm32-unknown-unknown/wasm-release/spillway.wasm).
// The site goes to target/site (emptied first), the list of hashed names to
// target/release/hash.txt, where Leptos looks for it beside the server's binary.
//
// 1. split the wasm at its lazy routes (.tools/bin/spillway-bundle, from tools/bundle);
// 2. the main module's JS bindings (wasm-bindgen's library, in the same tool), then every
//    module optimised for size (binaryen -Oz);
// 3. minify the JS (esbuild; the npm tools are in tools/site), the CSS for the browsers of Cargo.toml's `browserquery`
//    (lightningcss), copy public/;
// 4. name every file of pkg/ by its content (below), write hash.txt;
// 5. gzip and brotli every file beside it (the server sends those when asked).
//
// Names. A file's name carries the MD5 of what it holds, base64url (22 characters, as
// cargo-leptos and Leptos's hash.txt expect), so a name served with a year's caching never
// holds anything else. Files that name others are named after those are renamed and
// patched in: the route and chunk modules and the CSS name nothing; the manifest and the
// loader name modules; the main wasm names the loader. The main JS and the loader name each
// other, so both are named by the hash of both. The main wasm imports the loader under a
// placeholder of 22 underscores, replaced in place by the loader's hash.
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import zlib from "node:zlib";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const tools = path.join(root, ".tools");
const npm = path.join(root, "tools/site/node_modules");
// Where and under which name, as Leptos.toml says (scripts/build.sh exports it).
const setting = (variable) => {
  const value = process.env[variable];
  if (!value) {
    console.error(`site: ${variable} is not set (scripts/build.sh exports Leptos.toml's settings)`);
    process.exit(2);
  }
  return value;
};
const site = path.resolve(root, setting("LEPTOS_SITE_ROOT"));
const pkg = path.join(site, setting("LEPTOS_SITE_PKG_DIR"));
const name = setting("LEPTOS_OUTPUT_NAME");
const PLACEHOLDER = "______________________";
const LOADER = `__wasm_split.${PLACEHOLDER}.js`;
const MANIFEST = "__wasm_split_manifest.json";

const wasmIn = process.argv[2];
if (!wasmIn) {
  console.error("usage: node scripts/site.mjs WASM");
  process.exit(2);
}

// A tool's output is shown as it runs; a quiet one's (wasm-opt warns about every module's
// name section) only when it fails.
function run(cmd, args, { quiet = false } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ["ignore", quiet ? "pipe" : "inherit", quiet ? "pipe" : "inherit"] });
    let output = "";
    if (quiet) for (const stream of [child.stdout, child.stderr]) stream.on("data", (d) => (output += d));
    child.on("error", (e) => reject(new Error(`${cmd}: ${e.message}`)));
    child.on("exit", (code) =>
      code === 0
        ? resolve()
        : reject(new Error(`${output}${path.basename(cmd)} ${args.join(" ")}: exit ${code}`)),
    );
  });
}

const began = Date.now();
const step = (what) => console.log(`site: ${what} (${((Date.now() - began) / 1000).toFixed(1)} s)`);

const md5 = (...parts) => {
  const h = createHash("md5");
  for (const p of parts) h.update(p);
  return h.digest("base64url");
};
const at = (file) => path.join(pkg, file);
const read = (file) => fs.readFileSync(at(file));
const rename = (from, to) => fs.renameSync(at(from), at(to));
const hashed = (file, hash) => {
  const ext = path.extname(file);
  return `${path.basename(file, ext)}.${hash}${ext}`;
};
// Every occurrence of each key of `names` in a text file, by its value.
function patchText(file, names) {
  let text = read(file).toString("utf8");
  for (const [from, to] of names) text = text.split(from).join(to);
  fs.writeFileSync(at(file), text);
}

// 1. Split.
fs.rmSync(site, { recursive: true, force: true });
fs.mkdirSync(pkg, { recursive: true });
const mainIn = wasmIn.replace(/\.wasm$/, "_split.wasm");
const bundle = path.join(tools, "bin/spillway-bundle");
await run(bundle, ["split", wasmIn, pkg, mainIn, name]);
const modules = fs.readdirSync(pkg).filter((f) => f.endsWith(".wasm"));
step("split");

// 2. Bindings, then every module optimised for size.
await run(bundle, ["bindgen", mainIn, pkg, name]);
rename(`${name}_bg.wasm`, `${name}.wasm`);
step("wasm-bindgen");
// The main module by wasm-opt's command line, the others meanwhile through binaryen's API in
// this process. Both are the JS build of binaryen (npm): started once per module, the
// command line spent most of two minutes starting for 68 small ones, and the API's output
// of the main module is about 1 KB (brotli) larger than the command line's, which the
// first page load waits for.
const main = run(
  path.join(npm, ".bin/wasm-opt"),
  ["-Oz", "--enable-bulk-memory", "--enable-nontrapping-float-to-int", at(`${name}.wasm`), "-o", at(`${name}.wasm`)],
  { quiet: true },
);
const binaryen = (await import(path.join(npm, "binaryen/index.js"))).default;
binaryen.setOptimizeLevel(2); // -Oz
binaryen.setShrinkLevel(2);
// Binaryen warns of every module's name section (the splitter writes a subsection it does not
// know); the warnings are left out.
const write = process.stderr.write.bind(process.stderr);
process.stderr.write = (chunk, ...rest) =>
  String(chunk).startsWith("warning: unknown name subsection") ? true : write(chunk, ...rest);
for (const file of modules) {
  const module = binaryen.readBinary(read(file));
  // As the command line does before it optimises.
  if (!module.validate()) throw new Error(`${file} is not valid wasm (binaryen's messages are above)`);
  module.setFeatures(module.getFeatures() | binaryen.Features.BulkMemory | binaryen.Features.NontrappingFPToInt);
  module.optimize();
  fs.writeFileSync(at(file), module.emitBinary());
  module.dispose();
}
process.stderr.write = write;
await main;
step("wasm-opt");

// 3. JS, CSS and the files of public/.
const esbuild = (await import(path.join(npm, "esbuild/lib/main.js"))).default;
const js = await esbuild.transform(read(`${name}.js`).toString("utf8"), {
  minify: true,
  format: "esm",
  target: "es2020",
});
fs.writeFileSync(at(`${name}.js`), js.code);

const { transform, browserslistToTargets } = (
  await import(path.join(npm, "lightningcss/node/index.js"))
).default;
const browserslist = (await import(path.join(npm, "browserslist/index.js"))).default;
const cargoToml = fs.readFileSync(path.join(root, "Cargo.toml"), "utf8");
const query = /^browserquery\s*=\s*"([^"]*)"/m.exec(cargoToml)?.[1] ?? "defaults";
const styleFile = /^style-file\s*=\s*"([^"]*)"/m.exec(cargoToml)?.[1] ?? "style/main.css";
const css = transform({
  filename: styleFile,
  code: fs.readFileSync(path.join(root, styleFile)),
  minify: true,
  targets: browserslistToTargets(browserslist(query)),
});
fs.writeFileSync(at(`${name}.css`), css.code);
fs.cpSync(path.join(root, "public"), site, { recursive: true });

step("JS, CSS and public/");

// 4. Names.
const names = new Map(); // old name -> new name, within pkg/
const settle = (file, hash) => {
  names.set(file, hashed(file, hash));
  rename(file, names.get(file));
};
for (const file of [...modules, `${name}.css`]) settle(file, md5(read(file)));

// The manifest lists each route's modules by stem (file name without ".wasm").
const manifest = JSON.parse(read(MANIFEST));
const stem = (file) => file.replace(/\.wasm$/, "");
const stems = new Map(modules.map((m) => [stem(m), stem(names.get(m))]));
for (const route of Object.keys(manifest)) manifest[route] = manifest[route].map((s) => stems.get(s) ?? s);
fs.writeFileSync(at(MANIFEST), JSON.stringify(manifest));
settle(MANIFEST, md5(read(MANIFEST)));

// The loader and the main JS: each names the other.
patchText(LOADER, modules.map((m) => [`"./${m}"`, `"./${names.get(m)}"`]));
const both = md5(read(LOADER), read(`${name}.js`));
const loaderHash = md5("loader", both);
const jsHash = md5("js", both);
names.set(LOADER, LOADER.replace(PLACEHOLDER, loaderHash));
names.set(`${name}.js`, hashed(`${name}.js`, jsHash));
patchText(LOADER, [[`"./${name}.js"`, `"./${names.get(`${name}.js`)}"`]]);
patchText(`${name}.js`, [[LOADER, names.get(LOADER)]]);
rename(LOADER, names.get(LOADER));
rename(`${name}.js`, names.get(`${name}.js`));

// The main wasm imports the loader by the placeholder name: the same length as the hash.
const wasm = read(`${name}.wasm`);
const from = Buffer.from(LOADER);
const to = Buffer.from(names.get(LOADER));
let patched = 0;
for (let i = wasm.indexOf(from); i !== -1; i = wasm.indexOf(from, i + to.length)) {
  to.copy(wasm, i);
  patched += 1;
}
if (patched === 0) throw new Error(`${name}.wasm does not import ${LOADER}`);
fs.writeFileSync(at(`${name}.wasm`), wasm);
settle(`${name}.wasm`, md5(wasm));

const hashOf = (file) => names.get(file).split(".").at(-2);
fs.mkdirSync(path.join(root, "target/release"), { recursive: true });
fs.writeFileSync(
  path.join(root, "target/release/hash.txt"),
  [
    `js: ${hashOf(`${name}.js`)}`,
    `wasm: ${hashOf(`${name}.wasm`)}`,
    `css: ${hashOf(`${name}.css`)}`,
    `manifest: ${hashOf(MANIFEST)}`,
    `split: ${loaderHash}`,
    "",
  ].join("\n"),
);

step("names");

// 5. Compressed copies.
const files = (dir) =>
  fs.readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? files(path.join(dir, e.name)) : [path.join(dir, e.name)],
  );
let raw = 0;
let brotli = 0;
for (const file of files(site)) {
  const data = fs.readFileSync(file);
  const br = zlib.brotliCompressSync(data, {
    params: {
      [zlib.constants.BROTLI_PARAM_QUALITY]: zlib.constants.BROTLI_MAX_QUALITY,
      [zlib.constants.BROTLI_PARAM_LGWIN]: zlib.constants.BROTLI_MAX_WINDOW_BITS,
      [zlib.constants.BROTLI_PARAM_SIZE_HINT]: data.length,
    },
  });
  fs.writeFileSync(`${file}.br`, br);
  fs.writeFileSync(`${file}.gz`, zlib.gzipSync(data, { level: 9 }));
  raw += data.length;
  brotli += br.length;
}
step(`${files(site).length / 3} files in target/site, ${raw} bytes, ${brotli} with brotli`);
