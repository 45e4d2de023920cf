//! `--speculative-config JSON`, vLLM's spelling of the drafter flags:
//! `{"method": "eagle3", "model": DIR_OR_ID, "num_speculative_tokens": K, "parallel_drafting": true,
//! "disable_by_batch_size": N}`.

use anyhow::{bail, Context, Result};
use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SpeculativeConfig {
    pub method: String,
    pub model: String,
    #[serde(default)]
    pub num_speculative_tokens: Option<usize>,
    #[serde(default)]
    pub parallel_drafting: bool,
    /// Suspend speculation while more sequences than this decode at once.
    #[serde(default)]
    pub disable_by_batch_size: Option<usize>,
}

impl SpeculativeConfig {
    pub fn parse(json: &str) -> Result<Self> {
        let speculative: Self = serde_json::from_str(json).context("--speculative-config")?;
        // "peagle" is accepted as shorthand for eagle3 with parallel drafting.
        if !matches!(speculative.method.as_str(), "eagle3" | "peagle") {
            bail!(
                "--speculative-config: method {:?} is not supported (use \"eagle3\", with \"parallel_drafting\": true for P-EAGLE)",
                speculative.method
            );
        }
        Ok(speculative)
    }

    pub fn parallel(&self) -> bool {
        self.parallel_drafting || self.method == "peagle"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllm_spelling() {
        let speculative = SpeculativeConfig::parse(
            r#"{"method":"eagle3","model":"amazon/GPT-OSS-20B-P-EAGLE","num_speculative_tokens":7,"parallel_drafting":true,"disable_by_batch_size":4}"#,
        )
        .unwrap();
        assert_eq!(speculative.disable_by_batch_size, Some(4));
        assert_eq!(speculative.model, "amazon/GPT-OSS-20B-P-EAGLE");
        assert_eq!(
            (speculative.num_speculative_tokens, speculative.parallel()),
            (Some(7), true)
        );
        assert!(!SpeculativeConfig::parse(r#"{"method":"eagle3","model":"m"}"#)
            .unwrap()
            .parallel());
    }

    #[test]
    fn rejects_other_methods_and_bad_json() {
        let err = SpeculativeConfig::parse(r#"{"method":"ngram","model":"m"}"#).unwrap_err();
        assert!(err.to_string().contains("ngram"), "{err}");
        assert!(SpeculativeConfig::parse("{").is_err());
        assert!(SpeculativeConfig::parse(r#"{"method":"eagle3"}"#).is_err());
    }
}
