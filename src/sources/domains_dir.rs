//! A folder of Envoy domain files kept loaded (`SPILLWAY_DOMAINS_DIR`, or upstream's runtime
//! folder): Istio's guide and plain Kubernetes mount a ConfigMap there.
//!
//! Every second the folder is read again: its `*.yaml` and `*.yml` files (a symlink is
//! followed, so a Kubernetes ConfigMap's `..data` swap is seen; names starting with a dot
//! are skipped). When what they hold changed, they are loaded all or none
//! ([`Service::sync_envoy_files`]): only domains whose stored version differs are written,
//! so every instance reading the same files ends on the same versions. A set that does not
//! load leaves the previous one in force; the error, naming file and field, is logged once
//! and kept for the dashboard ([`Folder::problem`]).

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::{service::Service, service::audit::Actor};

/// How often the folder is read again.
pub const READ_EVERY: Duration = Duration::from_secs(1);

/// The largest domain file read (upstream's largest is a few KiB; a ConfigMap holds 1 MiB
/// in all), and the most the folder's files may hold together.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
pub const MAX_FOLDER_BYTES: u64 = 16 * 1024 * 1024;

/// The folder and what became of its latest contents.
pub struct Folder {
    pub dir: PathBuf,
    state: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    /// The files last read (name, text), sorted.
    files: Option<Vec<(String, String)>>,
    /// Whether they are in force (loaded, or found unchanged).
    loaded: bool,
    /// Why they are not.
    problem: Option<String>,
}

impl Folder {
    pub fn new(dir: PathBuf) -> Arc<Self> {
        Arc::new(Self {
            dir,
            state: Mutex::default(),
        })
    }

    /// Reads the folder every [`READ_EVERY`] and loads what changed, for ever (the server's
    /// shutdown handle runs it, and ends it).
    pub async fn watch(self: Arc<Self>, service: Service) {
        let mut tick = tokio::time::interval(READ_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.once(&service).await;
        }
    }

    /// One reading: loads the files if they changed since the last reading that loaded, or
    /// if the last attempt failed on Redis.
    pub async fn once(&self, service: &Service) {
        let dir = self.dir.clone();
        let files = match tokio::task::spawn_blocking(move || read_dir(&dir)).await {
            Ok(Ok(files)) => files,
            Ok(Err(problem)) => return self.refuse(service, None, problem),
            Err(_) => return,
        };
        {
            let seen = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if seen.files.as_ref() == Some(&files) && (seen.loaded || seen.problem.is_some()) {
                return;
            }
        }
        let actor = Actor {
            name: format!("folder:{}", self.dir.display()),
            role: "admin".into(),
            ip: String::new(),
        };
        let source = format!("folder:{}", self.dir.display());
        match service.sync_envoy_files(&actor, &source, &files).await {
            Ok(written) => {
                if !written.is_empty() {
                    tracing::info!(
                        dir = %self.dir.display(),
                        domains = %written.join(","),
                        "domains loaded from the folder"
                    );
                }
                *self.state.lock().unwrap_or_else(|e| e.into_inner()) = Seen {
                    files: Some(files),
                    loaded: true,
                    problem: None,
                };
                service.report_domains_folder(&self.dir.display().to_string(), None);
            }
            Err(crate::service::policies::ChangeError::Unavailable(error)) => {
                // Tried again on the next reading.
                tracing::warn!(%error, dir = %self.dir.display(), "domains folder: Redis is unavailable");
                let mut seen = self.state.lock().unwrap_or_else(|e| e.into_inner());
                seen.files = Some(files);
                seen.loaded = false;
                // Not a problem of the files: read and tried again next time.
                seen.problem = None;
            }
            Err(error) => self.refuse(service, Some(files), error.to_string()),
        }
    }

    /// The contents `files` do not load: the previous set stays; said once.
    fn refuse(&self, service: &Service, files: Option<Vec<(String, String)>>, problem: String) {
        service.report_domains_folder(&self.dir.display().to_string(), Some(problem.clone()));
        let mut seen = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if seen.problem.as_ref() != Some(&problem) {
            tracing::error!(
                dir = %self.dir.display(),
                "the domains folder does not load, the previous domains stay in force: {problem}"
            );
        }
        seen.problem = Some(problem);
        seen.loaded = false;
        // None (the folder could not be read): whatever is read next is loaded.
        seen.files = files;
    }
}

/// The folder's domain files (name, text), sorted by name.
pub fn read_dir(dir: &Path) -> Result<Vec<(String, String)>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("reading the folder {}: {e}", dir.display()))?;
    let mut files = Vec::new();
    let mut total = 0u64;
    for entry in entries {
        let entry = entry.map_err(|e| format!("reading the folder {}: {e}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !(name.ends_with(".yaml") || name.ends_with(".yml")) {
            continue;
        }
        let path = entry.path();
        // Follows symlinks: a ConfigMap's files are links into its current `..data`.
        if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            continue;
        }
        // Sized before it is read: a huge (or sparse) file is refused, not loaded.
        let size = std::fs::metadata(&path).map_or(0, |m| m.len());
        if size > MAX_FILE_BYTES {
            return Err(format!(
                "{name}: is {size} bytes; a domain file is at most {MAX_FILE_BYTES}"
            ));
        }
        total += size;
        if total > MAX_FOLDER_BYTES {
            return Err(format!(
                "the folder's files hold more than {MAX_FOLDER_BYTES} bytes together"
            ));
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{name}: cannot be read: {e}"))?;
        files.push((name, text));
    }
    files.sort();
    Ok(files)
}
