//! Loading the configuration from a file or a directory, and reloading it when it changes.
//!
//! The loader polls: every interval it reads the files (a directory's `*.yaml` / `*.yml`,
//! following symlinks, so a Kubernetes ConfigMap's symlink swap and an in-place edit both
//! count) and compares their contents with the last ones it saw. A changed set is parsed and
//! validated as a whole; if anything is wrong the new set is refused, the error logged (file,
//! domain, descriptor) and counted, and the last good configuration keeps serving. Requests are
//! never paused: a new configuration replaces the old one atomically, and requests in flight
//! finish with the one they started with.
//!
//! At start a configuration that is there but wrong is fatal ([`Reloader::first`]): the process
//! would otherwise serve with no limits at all. A path that does not exist yet is not (it is
//! loaded when it appears). A reload that would remove every domain (an emptied directory) is
//! refused unless `ALLOW_EMPTY_CONFIG`: dropping every limit is never a silent accident.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{build, parse_file, Config, ConfigError, LoadOptions};
use crate::metrics::Metrics;
use crate::service::Service;

/// The files of a configuration path, sorted by name: the path itself if it is a file, else
/// the directory's `*.yaml` and `*.yml` (not recursive).
pub fn files(path: &Path, ignore_dotfiles: bool) -> Result<Vec<PathBuf>, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(path).map_err(|e| format!("{}: {e}", path.display()))? {
        let entry = entry.map_err(|e| format!("{}: {e}", path.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if ignore_dotfiles && name.starts_with('.') {
            continue;
        }
        let p = entry.path();
        let is_yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if is_yaml && std::fs::metadata(&p).map(|m| m.is_file()).unwrap_or(false) {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// The files' names and contents.
pub fn read(path: &Path, ignore_dotfiles: bool) -> Result<Vec<(String, String)>, String> {
    files(path, ignore_dotfiles)?
        .into_iter()
        .map(|p| {
            std::fs::read_to_string(&p)
                .map(|t| (p.display().to_string(), t))
                .map_err(|e| format!("{}: {e}", p.display()))
        })
        .collect()
}

/// Parses and validates a set of files.
pub fn load(texts: &[(String, String)], opts: LoadOptions, metrics: &Metrics) -> Result<Config, ConfigError> {
    let parsed = texts.iter().map(|(n, t)| parse_file(n, t)).collect::<Result<Vec<_>, _>>()?;
    build(&parsed, opts, metrics)
}

/// Watches the configuration and installs each good change into the service.
pub struct Reloader {
    pub path: PathBuf,
    pub ignore_dotfiles: bool,
    pub opts: LoadOptions,
    pub interval: Duration,
    /// `ALLOW_EMPTY_CONFIG`: a reload may remove every domain.
    pub allow_empty: bool,
}

impl Reloader {
    /// The first load, at start: like [`Reloader::check`], but a configuration that cannot be
    /// read (other than a path not there yet) or is invalid is an error naming the file and the
    /// problem, for the process to exit on.
    pub fn first(&self, service: &Service) -> Result<Option<Vec<(String, String)>>, String> {
        if !self.path.exists() {
            return Ok(self.check(service, &None));
        }
        let texts = read(&self.path, self.ignore_dotfiles)
            .map_err(|e| format!("cannot read the rate limit configuration: {e}"))?;
        let c = load(&texts, self.opts, &service.metrics)
            .map_err(|e| format!("invalid rate limit configuration ({e}); not starting without it"))?;
        self.install(service, Ok(c));
        Ok(Some(texts))
    }

    /// One check: loads when the contents changed since `last`. Returns the contents seen.
    pub fn check(&self, service: &Service, last: &Option<Vec<(String, String)>>) -> Option<Vec<(String, String)>> {
        let texts = match read(&self.path, self.ignore_dotfiles) {
            Ok(t) => t,
            Err(e) => {
                if last.is_none() || last.as_ref().is_some_and(|l| !l.is_empty()) {
                    tracing::error!("cannot read the rate limit configuration: {e}");
                    service.metrics.config_load_error.fetch_add(1, Relaxed);
                }
                return Some(Vec::new());
            }
        };
        if last.as_ref() == Some(&texts) {
            return Some(texts);
        }
        self.install(service, load(&texts, self.opts, &service.metrics));
        Some(texts)
    }

    /// Serves a loaded configuration, or says why not.
    fn install(&self, service: &Service, loaded: Result<Config, ConfigError>) {
        match loaded {
            Ok(c) if c.is_empty() && !self.allow_empty && service.config().is_some_and(|c| !c.is_empty()) => {
                tracing::warn!(
                    "refused the new rate limit configuration: it has no domain, which would remove every \
                     limit (ALLOW_EMPTY_CONFIG=true allows it); the last one keeps serving"
                );
                service.metrics.config_load_error.fetch_add(1, Relaxed);
            }
            Ok(c) => {
                tracing::info!(
                    "loaded rate limit configuration: {} file(s), domains [{}], {} rule(s)",
                    c.files.len(),
                    {
                        let mut d: Vec<&str> = c.domains.keys().map(String::as_str).collect();
                        d.sort();
                        d.join(", ")
                    },
                    c.rules
                );
                tracing::debug!("configuration:\n{}", c.dump());
                service.metrics.config_load_success.fetch_add(1, Relaxed);
                service.set_config(Arc::new(c));
            }
            Err(e) => {
                tracing::error!("refused the new rate limit configuration ({e}); the last good one keeps serving");
                service.metrics.config_load_error.fetch_add(1, Relaxed);
            }
        }
    }

    /// Polls for ever (spawn it).
    pub async fn run(self, service: Arc<Service>, mut last: Option<Vec<(String, String)>>) {
        loop {
            tokio::time::sleep(self.interval).await;
            let s = service.clone();
            let me = Reloader {
                path: self.path.clone(),
                ignore_dotfiles: self.ignore_dotfiles,
                opts: self.opts,
                interval: self.interval,
                allow_empty: self.allow_empty,
            };
            let prev = last.clone();
            // File IO off the async workers.
            last = tokio::task::spawn_blocking(move || me.check(&s, &prev)).await.unwrap_or(None);
        }
    }
}
