//! Model repositories from the Hugging Face hub, as vLLM fetches them: the local cache first
//! (`HF_HOME`, laid out as huggingface_hub writes it), then a download of the files a model
//! needs, with a progress bar, resuming partial files. `HF_ENDPOINT` names another hub,
//! `HF_TOKEN` (else the cache's `token` file) authenticates, and `HF_HUB_OFFLINE=1` or
//! `--offline` turns downloading off.

use anyhow::{anyhow, bail, Context, Result};
use hf_hub::api::sync::{Api, ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Cache, Repo, RepoType};
use std::path::{Path, PathBuf};

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
}

impl HubSettings {
    /// `HF_HOME`, `HF_ENDPOINT`, `HF_TOKEN` (else the cache's token file) and `HF_HUB_OFFLINE`;
    /// `offline` is the `--offline` flag.
    pub fn from_env(offline: bool) -> Self {
        let cache = Cache::from_env();
        Self {
            endpoint: std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into()),
            token: std::env::var("HF_TOKEN").ok().or_else(|| cache.token()),
            offline: offline || env_flag("HF_HUB_OFFLINE"),
            cache,
        }
    }
}

pub struct Hub {
    cache: Cache,
    /// None when downloads are off.
    api: Option<Api>,
    endpoint: String,
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
        })
    }

    pub fn from_env(offline: bool) -> Result<Self> {
        Self::new(HubSettings::from_env(offline))
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
        let repo = api.repo(Repo::new(id.to_string(), RepoType::Model));
        tracing::info!(model = id, endpoint = %self.endpoint, "asking the hub for the model's files");
        let info = match repo.info() {
            Ok(info) => info,
            Err(e) => {
                if let Some(dir) = self.cached(id) {
                    tracing::warn!(model = id, error = %e, "hub unreachable; using the cached snapshot");
                    return Ok(dir);
                }
                return Err(hub_error(e, id, &self.endpoint));
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
                download(&repo, id, file, &self.endpoint)?;
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
}

fn download(repo: &ApiRepo, id: &str, file: &str, endpoint: &str) -> Result<()> {
    tracing::info!(model = id, file, "downloading");
    eprintln!("downloading {id}/{file}");
    repo.download(file).map_err(|e| hub_error(e, id, endpoint))?;
    Ok(())
}

fn wanted(file: &str) -> bool {
    !file.contains('/') && WANTED_SUFFIXES.iter().any(|s| file.ends_with(s))
}

/// What went wrong talking to the hub, with what to do about the usual causes.
fn hub_error(e: ApiError, id: &str, endpoint: &str) -> anyhow::Error {
    let hint = hint(&e);
    anyhow!("cannot fetch {id} from {endpoint}: {e}{hint}")
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
