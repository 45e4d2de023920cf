//! `--model` and `--draft-model` to local directories: an existing directory as is, a preset
//! (`configs/NAME.toml`, built into the binary: target, drafter, K), or a Hugging Face id,
//! fetched through [`Hub`] (the local cache, else a download).

use crate::hub::Hub;
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The presets `--model NAME` takes: `configs/NAME.toml`, compiled in so that an installed
/// binary (the Docker image's) has them wherever it runs.
pub const PRESETS: [(&str, &str); 3] = [
    ("gpt-oss-20b", include_str!("../../../configs/gpt-oss-20b.toml")),
    ("gpt-oss-120b", include_str!("../../../configs/gpt-oss-120b.toml")),
    (
        "qwen3-coder-30b-a3b",
        include_str!("../../../configs/qwen3-coder-30b-a3b.toml"),
    ),
];

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

impl Preset {
    pub fn named(name: &str) -> Option<Result<Self>> {
        let (_, text) = PRESETS.iter().find(|(n, _)| *n == name)?;
        Some(toml::from_str(text).with_context(|| format!("preset {name}")))
    }
}

/// `--model`'s directories; a preset's drafter (and its K) only `with_preset_drafter`, so that
/// a drafter of the user's own is not fetched for nothing.
pub fn resolve_model(arg: &str, hub: &Hub, with_preset_drafter: bool) -> Result<ModelSource> {
    if Path::new(arg).is_dir() {
        return Ok(ModelSource {
            target: arg.into(),
            drafter: None,
            k: None,
        });
    }
    if let Some(preset) = Preset::named(arg) {
        let preset = preset?;
        let drafter = preset.drafter.as_deref().filter(|_| with_preset_drafter);
        return Ok(ModelSource {
            target: resolve_dir(&preset.target, hub)?,
            drafter: drafter.map(|d| resolve_dir(d, hub)).transpose()?,
            k: preset.k.filter(|_| with_preset_drafter),
        });
    }
    refuse_missing_path(arg)?;
    if is_hf_id(arg) {
        return Ok(ModelSource {
            target: hub.snapshot(arg)?,
            drafter: None,
            k: None,
        });
    }
    let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
    bail!(
        "--model {arg}: not a directory, a preset ({}) or a Hugging Face id (org/name)",
        names.join(", ")
    )
}

/// A directory, or a Hugging Face id fetched through the hub.
pub fn resolve_dir(spec: &str, hub: &Hub) -> Result<PathBuf> {
    if Path::new(spec).is_dir() {
        return Ok(spec.into());
    }
    refuse_missing_path(spec)?;
    if is_hf_id(spec) {
        return hub.snapshot(spec);
    }
    bail!("{spec}: no such directory, and not a Hugging Face id (org/name)")
}

/// Refuses a name whose parent is a local directory (`models/tiny-lama`, mistyped): it names a
/// missing directory, not a Hugging Face id to look up.
fn refuse_missing_path(spec: &str) -> Result<()> {
    let parent = Path::new(spec).parent().filter(|p| !p.as_os_str().is_empty());
    if parent.is_some_and(Path::is_dir) {
        bail!("{spec}: no such directory");
    }
    Ok(())
}

/// `org/name`: exactly one slash between two non-empty parts.
fn is_hf_id(s: &str) -> bool {
    let mut parts = s.split('/');
    matches!((parts.next(), parts.next(), parts.next()), (Some(org), Some(name), None) if !org.is_empty() && !name.is_empty() && !org.starts_with('.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hub::HubSettings;
    use hf_hub::Cache;

    /// An offline hub over a cache laid out as huggingface_hub writes it, holding one model.
    fn hub_with(id: &str) -> (tempfile::TempDir, Hub) {
        let root = tempfile::tempdir().unwrap();
        let repo = root.path().join(format!("models--{}", id.replace('/', "--")));
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "abc123").unwrap();
        std::fs::create_dir_all(repo.join("snapshots/abc123")).unwrap();
        std::fs::write(repo.join("snapshots/abc123/config.json"), "{}").unwrap();
        let hub = Hub::new(HubSettings {
            cache: Cache::new(root.path().to_path_buf()),
            endpoint: String::new(),
            token: None,
            offline: true,
            stall_limit: crate::hub::DEFAULT_STALL_LIMIT,
        })
        .unwrap();
        (root, hub)
    }

    #[test]
    fn finds_cached_models_and_names_missing_ones() {
        let (root, hub) = hub_with("acme/tiny");
        let dir = resolve_model("acme/tiny", &hub, true).unwrap().target;
        assert_eq!(dir, root.path().join("models--acme--tiny/snapshots/abc123"));
        let err = resolve_model("acme/other", &hub, true).unwrap_err().to_string();
        assert!(
            err.contains("acme/other") && err.contains("not in the local Hugging Face cache"),
            "{err}"
        );
    }

    #[test]
    fn directories_are_used_as_is() {
        let (root, hub) = hub_with("acme/tiny");
        let dir = root.path().to_str().unwrap();
        assert_eq!(resolve_dir(dir, &hub).unwrap(), root.path());
        let err = resolve_model("no-such-preset", &hub, true).unwrap_err().to_string();
        assert!(err.contains("a preset (gpt-oss-20b, "), "{err}");
    }

    /// With a drafter of the user's own, a preset's is neither fetched nor its K taken.
    #[test]
    fn a_preset_with_an_own_drafter_resolves_its_target_alone() {
        let (_root, hub) = hub_with("openai/gpt-oss-20b");
        let own = resolve_model("gpt-oss-20b", &hub, false).unwrap();
        assert_eq!((own.drafter, own.k), (None, None));
        let err = resolve_model("gpt-oss-20b", &hub, true).unwrap_err().to_string();
        assert!(err.contains("not in the local Hugging Face cache"), "{err}");
    }

    /// A mistyped local path of a Hugging Face id's shape is not looked up on the hub (tests
    /// run in the crate's directory, which holds src/).
    #[test]
    fn a_missing_directory_under_a_local_one_is_named_as_such() {
        let (_root, hub) = hub_with("acme/tiny");
        let typo = "src/no-such-model";
        assert!(is_hf_id(typo));
        for err in [
            resolve_model(typo, &hub, true).unwrap_err(),
            resolve_dir(typo, &hub).unwrap_err(),
        ] {
            assert_eq!(err.to_string(), format!("{typo}: no such directory"));
        }
    }

    #[test]
    fn every_preset_file_is_built_in_and_parses() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join("configs");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path().file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let mut built_in: Vec<String> = PRESETS.iter().map(|(n, _)| n.to_string()).collect();
        built_in.sort();
        assert_eq!(files, built_in);
        for (name, _) in PRESETS {
            let preset = Preset::named(name).unwrap().unwrap();
            assert!(is_hf_id(&preset.target), "{name}");
        }
    }

    #[test]
    fn hf_ids_have_one_slash() {
        assert!(is_hf_id("openai/gpt-oss-20b"));
        assert!(!is_hf_id("gpt-oss-20b"));
        assert!(!is_hf_id("./models/x"));
        assert!(!is_hf_id("a/b/c"));
    }
}
