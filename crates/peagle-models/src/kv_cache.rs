//! The paged KV cache: per layer, the keys and the values of `num_blocks * block_size` slots in
//! one tensor, in f32, bf16 or FP8 (e4m3). Which blocks belong to which sequence is the engine's business (its
//! block manager); the cache only stores rows.

use crate::config::ModelDims;
use crate::config::TextConfig;
use candle_core::{bail, DType, Device, Result, Tensor};
use std::fmt;
use std::str::FromStr;

/// What the cache stores, as `--kv-cache-dtype` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvCacheDtype {
    /// The model's own dtype, as vLLM's `auto`: bf16 for a checkpoint stored in bf16, f32 for
    /// any other. Compute stays f32 either way; the cache only stores rounded keys and values.
    #[default]
    Auto,
    F32,
    /// Half the bytes of f32, so twice the tokens in the same memory and half the reading per
    /// attention step; keys and values keep 8 bits of mantissa.
    Bf16,
    /// FP8 e4m3, as vLLM's `fp8`: half the bytes of bf16, with 4 bits of mantissa. Each
    /// layer's keys and values are stored divided by the checkpoint's `k_scale` and `v_scale`
    /// (1 where it has none), and saturate at ±448 times that scale.
    Fp8,
}

impl KvCacheDtype {
    pub fn resolve(self, target: &TextConfig) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::Bf16 => DType::BF16,
            Self::Fp8 => DType::F8E4M3,
            Self::Auto if target.stored_dtype() == Some("bfloat16") => DType::BF16,
            Self::Auto => DType::F32,
        }
    }
}

impl FromStr for KvCacheDtype {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "f32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "fp8" | "fp8_e4m3" => Ok(Self::Fp8),
            _ => Err(format!(
                "unknown KV cache dtype {s:?} (expected auto, f32, bf16 or fp8)"
            )),
        }
    }
}

impl fmt::Display for KvCacheDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Fp8 => "fp8",
        })
    }
}

pub struct LayerKv {
    /// [2, num_blocks * block_size, kv_heads * head_dim]: the keys, then the values, in one
    /// tensor, which `write_kv` writes in one op.
    pub both: Tensor,
    /// `both`'s keys, [num_blocks * block_size, kv_heads * head_dim] (a view).
    pub k: Tensor,
    /// `both`'s values (a view).
    pub v: Tensor,
}

pub struct KvCache {
    layers: Vec<LayerKv>,
    block_size: usize,
    num_blocks: usize,
}

impl KvCache {
    /// `dtype` is f32, bf16 or f8e4m3.
    pub fn new(dims: &ModelDims, num_blocks: usize, block_size: usize, dtype: DType, device: &Device) -> Result<Self> {
        if !matches!(dtype, DType::F32 | DType::BF16 | DType::F8E4M3) {
            bail!("a KV cache holds f32, bf16 or f8e4m3, not {dtype:?}");
        }
        let width = dims.num_kv_heads * dims.head_dim;
        let layers = (0..dims.num_layers)
            .map(|_| {
                let both = Tensor::zeros((2, num_blocks * block_size, width), dtype, device)?;
                Ok(LayerKv {
                    k: both.get(0)?,
                    v: both.get(1)?,
                    both,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            layers,
            block_size,
            num_blocks,
        })
    }

    /// Bytes one block takes across all layers, for sizing the cache from a memory budget.
    pub fn bytes_per_block(dims: &ModelDims, block_size: usize, dtype: DType) -> usize {
        2 * dims.num_layers * block_size * dims.num_kv_heads * dims.head_dim * dtype.size_in_bytes()
    }

    pub fn layer(&self, i: usize) -> &LayerKv {
        &self.layers[i]
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(dtype: serde_json::Value) -> TextConfig {
        let mut json = serde_json::json!({
            "vocab_size": 32, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "rms_norm_eps": 1e-5,
        });
        json.as_object_mut().unwrap().extend(dtype.as_object().unwrap().clone());
        TextConfig::from_value(json, Path::new("config.json")).unwrap()
    }

    #[test]
    fn auto_follows_the_checkpoints_dtype_in_either_spelling() {
        let auto = |dtype| KvCacheDtype::Auto.resolve(&config(dtype));
        assert_eq!(auto(serde_json::json!({"dtype": "bfloat16"})), DType::BF16);
        assert_eq!(auto(serde_json::json!({"torch_dtype": "bfloat16"})), DType::BF16);
        assert_eq!(
            auto(serde_json::json!({"dtype": "bfloat16", "torch_dtype": "bfloat16"})),
            DType::BF16
        );
        assert_eq!(auto(serde_json::json!({"torch_dtype": "float32"})), DType::F32);
        assert_eq!(auto(serde_json::json!({"torch_dtype": "float16"})), DType::F32);
        assert_eq!(auto(serde_json::json!({})), DType::F32);
        let f32_model = config(serde_json::json!({"dtype": "float32"}));
        assert_eq!(KvCacheDtype::Bf16.resolve(&f32_model), DType::BF16);
        let bf16_model = config(serde_json::json!({"dtype": "bfloat16"}));
        assert_eq!(KvCacheDtype::F32.resolve(&bf16_model), DType::F32);
    }

    #[test]
    fn the_flag_parses_its_four_values_and_names_them_on_a_typo() {
        for dtype in [
            KvCacheDtype::Auto,
            KvCacheDtype::F32,
            KvCacheDtype::Bf16,
            KvCacheDtype::Fp8,
        ] {
            assert_eq!(dtype.to_string().parse::<KvCacheDtype>(), Ok(dtype));
        }
        assert_eq!("fp8_e4m3".parse::<KvCacheDtype>(), Ok(KvCacheDtype::Fp8));
        let err = "fp8_e5m2".parse::<KvCacheDtype>().unwrap_err();
        assert!(err.contains("auto, f32, bf16 or fp8"), "{err}");
    }

    #[test]
    fn narrow_caches_take_fewer_bytes_and_f16_is_refused() {
        let dims = ModelDims {
            vocab_size: 32,
            hidden_size: 8,
            num_layers: 2,
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 4,
        };
        let cache = KvCache::new(&dims, 3, 16, DType::BF16, &Device::Cpu).unwrap();
        assert_eq!(cache.layer(1).k.dtype(), DType::BF16);
        assert_eq!(
            KvCache::bytes_per_block(&dims, 16, DType::F32),
            2 * KvCache::bytes_per_block(&dims, 16, DType::BF16)
        );
        assert_eq!(
            KvCache::bytes_per_block(&dims, 16, DType::BF16),
            2 * KvCache::bytes_per_block(&dims, 16, DType::F8E4M3)
        );
        let fp8 = KvCache::new(
            &dims,
            3,
            16,
            KvCacheDtype::Fp8.resolve(&config(serde_json::json!({}))),
            &Device::Cpu,
        );
        assert_eq!(fp8.unwrap().layer(0).v.dtype(), DType::F8E4M3);
        let err = KvCache::new(&dims, 3, 16, DType::F16, &Device::Cpu).err().unwrap();
        assert!(err.to_string().contains("f32, bf16 or f8e4m3"), "{err}");
    }
}
