//! A CPU profile of the running server, built in with `--features profile` only
//! (`benches/profile.py` uses it): from the start, the process is sampled about 999 times a
//! second on a timer, and at the end the stacks are written to `SPILLWAY_PROFILE_OUT` as a
//! table of the functions that take the time, by their own share (the leaf of a sample), and
//! of Spillway's own functions with what they call (anywhere in it).

use std::collections::HashMap;

/// The sampler, while the server runs.
pub struct Profiler {
    guard: pprof::ProfilerGuard<'static>,
    out: std::path::PathBuf,
}

/// Functions listed in each table.
const TOP: usize = 25;

impl Profiler {
    /// Starts sampling when `SPILLWAY_PROFILE_OUT` names a file.
    pub fn start() -> Option<Self> {
        let out = std::env::var_os("SPILLWAY_PROFILE_OUT")?;
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(999)
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
            .map_err(|e| tracing::warn!(error = %e, "the profiler did not start"))
            .ok()?;
        Some(Self {
            guard,
            out: out.into(),
        })
    }

    /// Writes the table.
    pub fn finish(self) -> std::io::Result<()> {
        let report = self
            .guard
            .report()
            .build()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let mut own: HashMap<String, isize> = HashMap::new();
        let mut inclusive: HashMap<String, isize> = HashMap::new();
        let mut total = 0isize;
        for (frames, count) in &report.data {
            total += count;
            let names: Vec<String> = frames
                .frames
                .iter()
                .flat_map(|f| f.iter().map(|s| short(&s.name())))
                .collect();
            if let Some(leaf) = names.first() {
                *own.entry(leaf.clone()).or_default() += count;
            }
            let mut seen = std::collections::HashSet::new();
            for name in names {
                if seen.insert(name.clone()) {
                    *inclusive.entry(name).or_default() += count;
                }
            }
        }
        let table = |title: &str, counts: HashMap<String, isize>| {
            let mut rows: Vec<(String, isize)> = counts.into_iter().collect();
            rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            let mut out = format!("\n| {title} | share |\n|---|---|\n");
            for (name, count) in rows.into_iter().take(TOP) {
                let share = 100.0 * count as f64 / total.max(1) as f64;
                out.push_str(&format!(
                    "| `{}` | {share:.1} % |\n",
                    name.replace('|', "\\|")
                ));
            }
            out
        };
        // What the product's own code costs, with what it calls (the runtime's frames, under
        // every sample, say nothing).
        inclusive.retain(|name, _| name.contains("spillway::"));
        let text = format!(
            "{total} samples\n{}{}",
            table("function (own time)", own),
            table("Spillway's function (with what it calls)", inclusive)
        );
        std::fs::write(&self.out, text)
    }
}

/// A symbol without its hash and generic arguments, its impl qualifier kept:
/// `<tokio::runtime::task::harness::Harness>::poll`.
fn short(name: &str) -> String {
    let name = name
        .rsplit_once("::h")
        .filter(|(_, h)| h.len() == 16)
        .map_or(name, |(n, _)| n);
    let mut out = String::with_capacity(name.len());
    // Each open bracket: kept (an impl qualifier, `<T as Trait>`) or dropped (generics).
    let mut open: Vec<bool> = Vec::new();
    for c in name.chars() {
        let visible = open.iter().all(|kept| *kept);
        match c {
            '<' => {
                let kept = visible && (out.is_empty() || out.ends_with("::") || out.ends_with(' '));
                open.push(kept);
                if kept {
                    out.push(c);
                }
            }
            '>' if open.pop() == Some(true) => out.push(c),
            '>' => {}
            _ if visible => out.push(c),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_lose_hashes_and_generics_and_keep_their_impl() {
        assert_eq!(
            super::short("<tokio::runtime::task::harness::Harness<T,S>>::poll::h0123456789abcdef"),
            "<tokio::runtime::task::harness::Harness>::poll"
        );
        assert_eq!(
            super::short("<alloc::vec::Vec<u8> as core::clone::Clone>::clone"),
            "<alloc::vec::Vec as core::clone::Clone>::clone"
        );
        assert_eq!(
            super::short("spillway::store::check::run"),
            "spillway::store::check::run"
        );
    }
}
