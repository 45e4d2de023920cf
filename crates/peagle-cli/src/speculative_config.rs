//! `--speculative-config JSON`, vLLM's spelling of the drafter flags:
//! `{"method": "eagle3", "model": DIR_OR_ID, "num_speculative_tokens": K, "parallel_drafting": true,
//! "disable_by_batch_size": N}`.

use anyhow::{bail, Context, Result};
use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SpeculativeSpec {
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

impl SpeculativeSpec {
    pub fn parse(json: &str) -> Result<Self> {
        let spec: Self = serde_json::from_str(json).context("--speculative-config")?;
        // "peagle" is accepted as shorthand for eagle3 with parallel drafting.
        if !matches!(spec.method.as_str(), "eagle3" | "peagle") {
            bail!(
                "--speculative-config: method {:?} is not supported (use \"eagle3\", with \"parallel_drafting\": true for P-EAGLE)",
                spec.method
            );
        }
        Ok(spec)
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
        let spec = SpeculativeSpec::parse(
            r#"{"method":"eagle3","model":"amazon/GPT-OSS-20B-P-EAGLE","num_speculative_tokens":7,"parallel_drafting":true,"disable_by_batch_size":4}"#,
        )
        .unwrap();
        assert_eq!(spec.disable_by_batch_size, Some(4));
        assert_eq!(spec.model, "amazon/GPT-OSS-20B-P-EAGLE");
        assert_eq!((spec.num_speculative_tokens, spec.parallel()), (Some(7), true));
        assert!(!SpeculativeSpec::parse(r#"{"method":"eagle3","model":"m"}"#)
            .unwrap()
            .parallel());
    }

    #[test]
    fn rejects_other_methods_and_bad_json() {
        let err = SpeculativeSpec::parse(r#"{"method":"ngram","model":"m"}"#).unwrap_err();
        assert!(err.to_string().contains("ngram"), "{err}");
        assert!(SpeculativeSpec::parse("{").is_err());
        assert!(SpeculativeSpec::parse(r#"{"method":"eagle3"}"#).is_err());
    }
}
