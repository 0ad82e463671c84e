//! The documentation held to the code: the layout map names every source file, the
//! settings reference every setting the code reads (and nothing else), every relative link
//! of README and docs/ resolves, and nothing cites a document outside the repository.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files_under(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(root().join(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// The pages a reader is sent to: README and every page of docs/.
fn pages() -> Vec<String> {
    let mut docs = Vec::new();
    files_under(&root().join("docs"), "md", &mut docs);
    let mut pages = vec!["README.md".to_owned()];
    pages.extend(docs.iter().map(|p| {
        p.strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }));
    pages.sort();
    pages
}

#[test]
fn the_layout_map_names_every_source_file() {
    let map = read("docs/architecture.md");
    let mut sources = Vec::new();
    files_under(&root().join("src"), "rs", &mut sources);
    let missing: Vec<String> = sources
        .iter()
        .map(|p| {
            p.strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|p| !map.contains(&format!("`{p}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md's layout map does not name {missing:?}: add a line for each"
    );
    // And names no file that is gone.
    let named: BTreeSet<&str> = map
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.starts_with("src/") && s.ends_with(".rs"))
        .collect();
    let gone: Vec<&&str> = named.iter().filter(|p| !root().join(p).exists()).collect();
    assert!(
        gone.is_empty(),
        "docs/architecture.md names files that do not exist: {gone:?}"
    );
}

/// The names of settings the code reads: every quoted `SPILLWAY_…`, `REDIS_…`, `OTEL_…` and
/// `LEPTOS_…` in src/.
fn settings_in_code() -> BTreeSet<String> {
    let mut sources = Vec::new();
    files_under(&root().join("src"), "rs", &mut sources);
    let mut names = BTreeSet::new();
    for file in sources {
        let text = std::fs::read_to_string(&file).unwrap();
        for quoted in text.split('"').skip(1).step_by(2) {
            let is_setting = ["SPILLWAY_", "REDIS_", "OTEL_", "LEPTOS_"]
                .iter()
                .any(|p| quoted.starts_with(p))
                && quoted
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
            if is_setting {
                names.insert(quoted.to_owned());
            }
        }
    }
    names
}

/// Every row of the settings reference: ``| `NAME` |``.
fn settings_in_reference() -> BTreeSet<String> {
    read("docs/settings.md")
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once("` |").map(|(name, _)| name.to_owned()))
        .filter(|name| {
            name.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        })
        .collect()
}

#[test]
fn the_settings_reference_has_every_setting_and_no_other() {
    let code = settings_in_code();
    let reference = settings_in_reference();
    assert!(code.len() > 50, "the scan found too few settings: {code:?}");
    let missing: Vec<&String> = code.difference(&reference).collect();
    assert!(
        missing.is_empty(),
        "docs/settings.md has no row for {missing:?}, which src/ reads"
    );
    // A row the code never names is a setting that does nothing. Upstream's variables
    // (HOST, USE_STATSD, …) are named in src/config/upstream.rs; RUST_LOG by tracing.
    let mut sources = Vec::new();
    files_under(&root().join("src"), "rs", &mut sources);
    let all: String = sources
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap())
        .collect();
    let unread: Vec<&String> = reference
        .iter()
        .filter(|name| *name != "RUST_LOG" && !all.contains(&format!("\"{name}\"")))
        .collect();
    assert!(
        unread.is_empty(),
        "docs/settings.md lists {unread:?}, which nothing in src/ reads"
    );
}

/// GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to dashes.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a page's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// Every `](target)` of a page outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_link_of_readme_and_docs_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = read(&page);
        let dir = Path::new(&page).parent().unwrap().to_path_buf();
        for link in links(&text) {
            if link.starts_with("http://")
                || link.starts_with("https://")
                || link.starts_with("mailto:")
            {
                continue;
            }
            checked += 1;
            let (file, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                PathBuf::from(&page)
            } else {
                dir.join(file)
            };
            let path = root().join(&target);
            if !path.exists() {
                broken.push(format!("{page}: {link} (no file)"));
                continue;
            }
            if !fragment.is_empty() {
                let target_text = std::fs::read_to_string(&path).unwrap_or_default();
                if !anchors(&target_text).contains(fragment) {
                    broken.push(format!("{page}: {link} (no such heading)"));
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: is the reader broken?"
    );
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}

#[test]
fn readme_is_a_door() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines: what it grew by belongs in docs/"
    );
    for page in pages().iter().filter(|p| p.starts_with("docs/")) {
        assert!(
            readme.contains(&format!("({page})")),
            "README.md does not link {page}"
        );
    }
}

/// The repository stands on its own: no source, test or page cites the product's contract
/// or style guide outside it.
#[test]
fn nothing_cites_a_document_outside_the_repository() {
    let mut files = Vec::new();
    for dir in ["src", "tests", "docs", "lua", "benches"] {
        for ext in ["rs", "md", "lua", "py"] {
            files_under(&root().join(dir), ext, &mut files);
        }
    }
    files.push(root().join("README.md"));
    let outside = ["../shared", "SPEC.md", "SPEC §", "STYLE.md"];
    let this_file = root().join("tests/it/docs.rs");
    let citing: Vec<String> = files
        .iter()
        .filter(|f| **f != this_file)
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            outside.iter().any(|o| text.contains(o))
        })
        .map(|f| f.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    assert!(
        citing.is_empty(),
        "these cite a document outside the repository: {citing:?}"
    );
}

/// The keys and values of a TOML file's `[package.metadata.leptos]` table, as written.
fn leptos_table(relative: &str) -> Vec<(String, String)> {
    let text = read(relative);
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('[') {
            inside = line.trim() == "[package.metadata.leptos]";
        } else if inside
            && !line.starts_with('#')
            && let Some((key, value)) = line.split_once('=')
        {
            out.push((
                key.trim().to_owned(),
                value.trim().trim_matches('"').to_owned(),
            ));
        }
    }
    out
}

/// The site's settings have one source, Leptos.toml: Cargo.toml's table (read by
/// cargo-leptos) says only how cargo-leptos builds, and what cargo-leptos takes by default
/// for the settings Leptos.toml holds is Leptos.toml's value, so `cargo leptos watch` and
/// the release build serve the same site at the same address.
#[test]
fn the_sites_settings_have_one_source() {
    let site = leptos_table("Leptos.toml");
    let cargo = leptos_table("Cargo.toml");
    assert!(site.len() >= 5, "Leptos.toml's table is not read: {site:?}");
    let restated: Vec<&String> = cargo
        .iter()
        .map(|(k, _)| k)
        .filter(|k| site.iter().any(|(s, _)| s == *k))
        .collect();
    assert!(
        restated.is_empty(),
        "Cargo.toml restates Leptos.toml's {restated:?}: keep the site's settings in Leptos.toml"
    );
    // cargo-leptos's defaults (its config: the package's name, target/site, pkg,
    // 127.0.0.1:3000, 3001).
    let defaults = [
        ("output-name", env!("CARGO_PKG_NAME")),
        ("site-root", "target/site"),
        ("site-pkg-dir", "pkg"),
        ("site-addr", "127.0.0.1:3000"),
        ("reload-port", "3001"),
    ];
    for (key, default) in defaults {
        let value = site.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        assert_eq!(
            value,
            Some(default),
            "Leptos.toml's {key} differs from cargo-leptos's default: `cargo leptos watch` would serve another site"
        );
    }
    // And the release pipeline's scripts restate none of them.
    for script in ["scripts/build.sh", "scripts/site.mjs", "scripts/image.sh"] {
        let text = read(script);
        for (key, value) in &site {
            let variable = format!("LEPTOS_{}=", key.to_uppercase().replace('-', "_"));
            assert!(
                !text.contains(&variable),
                "{script} sets {variable}{value} itself: it comes from Leptos.toml"
            );
        }
    }
}
