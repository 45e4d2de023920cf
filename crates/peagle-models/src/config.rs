//! The fields of a Hugging Face `config.json` that the supported decoder architectures read.

use crate::error::LoadError;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Reads a JSON file; a missing file is reported as the `what` it should have been.
pub fn read_json(path: &Path, what: &'static str) -> Result<serde_json::Value, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => LoadError::MissingFile {
            what,
            path: path.to_owned(),
        },
        _ => LoadError::Io {
            path: path.to_owned(),
            source,
        },
    })?;
    serde_json::from_str(&text).map_err(|source| LoadError::Json {
        path: path.to_owned(),
        source,
    })
}

/// The sizes other components need to know (cache layout, drafter input width).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelDims {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl ModelDims {
    pub fn of(cfg: &TextConfig) -> Self {
        Self {
            vocab_size: cfg.vocab_size,
            hidden_size: cfg.hidden_size,
            num_layers: cfg.num_hidden_layers,
            num_heads: cfg.num_attention_heads,
            num_kv_heads: cfg.num_kv_heads(),
            head_dim: cfg.head_dim(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct TextConfig {
    #[serde(default)]
    pub architectures: Vec<String>,
    #[serde(default)]
    pub model_type: Option<String>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    pub rms_norm_eps: f64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    // transformers 5 writes `dtype`, transformers 4 `torch_dtype`; some files carry both.
    #[serde(default)]
    dtype: Option<String>,
    #[serde(default)]
    torch_dtype: Option<String>,
    // transformers 4 writes `rope_theta` and `rope_scaling`; transformers 5 folds both into
    // `rope_parameters`. Checkpoints of both eras are in the wild.
    #[serde(default)]
    rope_theta: Option<f64>,
    #[serde(default)]
    rope_scaling: Option<RopeParameters>,
    #[serde(default)]
    rope_parameters: Option<RopeParameters>,
    #[serde(default)]
    quantization_config: Option<QuantizationConfig>,
    #[serde(skip)]
    pub path: PathBuf,
}

/// The part of `quantization_config` the dense loaders read: block-scaled FP8 (`fp8`, with
/// `weight_block_size`). gpt-oss reads its own (`mxfp4`).
#[derive(Debug, Clone, Deserialize)]
struct QuantizationConfig {
    quant_method: String,
    #[serde(default)]
    weight_block_size: Option<Vec<usize>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct RopeParameters {
    #[serde(default, alias = "type")]
    rope_type: Option<String>,
    #[serde(default)]
    rope_theta: Option<f64>,
    #[serde(default)]
    factor: Option<f64>,
    #[serde(default)]
    low_freq_factor: Option<f64>,
    #[serde(default)]
    high_freq_factor: Option<f64>,
    #[serde(default)]
    original_max_position_embeddings: Option<usize>,
    #[serde(default)]
    beta_fast: Option<f64>,
    #[serde(default)]
    beta_slow: Option<f64>,
    #[serde(default)]
    truncate: Option<bool>,
    #[serde(default)]
    attention_factor: Option<f64>,
    #[serde(default)]
    mscale: Option<f64>,
    #[serde(default)]
    mscale_all_dim: Option<f64>,
}

/// Rotary embedding settings, resolved from either config spelling.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    pub theta: f64,
    pub scaling: RopeScaling,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
    /// YaRN: frequencies blended between interpolated (slowed by `factor`) and kept by a ramp
    /// over the dimensions whose rotations within the original length fall between
    /// `beta_slow` and `beta_fast`; cos and sin are scaled by `attention_factor`.
    Yarn {
        factor: f64,
        original_max_position_embeddings: usize,
        beta_fast: f64,
        beta_slow: f64,
        /// Round the ramp's ends to whole dimensions.
        truncate: bool,
        attention_factor: f64,
    },
}

impl RopeScaling {
    /// What cos and sin are multiplied by: YaRN's attention factor, else 1.
    pub fn attention_factor(&self) -> f64 {
        match self {
            Self::Yarn { attention_factor, .. } => *attention_factor,
            _ => 1.0,
        }
    }
}

/// YaRN's attention-scale growth: 0.1 * mscale * ln(factor) + 1 for a factor above 1.
fn yarn_mscale(factor: f64, mscale: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
    }
}

impl TextConfig {
    pub fn from_file(path: &Path) -> Result<Self, LoadError> {
        Self::from_value(read_json(path, "model config")?, path)
    }

    /// The (rows, columns) of a block-scaled FP8 checkpoint's scale blocks; None for a
    /// checkpoint that is not FP8.
    pub fn fp8_weight_blocks(&self) -> Result<Option<(usize, usize)>, LoadError> {
        let Some(q) = self.quantization_config.as_ref().filter(|q| q.quant_method == "fp8") else {
            return Ok(None);
        };
        match q.weight_block_size.as_deref() {
            Some(&[rows, cols]) if rows > 0 && cols > 0 && cols % 8 == 0 => Ok(Some((rows, cols))),
            Some(other) => Err(self.invalid(format!(
                "quantization_config.weight_block_size {other:?}: FP8 blocks must be [rows, columns], the columns a multiple of 8"
            ))),
            None => Err(self.invalid(
                "an FP8 checkpoint without quantization_config.weight_block_size (per-tensor scales) is not supported: use a block-scaled one".into(),
            )),
        }
    }

    /// The dtype the checkpoint says its weights are stored in ("bfloat16", "float32", ...).
    pub fn stored_dtype(&self) -> Option<&str> {
        self.dtype.as_deref().or(self.torch_dtype.as_deref())
    }

    /// Parses a config already read as JSON; `path` is named in errors.
    pub fn from_value(value: serde_json::Value, path: &Path) -> Result<Self, LoadError> {
        let mut cfg: TextConfig = serde_json::from_value(value).map_err(|source| LoadError::Json {
            path: path.to_owned(),
            source,
        })?;
        cfg.path = path.to_owned();
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn head_dim(&self) -> usize {
        // 0 without heads, for `validate` to refuse rather than divide by.
        let derived = || self.hidden_size.checked_div(self.num_attention_heads).unwrap_or(0);
        self.head_dim.unwrap_or_else(derived)
    }

    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn rope(&self) -> Result<RopeConfig, LoadError> {
        let params = self
            .rope_parameters
            .clone()
            .or_else(|| self.rope_scaling.clone())
            .unwrap_or_default();
        let theta = params.rope_theta.or(self.rope_theta).unwrap_or(10_000.0);
        let kind = params.rope_type.as_deref().unwrap_or("default");
        let need =
            |v: Option<f64>, name: &str| v.ok_or_else(|| self.invalid(format!("rope type {kind:?} needs {name}")));
        let scaling = match kind {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: need(params.factor, "factor")?,
            },
            "llama3" => RopeScaling::Llama3 {
                factor: need(params.factor, "factor")?,
                low_freq_factor: need(params.low_freq_factor, "low_freq_factor")?,
                high_freq_factor: need(params.high_freq_factor, "high_freq_factor")?,
                original_max_position_embeddings: params
                    .original_max_position_embeddings
                    .or(self.max_position_embeddings)
                    .ok_or_else(|| self.invalid("llama3 rope needs original_max_position_embeddings".into()))?,
            },
            "yarn" => {
                let original = params.original_max_position_embeddings;
                // Without a factor, the context was stretched from the original length to the
                // configured one.
                let stretched = original
                    .zip(self.max_position_embeddings)
                    .map(|(o, m)| m as f64 / o as f64);
                let factor = need(params.factor.or(stretched), "factor")?;
                let attention_factor = match (params.attention_factor, params.mscale, params.mscale_all_dim) {
                    (Some(a), _, _) => a,
                    (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                        yarn_mscale(factor, m) / yarn_mscale(factor, all)
                    }
                    _ => yarn_mscale(factor, 1.0),
                };
                RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: original
                        .or(self.max_position_embeddings)
                        .ok_or_else(|| self.invalid("yarn rope needs original_max_position_embeddings".into()))?,
                    beta_fast: params.beta_fast.unwrap_or(32.0),
                    beta_slow: params.beta_slow.unwrap_or(1.0),
                    truncate: params.truncate.unwrap_or(true),
                    attention_factor,
                }
            }
            other => return Err(self.invalid(format!("unsupported rope type {other:?}"))),
        };
        Ok(RopeConfig { theta, scaling })
    }

    pub fn invalid(&self, msg: String) -> LoadError {
        LoadError::InvalidConfig {
            path: self.path.clone(),
            msg,
        }
    }

    fn validate(&self) -> Result<(), LoadError> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_kv_heads()),
            ("head_dim", self.head_dim()),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(self.invalid(format!("{name} must be positive")));
        }
        if !self.num_attention_heads.is_multiple_of(self.num_kv_heads()) {
            return Err(self.invalid(format!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                self.num_attention_heads,
                self.num_kv_heads()
            )));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(self.invalid(format!(
                "head_dim {} must be even for rotary embeddings",
                self.head_dim()
            )));
        }
        self.rope().map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::RotaryEmbedding;

    /// gpt-oss-20b's rope settings in both config spellings.
    fn gpt_oss(rope: serde_json::Value) -> Result<TextConfig, LoadError> {
        let mut json = serde_json::json!({
            "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 24,
            "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 131072,
        });
        json.as_object_mut().unwrap().extend(rope.as_object().unwrap().clone());
        TextConfig::from_value(json, Path::new("config.json"))
    }

    /// A zero a dimension is derived from is refused by name, not divided by.
    #[test]
    fn zero_heads_are_refused_by_name() {
        let mut config = gpt_oss(serde_json::json!({})).unwrap();
        config.num_attention_heads = 0;
        config.head_dim = None;
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("num_attention_heads must be positive"), "{err}");
    }

    #[test]
    fn yarn_reads_either_spelling_and_matches_transformers() {
        let yarn = serde_json::json!({"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": false, "original_max_position_embeddings": 4096});
        let old = gpt_oss(serde_json::json!({"rope_theta": 150000.0, "rope_scaling": yarn})).unwrap();
        let mut params = yarn.clone();
        params["rope_theta"] = 150000.0.into();
        let new = gpt_oss(serde_json::json!({"rope_parameters": params})).unwrap();
        let rope = old.rope().unwrap();
        assert_eq!(rope, new.rope().unwrap());
        assert_eq!(rope.theta, 150000.0);
        // transformers 5.23's _compute_yarn_parameters for these settings.
        assert!((rope.scaling.attention_factor() - 1.3465735902799727).abs() < 1e-12);
        let want = [
            (0, 1.0),
            (5, 0.155_322_98),
            (10, 0.019_335),
            (15, 0.001_052_602_2),
            (20, 1.818_833_7e-5),
            (31, 3.023_511_4e-7),
        ];
        let inv_freq = RotaryEmbedding::new(64, &rope).inv_freq().to_vec();
        for (i, f) in want {
            assert!(
                (inv_freq[i] - f).abs() <= 1e-6 * f,
                "inv_freq[{i}] {} vs {f}",
                inv_freq[i]
            );
        }
        let err = gpt_oss(serde_json::json!({"rope_scaling": {"rope_type": "yarn"}}))
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs factor"), "{err}");
    }
}
