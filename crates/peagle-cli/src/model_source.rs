//! `--model` and `--draft-model` to local directories: an existing directory as is, a preset
//! (`configs/NAME.toml`: target, drafter, K), or a Hugging Face id looked up in the local HF
//! cache. Nothing is downloaded: a model that is not cached is a clear error naming it.

use anyhow::{anyhow, bail, Context, Result};
use hf_hub::Cache;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Where the presets live in a checkout.
pub const PRESETS: &str = "configs";

/// A model to serve, resolved to directories.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSource {
    pub target: PathBuf,
    pub drafter: Option<PathBuf>,
    /// Drafts per step the preset asks for.
    pub k: Option<usize>,
}

/// A preset file: HF ids or directories of a target and its drafter, and the default K.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preset {
    pub target: String,
    pub drafter: Option<String>,
    pub k: Option<usize>,
}

pub fn resolve_model(arg: &str, cache: &Cache) -> Result<ModelSource> {
    if Path::new(arg).is_dir() {
        return Ok(ModelSource {
            target: arg.into(),
            drafter: None,
            k: None,
        });
    }
    if let Some(path) = preset_path(arg) {
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let preset: Preset = toml::from_str(&text).with_context(|| format!("preset {}", path.display()))?;
        return Ok(ModelSource {
            target: resolve_dir(&preset.target, cache)?,
            drafter: preset.drafter.as_deref().map(|d| resolve_dir(d, cache)).transpose()?,
            k: preset.k,
        });
    }
    if is_hf_id(arg) {
        return Ok(ModelSource {
            target: hf_cached(arg, cache)?,
            drafter: None,
            k: None,
        });
    }
    bail!("--model {arg}: not a directory, a preset ({PRESETS}/{arg}.toml) or a Hugging Face id (org/name)")
}

/// A directory, or a Hugging Face id in the local cache.
pub fn resolve_dir(spec: &str, cache: &Cache) -> Result<PathBuf> {
    if Path::new(spec).is_dir() {
        return Ok(spec.into());
    }
    if is_hf_id(spec) {
        return hf_cached(spec, cache);
    }
    bail!("{spec}: no such directory, and not a Hugging Face id (org/name)")
}

/// `org/name`: exactly one slash between two non-empty parts.
fn is_hf_id(s: &str) -> bool {
    let mut parts = s.split('/');
    matches!((parts.next(), parts.next(), parts.next()), (Some(org), Some(name), None) if !org.is_empty() && !name.is_empty() && !org.starts_with('.'))
}

/// The snapshot directory of a cached model repository.
fn hf_cached(id: &str, cache: &Cache) -> Result<PathBuf> {
    let config = cache.model(id.to_string()).get("config.json").ok_or_else(|| {
        anyhow!(
            "{id} is not in the local Hugging Face cache ({}) and peagle-serve does not download models: \
             fetch it first (`huggingface-cli download {id}`) or pass a directory",
            cache.path().display()
        )
    })?;
    Ok(config.parent().map(Path::to_path_buf).unwrap_or_default())
}

/// `configs/NAME.toml`, relative to the working directory or to this checkout.
fn preset_path(name: &str) -> Option<PathBuf> {
    if name.contains('/') || name.contains('\\') {
        return None;
    }
    let file = format!("{name}.toml");
    [
        PathBuf::from(PRESETS).join(&file),
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(PRESETS)
            .join(&file),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache laid out as huggingface_hub writes it, holding one model.
    fn cache_with(id: &str) -> (tempfile::TempDir, Cache) {
        let root = tempfile::tempdir().unwrap();
        let repo = root.path().join(format!("models--{}", id.replace('/', "--")));
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "abc123").unwrap();
        std::fs::create_dir_all(repo.join("snapshots/abc123")).unwrap();
        std::fs::write(repo.join("snapshots/abc123/config.json"), "{}").unwrap();
        let cache = Cache::new(root.path().to_path_buf());
        (root, cache)
    }

    #[test]
    fn finds_cached_models_and_names_missing_ones() {
        let (root, cache) = cache_with("acme/tiny");
        let dir = resolve_model("acme/tiny", &cache).unwrap().target;
        assert_eq!(dir, root.path().join("models--acme--tiny/snapshots/abc123"));
        let err = resolve_model("acme/other", &cache).unwrap_err().to_string();
        assert!(
            err.contains("acme/other") && err.contains("not in the local Hugging Face cache"),
            "{err}"
        );
    }

    #[test]
    fn directories_are_used_as_is() {
        let (root, cache) = cache_with("acme/tiny");
        let dir = root.path().to_str().unwrap();
        assert_eq!(resolve_dir(dir, &cache).unwrap(), root.path());
        let err = resolve_model("no-such-preset", &cache).unwrap_err().to_string();
        assert!(err.contains("configs/no-such-preset.toml"), "{err}");
    }

    #[test]
    fn shipped_presets_parse() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(PRESETS);
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let preset: Preset = toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            assert!(is_hf_id(&preset.target), "{}", path.display());
            seen += 1;
        }
        assert!(seen > 0);
    }

    #[test]
    fn hf_ids_have_one_slash() {
        assert!(is_hf_id("openai/gpt-oss-20b"));
        assert!(!is_hf_id("gpt-oss-20b"));
        assert!(!is_hf_id("./models/x"));
        assert!(!is_hf_id("a/b/c"));
    }
}
