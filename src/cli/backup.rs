//! `spillway backup` and `spillway restore`: what Spillway keeps without a TTL (policies with
//! their versions, users, API keys, alert rules) as one JSON file, and back (see
//! `domain::backup`).

use std::path::PathBuf;

use anyhow::Context;

use crate::domain::backup::Backup;
use crate::service::Service;

/// A backup or a restore.
#[derive(Debug, PartialEq, Eq)]
pub enum StateCommand {
    Backup { output: Option<PathBuf> },
    Restore { file: PathBuf, replace: bool },
}

/// Runs `command`; what to print.
pub async fn run(service: &Service, command: StateCommand) -> anyhow::Result<String> {
    match command {
        StateCommand::Backup { output } => {
            let backup = service.backup().await?;
            let text = serde_json::to_string_pretty(&backup)? + "\n";
            match output {
                None => Ok(text),
                Some(path) => {
                    write_private(&path, &text)
                        .with_context(|| format!("writing {}", path.display()))?;
                    Ok(format!(
                        "backed up {} to {}\n",
                        backup.summary(),
                        path.display()
                    ))
                }
            }
        }
        StateCommand::Restore { file, replace } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let backup: Backup = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a backup", file.display()))?;
            let summary = service
                .restore(&super::cli_actor(), &backup, replace)
                .await?;
            Ok(format!("restored {summary} from {}\n", file.display()))
        }
    }
}

/// Writes `text` to `path`, readable by its owner only: a backup holds password hashes and
/// key digests.
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())
}
