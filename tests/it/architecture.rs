//! The arrows between the top-level modules point down only (docs/architecture.md, "Layout"):
//! domain ← config ← store ← service ← state ← auth ← {api, envoy, app, cli, sources} ←
//! server ← main, with the leaves (`net`, `support`, `telemetry`) anyone may use. `state` is what
//! every front door is handed (the service and the doors' settings); `auth` is who is
//! calling, as HTTP sees it (a key in the headers, a session cookie), which every door asks
//! before it acts. This reads every `crate::<module>` path in `src/` and fails on an arrow
//! that points up or sideways between front doors.
//!
//! `cargo test --test it architecture -- --nocapture` prints the graph.

use std::collections::{BTreeMap, BTreeSet};

/// Each top-level module's layer: a module may use modules of a lower layer, and leaves
/// (layer 0) as listed in `may_use`.
fn layer(module: &str) -> Option<u8> {
    Some(match module {
        // Pure: it may use nothing else of the crate.
        "domain" => 0,
        // Leaves anyone above the domain may use: the network's edges, metrics and traces,
        // small helpers (they may name the domain's types, never a layer above it).
        "net" | "support" | "telemetry" => 1,
        "config" => 2,
        "store" => 3,
        "service" => 4,
        "state" => 5,
        "auth" => 6,
        "api" | "envoy" | "app" | "cli" | "sources" => 7,
        "server" => 8,
        _ => return None,
    })
}

/// Whether `from` may name `to`.
fn may_use(from: &str, to: &str) -> bool {
    let (Some(a), Some(b)) = (layer(from), layer(to)) else {
        return true;
    };
    // Leaves may use leaves; the domain nothing.
    a > 0 && (b < a || (a == 1 && b == 1))
}

/// The first segment of every `crate::` path in `text` (`use crate::{a::b, c}` gives a
/// and c).
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut at = 0;
    while let Some(found) = text[at..].find("crate::") {
        let start = at + found + "crate::".len();
        at = start;
        // `$crate::` in macros, `mycrate::` and the like are not this crate's paths.
        if start > "crate::".len() {
            let before = bytes[start - "crate::".len() - 1];
            if before.is_ascii_alphanumeric() || before == b'_' || before == b'$' {
                continue;
            }
        }
        if bytes.get(start) == Some(&b'{') {
            let mut depth = 0;
            let mut item_start = true;
            for (i, &b) in bytes[start..].iter().enumerate() {
                match b {
                    b'{' => {
                        depth += 1;
                        if depth == 1 {
                            item_start = true;
                        }
                    }
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            at = start + i;
                            break;
                        }
                    }
                    b',' if depth == 1 => item_start = true,
                    b if depth == 1 && item_start && (b.is_ascii_alphabetic() || b == b'_') => {
                        let name: String = text[start + i..]
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        out.insert(name);
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = text[start..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.insert(name);
        }
    }
    out
}

fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every arrow between top-level modules: `from -> {to}`.
fn arrows() -> BTreeMap<String, BTreeSet<String>> {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut arrows: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "lib" || name == "main" {
            continue;
        }
        let mut files = Vec::new();
        if path.is_dir() {
            rust_files(&path, &mut files);
        } else {
            files.push(path.clone());
        }
        let to = arrows.entry(name.clone()).or_default();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for used in crate_paths(&text) {
                if used != name && layer(&used).is_some() {
                    to.insert(used);
                }
            }
        }
    }
    arrows
}

#[test]
fn module_arrows_point_down() {
    let arrows = arrows();
    let mut up = BTreeSet::new();
    for (from, tos) in &arrows {
        assert!(
            layer(from).is_some(),
            "src/{from}: a new top-level module; give it a layer in tests/it/architecture.rs"
        );
        for to in tos {
            if !may_use(from, to) {
                up.insert((from.clone(), to.clone()));
            }
        }
    }
    for (from, tos) in &arrows {
        let tos: Vec<&str> = tos.iter().map(String::as_str).collect();
        println!(
            "{from} (layer {}) -> {}",
            layer(from).unwrap_or(0),
            tos.join(", ")
        );
    }
    assert!(
        up.is_empty(),
        "arrows that point up (docs/architecture.md: domain ← store ← service ← state ← auth ← front doors ← server): {up:?}"
    );
}

/// Front doors reach Redis through the service's use cases only (issue 33): none names the
/// store, so every audit write and every cache in front of Redis is the service's.
#[test]
fn no_front_door_names_the_store() {
    let arrows = arrows();
    for door in ["api", "envoy", "app", "auth", "cli", "sources", "server"] {
        assert!(
            !arrows[door].contains("store"),
            "src/{door} names crate::store; call a use case of crate::service instead"
        );
    }
}

#[test]
fn the_path_reader_finds_first_segments() {
    let found = crate_paths(
        "use crate::{a::b, c::{d, e}};\nfn f() { crate::g::h(); $crate::x; mycrate::y; }",
    );
    let found: Vec<&str> = found.iter().map(String::as_str).collect();
    assert_eq!(found, ["a", "c", "g"]);
}

/// Functions stay under 80 lines (`clippy.toml`, `too_many_lines` in `src/lib.rs`); a
/// dashboard page whose body is one `view!` may be exempted, by an `expect` right under
/// its `#[component]`. The number may only shrink.
#[test]
fn only_dashboard_pages_are_exempt_from_the_function_length() {
    const MOST: usize = 7;
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut exempt = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if line.contains("clippy::too_many_lines") && !line.trim_start().starts_with("//") {
                let name = file.strip_prefix(&src).unwrap().display().to_string();
                if line.contains("cfg_attr(not(test), warn(") {
                    continue; // the lint itself, in lib.rs and main.rs
                }
                assert!(
                    i > 0 && lines[i - 1].trim() == "#[component]",
                    "src/{name}:{}: only a #[component] may be exempted from the length",
                    i + 1
                );
                exempt.push(format!("src/{name}:{}", i + 1));
            }
        }
    }
    println!("exempt from the length: {exempt:#?}");
    assert!(
        exempt.len() <= MOST,
        "{} exemptions, at most {MOST}: split the function instead ({exempt:?})",
        exempt.len()
    );
}

/// A source file holds one concern a reader can take in: at most 600 lines, past which it
/// is split by concern (a page's server functions, panels and forms; a store's script,
/// calls and reports; long test tables beside the code they test).
#[test]
fn no_source_file_is_over_600_lines() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(f).unwrap().lines().count();
            (lines > 600).then(|| format!("{}: {lines}", f.strip_prefix(&src).unwrap().display()))
        })
        .collect();
    assert!(long.is_empty(), "split these by concern: {long:?}");
}
