//! Build step: the protocol descriptors the gRPC server's reflection serves (so `grpcurl`
//! works without .proto files). envoy-types ships the official Envoy API compiled, with
//! every file's descriptor in `src/generated/types.bin`; this keeps the files
//! `ShouldRateLimit` needs (rls.proto and what it imports, transitively) and writes them to
//! `$OUT_DIR/ratelimit_descriptors.bin`. When envoy-types' sources cannot be found (a
//! vendored build), an empty set is written and reflection offers the health service only.

use std::{
    collections::{BTreeSet, HashMap},
    path::PathBuf,
};

use prost::Message;
use prost_types::FileDescriptorSet;

const ROOT: &str = "envoy/service/ratelimit/v3/rls.proto";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=Cargo.lock");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("ratelimit_descriptors.bin");
    let kept = match descriptors() {
        Some(bytes) => bytes,
        None => {
            println!(
                "cargo:warning=envoy-types' descriptors not found: gRPC reflection will list health only"
            );
            Vec::new()
        }
    };
    std::fs::write(out, kept).unwrap();
}

/// envoy-types' version, from the lock file.
fn envoy_types_version() -> Option<String> {
    let lock = std::fs::read_to_string("Cargo.lock").ok()?;
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line == "name = \"envoy-types\"" {
            return lines
                .next()?
                .strip_prefix("version = \"")?
                .strip_suffix('"')
                .map(str::to_owned);
        }
    }
    None
}

fn descriptors() -> Option<Vec<u8>> {
    let version = envoy_types_version()?;
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    let registry = cargo_home.join("registry/src");
    let file = std::fs::read_dir(&registry)
        .ok()?
        .flatten()
        .map(|index| {
            index
                .path()
                .join(format!("envoy-types-{version}/src/generated/types.bin"))
        })
        .find(|p| p.exists())?;
    println!("cargo:rerun-if-changed={}", file.display());
    let all = FileDescriptorSet::decode(std::fs::read(file).ok()?.as_slice()).ok()?;
    let by_name: HashMap<&str, usize> = all
        .file
        .iter()
        .enumerate()
        .filter_map(|(i, f)| Some((f.name.as_deref()?, i)))
        .collect();
    // The closure of ROOT's imports.
    let mut keep = BTreeSet::new();
    let mut todo = vec![ROOT.to_owned()];
    while let Some(name) = todo.pop() {
        let Some(&i) = by_name.get(name.as_str()) else {
            continue;
        };
        if keep.insert(i) {
            todo.extend(all.file[i].dependency.iter().cloned());
        }
    }
    if keep.is_empty() {
        return None;
    }
    let set = FileDescriptorSet {
        file: keep.into_iter().map(|i| all.file[i].clone()).collect(),
    };
    Some(set.encode_to_vec())
}
