//! Model repositories from the Hugging Face hub, as vLLM fetches them: the local cache first
//! (`HF_HOME`, laid out as huggingface_hub writes it), then a download of the files a model
//! needs, with a progress bar, resuming partial files. `HF_ENDPOINT` names another hub,
//! `HF_TOKEN` (else the cache's `token` file) authenticates, `HF_HUB_OFFLINE=1` or
//! `--offline` turns downloading off, and `HF_HUB_DOWNLOAD_TIMEOUT` is how many seconds a
//! request may go without receiving anything before it fails (10, as in huggingface_hub).

use crate::stall::{unless_stalled, Beat, Quiet, Stalled};
use anyhow::{anyhow, bail, Context, Result};
use hf_hub::api::sync::{Api, ApiBuilder, ApiError, ApiRepo};
use hf_hub::api::Progress;
use hf_hub::{Cache, Repo, RepoType};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The files of a repository that loading a model reads: its top-level configs, weights and
/// tokenizer. Subdirectories (gpt-oss's `original/` and `metal/` copies) are left out.
const WANTED_SUFFIXES: [&str; 5] = [".json", ".safetensors", ".jinja", ".model", ".txt"];

/// Where models come from: the environment's choices, or a test's.
pub struct HubSettings {
    pub cache: Cache,
    /// The hub's base URL (`HF_ENDPOINT`).
    pub endpoint: String,
    pub token: Option<String>,
    /// Keep to the cache.
    pub offline: bool,
    /// The longest a request may go without receiving anything (`HF_HUB_DOWNLOAD_TIMEOUT`).
    pub stall_limit: Duration,
}

/// huggingface_hub's default `HF_HUB_DOWNLOAD_TIMEOUT`.
pub const DEFAULT_STALL_LIMIT: Duration = Duration::from_secs(10);

impl HubSettings {
    /// `HF_HOME`, `HF_ENDPOINT`, `HF_TOKEN` (else the cache's token file), `HF_HUB_OFFLINE` and
    /// `HF_HUB_DOWNLOAD_TIMEOUT`; `offline` is the `--offline` flag.
    pub fn from_env(offline: bool) -> Result<Self> {
        let cache = Cache::from_env();
        Ok(Self {
            endpoint: std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into()),
            token: std::env::var("HF_TOKEN").ok().or_else(|| cache.token()),
            offline: offline || env_flag("HF_HUB_OFFLINE"),
            stall_limit: match std::env::var("HF_HUB_DOWNLOAD_TIMEOUT") {
                Ok(seconds) => stall_limit(&seconds)?,
                Err(_) => DEFAULT_STALL_LIMIT,
            },
            cache,
        })
    }
}

/// `HF_HUB_DOWNLOAD_TIMEOUT`'s whole seconds, as huggingface_hub takes them: 0 is the default.
fn stall_limit(seconds: &str) -> Result<Duration> {
    match seconds.trim().parse::<u64>() {
        Ok(0) => Ok(DEFAULT_STALL_LIMIT),
        Ok(s) if s <= 86_400 => Ok(Duration::from_secs(s)),
        _ => bail!("HF_HUB_DOWNLOAD_TIMEOUT must be whole seconds, at most 86400, not {seconds:?}"),
    }
}

/// How many stall limits a request may take before anything arrives. A download makes up to
/// three requests before its first byte (the file's size and etag, a redirect, the ranged
/// request) and may wait up to 5 s for another process's lock on the file.
const SETUP_LIMITS: u32 = 3;

pub struct Hub {
    cache: Cache,
    /// None when downloads are off.
    api: Option<Api>,
    endpoint: String,
    stall_limit: Duration,
}

/// Why a call to the hub gave nothing.
enum Failure {
    Api(ApiError),
    /// Nothing received for this long.
    Stalled(Stalled),
}

impl Hub {
    pub fn new(settings: HubSettings) -> Result<Self> {
        let api = match settings.offline {
            true => None,
            false => Some(
                ApiBuilder::from_cache(settings.cache.clone())
                    .with_endpoint(settings.endpoint.clone())
                    .with_token(settings.token)
                    .with_retries(3)
                    .build()
                    .context("setting up the Hugging Face hub client")?,
            ),
        };
        Ok(Self {
            cache: settings.cache,
            api,
            endpoint: settings.endpoint,
            stall_limit: settings.stall_limit,
        })
    }

    pub fn from_env(offline: bool) -> Result<Self> {
        Self::new(HubSettings::from_env(offline)?)
    }

    /// The local snapshot directory of model repository `id` (`org/name`), downloading what
    /// is missing. With the hub unreachable, a cached snapshot is used as it is.
    pub fn snapshot(&self, id: &str) -> Result<PathBuf> {
        let Some(api) = &self.api else {
            return self.cached(id).ok_or_else(|| {
                anyhow!(
                    "{id} is not in the local Hugging Face cache ({}) and downloads are off \
                     (HF_HUB_OFFLINE or --offline): fetch it first or pass a directory",
                    self.cache.path().display()
                )
            });
        };
        tracing::info!(model = id, endpoint = %self.endpoint, "asking the hub for the model's files");
        let info = match self.call(api, id, |repo, _| repo.info())? {
            Ok(info) => info,
            Err(e) => {
                let e = hub_error(e, id, &self.endpoint, "asking for its files");
                if let Some(dir) = self.cached(id) {
                    tracing::warn!(model = id, error = %e, "hub unreachable; using the cached snapshot");
                    return Ok(dir);
                }
                return Err(e);
            }
        };
        let files: Vec<&str> = info
            .siblings
            .iter()
            .map(|s| s.rfilename.as_str())
            .filter(|f| wanted(f))
            .collect();
        if !files.contains(&"config.json") {
            bail!("{id} on {} has no config.json: not a model repository", self.endpoint);
        }
        let dir = self
            .cache
            .path()
            .join(format!("models--{}", id.replace('/', "--")))
            .join("snapshots")
            .join(&info.sha);
        for file in &files {
            if !dir.join(file).exists() {
                self.download(api, id, file)?;
            }
        }
        if let Some(missing) = files.iter().find(|f| !dir.join(f).exists()) {
            bail!(
                "{id} changed on the hub while downloading ({missing} is not in revision {}): run again",
                info.sha
            );
        }
        Ok(dir)
    }

    /// The snapshot `refs/main` points at, if it holds a config.json.
    fn cached(&self, id: &str) -> Option<PathBuf> {
        let config = self.cache.model(id.to_string()).get("config.json")?;
        config.parent().map(Path::to_path_buf)
    }

    fn download(&self, api: &Api, id: &str, file: &str) -> Result<()> {
        tracing::info!(model = id, file, "downloading");
        eprintln!("downloading {id}/{file}");
        let name = file.to_string();
        self.call(api, id, move |repo, beat| {
            repo.download_with_progress(
                &name,
                DownloadBar {
                    bar: None,
                    started: false,
                    beat,
                },
            )
        })?
        .map_err(|e| hub_error(e, id, &self.endpoint, &format!("downloading {file}")))?;
        Ok(())
    }

    /// `request` on model repository `id`, given up on after `stall_limit` with nothing
    /// received (SETUP_LIMITS of them before the first byte). The outer error is the
    /// process's (no thread for the call).
    fn call<T: Send + 'static>(
        &self,
        api: &Api,
        id: &str,
        request: impl FnOnce(ApiRepo, &Beat) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<Result<T, Failure>> {
        let (api, repo) = (api.clone(), Repo::new(id.to_string(), RepoType::Model));
        let limits = Quiet {
            first: SETUP_LIMITS * self.stall_limit,
            then: self.stall_limit,
        };
        Ok(
            match unless_stalled(limits, move |beat| request(api.repo(repo), beat))? {
                Ok(result) => result.map_err(Failure::Api),
                Err(stalled) => Err(Failure::Stalled(stalled)),
            },
        )
    }
}

/// A file's download progress: a bar on stderr, and a beat for each piece received.
struct DownloadBar<'a> {
    /// Made when the download learns the file's size (again on a retry).
    bar: Option<ProgressBar>,
    /// Whether the bar has had its first update: the bytes a resumed download already had.
    started: bool,
    beat: &'a Beat,
}

impl Progress for DownloadBar<'_> {
    fn init(&mut self, size: usize, filename: &str) {
        let style = ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec}, {eta}")
            .expect("a valid progress template")
            .progress_chars("=> ");
        let bar = ProgressBar::new(size as u64)
            .with_style(style)
            .with_message(filename.to_string());
        self.bar = Some(bar);
        self.started = false;
        self.beat.now();
    }

    fn update(&mut self, size: usize) {
        if let Some(bar) = &self.bar {
            if self.started {
                bar.inc(size as u64);
            } else {
                // Bytes already on disk are not a rate: the estimate starts after them.
                bar.set_position(size as u64);
                bar.reset_eta();
                self.started = true;
            }
        }
        self.beat.now();
    }

    fn finish(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

fn wanted(file: &str) -> bool {
    !file.contains('/') && WANTED_SUFFIXES.iter().any(|s| file.ends_with(s))
}

/// What went wrong talking to the hub while `doing` something, with what to do about the
/// usual causes.
fn hub_error(failure: Failure, id: &str, endpoint: &str, doing: &str) -> anyhow::Error {
    match failure {
        Failure::Api(e) => {
            let hint = hint(&e);
            anyhow!("cannot fetch {id} from {endpoint}: {e}{hint}")
        }
        Failure::Stalled(Stalled(limit)) => anyhow!(
            "cannot fetch {id} from {endpoint}: nothing received for {} s while {doing} \
             (HF_HUB_DOWNLOAD_TIMEOUT sets the limit; HF_HUB_OFFLINE=1 uses only the local cache)",
            limit.as_secs_f64()
        ),
    }
}

fn hint(e: &ApiError) -> &'static str {
    match e {
        ApiError::TooManyRetries(last) => hint(last),
        ApiError::RequestError(request) => match request.as_ref() {
            ureq::Error::Status(401 | 403, _) => {
                " (the repository may be gated or private: accept its terms on the hub and set HF_TOKEN)"
            }
            ureq::Error::Status(404, _) => " (no such repository or file)",
            ureq::Error::Transport(_) => " (set HF_HUB_OFFLINE=1 to use only the local cache)",
            _ => "",
        },
        _ => "",
    }
}

/// huggingface_hub's truthy values for a boolean environment variable.
fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stall_limit_is_whole_seconds_as_huggingface_hub_reads_them() {
        assert_eq!(stall_limit(" 30 ").unwrap(), Duration::from_secs(30));
        assert_eq!(stall_limit("0").unwrap(), DEFAULT_STALL_LIMIT);
        for bad in ["2.5", "-1", "ten", "", "86401"] {
            let err = stall_limit(bad).unwrap_err().to_string();
            assert!(err.contains("HF_HUB_DOWNLOAD_TIMEOUT"), "{bad}: {err}");
        }
    }

    #[test]
    fn only_top_level_model_files_are_wanted() {
        for file in [
            "config.json",
            "model-00001-of-00003.safetensors",
            "chat_template.jinja",
            "tokenizer.json",
        ] {
            assert!(wanted(file), "{file}");
        }
        for file in [
            "original/model.safetensors",
            "metal/model.bin",
            "README.md",
            ".gitattributes",
        ] {
            assert!(!wanted(file), "{file}");
        }
    }
}
