//! The browser bundle's tool (scripts/site.mjs runs it).
//!
//! `spillway-bundle split INPUT.wasm PKG_DIR MAIN_OUT.wasm OUTPUT_NAME` splits the bundle at
//! its lazy routes (Leptos's `#[lazy_route]`), as cargo-leptos's `--split` does:
//! - the route and chunk modules and their loader go to PKG_DIR; the loader is named
//!   `__wasm_split.______________________.js`, a placeholder as long as the hash that replaces
//!   it (the main module imports it by that name, and the name is patched in place);
//! - the main module goes to MAIN_OUT.wasm; the loader imports `./OUTPUT_NAME.js`, the
//!   module wasm-bindgen writes;
//! - the manifest Leptos reads to prefetch a route's modules goes to
//!   PKG_DIR/__wasm_split_manifest.json.
//!
//! `spillway-bundle bindgen MAIN.wasm PKG_DIR OUTPUT_NAME` writes the main module's JS
//! bindings and its wasm (`OUTPUT_NAME.js`, `OUTPUT_NAME_bg.wasm`) as `wasm-bindgen
//! --target=web --keep-lld-exports --no-demangle --no-typescript` does.
//!
//! The wasm-bindgen crate the bundle is compiled with and wasm-bindgen-cli-support here must
//! be the same version (scripts/deps.sh compares the two lock files).

use std::path::Path;
use std::process::ExitCode;

/// The loader's name in the main module; scripts/site.mjs replaces the underscores with the
/// loader's hash, which is as long.
const LOADER: &str = "./__wasm_split.______________________.js";

const USAGE: &str = "usage: spillway-bundle split INPUT.wasm PKG_DIR MAIN_OUT.wasm OUTPUT_NAME
       spillway-bundle bindgen MAIN.wasm PKG_DIR OUTPUT_NAME";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let done = match args.as_slice() {
        ["split", input, pkg_dir, main_out, output_name] => split(
            Path::new(input),
            Path::new(pkg_dir),
            Path::new(main_out),
            output_name,
        )
        .map(|modules| println!("split: {modules} modules split off")),
        ["bindgen", input, pkg_dir, output_name] => {
            bindgen(Path::new(input), Path::new(pkg_dir), output_name)
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spillway-bundle: {e}");
            ExitCode::FAILURE
        }
    }
}

fn split(
    input: &Path,
    pkg_dir: &Path,
    main_out: &Path,
    output_name: &str,
) -> Result<usize, String> {
    let wasm = std::fs::read(input).map_err(|e| format!("reading {}: {e}", input.display()))?;
    let main_module = format!("./{output_name}.js");
    let mut options = wasm_split_cli_support::Options::new(&wasm);
    options.output_dir = pkg_dir;
    options.main_out_path = main_out;
    options.main_module = &main_module;
    options.link_name = LOADER;
    let split = wasm_split_cli_support::transform(options).map_err(|e| format!("{e:#}"))?;
    stable_loader(&pkg_dir.join(LOADER))?;
    // In a stable order: the same build writes the same manifest (its name is its hash).
    let prefetch: std::collections::BTreeMap<_, _> = split.prefetch_map.into_iter().collect();
    let manifest = serde_json::to_string(&prefetch).map_err(|e| e.to_string())?;
    let manifest_path = pkg_dir.join("__wasm_split_manifest.json");
    std::fs::write(&manifest_path, manifest)
        .map_err(|e| format!("writing {}: {e}", manifest_path.display()))?;
    Ok(split.split_modules.len())
}

fn bindgen(input: &Path, pkg_dir: &Path, output_name: &str) -> Result<(), String> {
    let mut bindgen = wasm_bindgen_cli_support::Bindgen::new();
    bindgen.web(true).map_err(|e| format!("{e:#}"))?;
    bindgen
        .input_path(input)
        // Names as the linker wrote them: the splitter's exports keep theirs.
        .demangle(false)
        .keep_lld_exports(true)
        .typescript(false)
        // As the command line does (Leptos passes the path anyway).
        .omit_default_module_path(false)
        .out_name(output_name);
    bindgen
        .generate(pkg_dir)
        .map_err(|e| format!("wasm-bindgen: {e:#}"))
}

/// The loader names the main module's shared exports in the order of a hash set, which
/// changes from run to run; sorted, the same build writes the same loader (its name is its
/// hash, and the main module's with it).
fn stable_loader(path: &Path) -> Result<(), String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let shared = line.contains("} = initSync(") || line.contains("Object.assign(sharedImports");
        match (shared, line.rfind('{'), line.find('}')) {
            (true, Some(open), Some(close)) if open < close => {
                let mut names: Vec<&str> = line[open + 1..close]
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .collect();
                names.sort_unstable();
                out.push_str(&line[..=open]);
                out.push(' ');
                for name in names {
                    out.push_str(name);
                    out.push_str(", ");
                }
                out.push_str(&line[close..]);
            }
            _ => out.push_str(line),
        }
    }
    std::fs::write(path, out).map_err(|e| format!("writing {}: {e}", path.display()))
}
