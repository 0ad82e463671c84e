//! The clients install in one line each from a clone, as docs/services.md prints them, and
//! pack as they would be published: the npm tarball holds `dist/`, the wheel the package,
//! the crate passes `cargo publish --dry-run`; their versions are the server's.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// A directory of its own under the system's temporary one, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("spillway-pack-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `command`, panicking with its output unless it succeeds; its stdout.
fn run(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{command:?}\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `version = "…"` of a TOML file's first table that has one.
fn toml_version(path: &str) -> String {
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    let line = (text.lines())
        .find(|l| l.starts_with("version = "))
        .unwrap_or_else(|| panic!("{path} has no version"));
    line.trim_start_matches("version = ")
        .trim_matches('"')
        .to_owned()
}

/// A copy of `clients/<name>` as a fresh clone has it: the files git keeps, nothing built.
fn fresh_copy(name: &str, into: &Path) -> PathBuf {
    let listed = run(Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .arg(format!("clients/{name}"))
        .current_dir(root()));
    for file in listed.lines() {
        let to = into.join(file);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(root().join(file), &to).unwrap();
    }
    into.join("clients").join(name)
}

#[test]
fn the_clients_versions_are_the_servers() {
    let server = toml_version("Cargo.toml");
    assert_eq!(toml_version("clients/rust/Cargo.toml"), server);
    assert_eq!(toml_version("clients/python/pyproject.toml"), server);
    let npm: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("clients/typescript/package.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(npm["version"], server.as_str());
}

/// `npm install $SPILLWAY/clients/typescript` into an app compiles the client on install
/// (a clone has no `dist/`), and its entry points load; `npm pack` ships `dist/`.
#[test]
fn the_typescript_client_installs_from_a_clone_and_packs_its_build() {
    let tmp = Scratch::new("typescript");
    let package = fresh_copy("typescript", &tmp.path().join("clone"));
    assert!(!package.join("dist").exists());
    let app = tmp.path().join("app");
    std::fs::create_dir_all(&app).unwrap();
    run(Command::new("npm").args(["init", "-y"]).current_dir(&app));
    run(Command::new("npm")
        .args(["install", "--no-audit", "--no-fund"])
        .arg(&package)
        .current_dir(&app));
    let loaded = run(Command::new("node")
        .args([
            "--input-type=module",
            "-e",
            "const a = await import('spillway-client'); const b = await import('spillway-client/express'); \
             console.log(typeof a.Spillway, typeof b.spillwayExpress)",
        ])
        .current_dir(&app));
    assert_eq!(loaded.trim(), "function function");
    let packed = run(Command::new("npm")
        .args(["pack", "--dry-run", "--json", "--ignore-scripts"])
        .current_dir(&package));
    let packed: serde_json::Value = serde_json::from_str(&packed).unwrap();
    let files: Vec<&str> = (packed[0]["files"].as_array().unwrap().iter())
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    for needed in [
        "dist/index.js",
        "dist/index.d.ts",
        "dist/express.js",
        "README.md",
    ] {
        assert!(files.contains(&needed), "{needed} not packed: {files:?}");
    }
    assert!(
        !files
            .iter()
            .any(|f| f.starts_with("src/") || f.starts_with("tests/"))
    );
}

/// `pip install $SPILLWAY/clients/python` installs a package that imports; the wheel built
/// for PyPI holds it and its `py.typed`.
#[test]
fn the_python_client_installs_from_a_clone_and_builds_a_wheel() {
    let python = root().join(".tools/py/bin/python");
    assert!(
        python.exists(),
        "run `scripts/deps.sh test` (make test does)"
    );
    let tmp = Scratch::new("python");
    let package = fresh_copy("python", &tmp.path().join("clone"));
    let target = tmp.path().join("site");
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--no-deps", "--target"])
        .arg(&target)
        .arg(&package));
    let imported = run(Command::new(&python)
        .args([
            "-c",
            "import spillway; print(spillway.Spillway.__name__, spillway.__file__)",
        ])
        .env("PYTHONPATH", &target)
        .current_dir(tmp.path()));
    assert!(
        imported.starts_with("Spillway ") && imported.contains(target.to_str().unwrap()),
        "{imported}"
    );
    let wheels = tmp.path().join("wheels");
    run(Command::new(&python)
        .args(["-m", "pip", "wheel", "--quiet", "--no-deps", "-w"])
        .arg(&wheels)
        .arg(&package));
    let wheel = std::fs::read_dir(&wheels)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .expect("a wheel");
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(&format!("spillway_client-{}-", toml_version("Cargo.toml"))),
        "{name}"
    );
    let listed = run(Command::new(&python)
        .args(["-m", "zipfile", "-l"])
        .arg(&wheel));
    for needed in [
        "spillway/client.py",
        "spillway/py.typed",
        "spillway/fastapi.py",
    ] {
        assert!(
            listed.contains(needed),
            "{needed} not in the wheel: {listed}"
        );
    }
}

/// The crate packs and builds as crates.io would take it.
#[test]
fn the_rust_client_passes_a_publish_dry_run() {
    let out = Command::new(env!("CARGO"))
        .args([
            "publish",
            "--dry-run",
            "--allow-dirty",
            "--quiet",
            "-p",
            "spillway-client",
        ])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
