//! A model's generation settings: the tokens that end generation and the sampling defaults
//! its authors recommend.

use crate::config::read_json;
use crate::error::LoadError;
use serde::Deserialize;
use std::path::Path;

/// Generation settings from `generation_config.json` (else `config.json`): the token ids that
/// end generation and the sampling defaults the model's authors recommend.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub sampling: SamplingDefaults,
}

/// The sampling fields of a generation config that vLLM applies to requests that leave them
/// unset; `max_new_tokens` also caps what a request may ask for.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct SamplingDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub max_new_tokens: Option<usize>,
}

impl SamplingDefaults {
    /// Each field from `newer` where it has one, else from `self`.
    fn or_from(self, newer: Self) -> Self {
        Self {
            temperature: newer.temperature.or(self.temperature),
            top_p: newer.top_p.or(self.top_p),
            top_k: newer.top_k.or(self.top_k),
            min_p: newer.min_p.or(self.min_p),
            repetition_penalty: newer.repetition_penalty.or(self.repetition_penalty),
            max_new_tokens: newer.max_new_tokens.or(self.max_new_tokens),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

#[derive(Deserialize, Default)]
struct Fields {
    #[serde(default)]
    eos_token_id: Option<OneOrMany>,
    #[serde(default)]
    bos_token_id: Option<u32>,
    #[serde(flatten)]
    sampling: SamplingDefaults,
}

impl GenerationConfig {
    /// The settings of a model directory (or of a directory holding only a
    /// `generation_config.json`); none where neither file is there.
    pub fn load(dir: &Path) -> Result<Self, LoadError> {
        let mut fields = Fields::default();
        for name in ["config.json", "generation_config.json"] {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            let found: Fields = serde_json::from_value(read_json(&path, "generation config")?)
                .map_err(|source| LoadError::Json { path, source })?;
            fields.eos_token_id = found.eos_token_id.or(fields.eos_token_id);
            fields.bos_token_id = found.bos_token_id.or(fields.bos_token_id);
            fields.sampling = fields.sampling.or_from(found.sampling);
        }
        Ok(Self {
            eos_token_ids: match fields.eos_token_id {
                None => Vec::new(),
                Some(OneOrMany::One(id)) => vec![id],
                Some(OneOrMany::Many(ids)) => ids,
            },
            bos_token_id: fields.bos_token_id,
            sampling: fields.sampling,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_config_overrides_config_field_by_field() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, json: &str| std::fs::write(dir.path().join(name), json).unwrap();
        write("config.json", r#"{"eos_token_id": 2, "temperature": 0.9, "top_k": 40}"#);
        write(
            "generation_config.json",
            r#"{"eos_token_id": [2, 7], "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 64, "do_sample": true}"#,
        );
        let config = GenerationConfig::load(dir.path()).unwrap();
        assert_eq!(config.eos_token_ids, vec![2, 7]);
        assert_eq!(
            config.sampling,
            SamplingDefaults {
                temperature: Some(0.6),
                top_p: Some(0.95),
                top_k: Some(40),
                max_new_tokens: Some(64),
                ..SamplingDefaults::default()
            }
        );
        assert_eq!(
            GenerationConfig::load(&dir.path().join("none")).unwrap(),
            GenerationConfig::default()
        );
    }
}
