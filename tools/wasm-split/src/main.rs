//! Splits the browser bundle at its lazy routes (Leptos's `#[lazy_route]`), as cargo-leptos's
//! `--split` does: a main module for wasm-bindgen, a wasm module per route and per shared
//! chunk, the loader that fetches them, and the manifest Leptos reads to prefetch a route's
//! modules.
//!
//! Usage: `spillway-wasm-split INPUT.wasm PKG_DIR MAIN_OUT.wasm OUTPUT_NAME`
//!
//! - the route and chunk modules and the loader go to PKG_DIR; the loader is named
//!   `__wasm_split.______________________.js`, a placeholder as long as the hash that replaces
//!   it (the main module imports it by that name, and the name is patched in place);
//! - the main module goes to MAIN_OUT.wasm; the loader imports `./OUTPUT_NAME.js`, the
//!   module wasm-bindgen writes;
//! - the manifest goes to PKG_DIR/__wasm_split_manifest.json.

use std::path::Path;
use std::process::ExitCode;

/// The loader's name in the main module; scripts/site.mjs replaces the underscores with the
/// loader's hash, which is as long.
const LOADER: &str = "./__wasm_split.______________________.js";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, pkg_dir, main_out, output_name] = args.as_slice() else {
        eprintln!("usage: spillway-wasm-split INPUT.wasm PKG_DIR MAIN_OUT.wasm OUTPUT_NAME");
        return ExitCode::from(2);
    };
    match split(
        Path::new(input),
        Path::new(pkg_dir),
        Path::new(main_out),
        output_name,
    ) {
        Ok(modules) => {
            println!("wasm-split: {modules} modules split off");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("wasm-split: {e}");
            ExitCode::FAILURE
        }
    }
}

fn split(input: &Path, pkg_dir: &Path, main_out: &Path, output_name: &str) -> Result<usize, String> {
    let wasm = std::fs::read(input).map_err(|e| format!("reading {}: {e}", input.display()))?;
    let main_module = format!("./{output_name}.js");
    let mut options = wasm_split_cli_support::Options::new(&wasm);
    options.output_dir = pkg_dir;
    options.main_out_path = main_out;
    options.main_module = &main_module;
    options.link_name = LOADER;
    let split = wasm_split_cli_support::transform(options).map_err(|e| format!("{e:#}"))?;
    let manifest = serde_json::to_string(&split.prefetch_map).map_err(|e| e.to_string())?;
    let manifest_path = pkg_dir.join("__wasm_split_manifest.json");
    std::fs::write(&manifest_path, manifest)
        .map_err(|e| format!("writing {}: {e}", manifest_path.display()))?;
    Ok(split.split_modules.len())
}
