use crate::config::{RopeConfig, RopeScaling};
use crate::ops;
use candle_core::{Device, Result, Tensor};

/// Rotary position embedding in the rotate-halves layout (HF Llama, Qwen3).
///
/// Frequencies follow transformers' f32 arithmetic so cos/sin match the reference closely; the
/// tables are built per batch for just the positions in it, once for all layers.
pub struct RotaryEmbedding {
    inv_freq: Vec<f32>,
    /// Multiplies cos and sin (YaRN's attention factor; 1 otherwise).
    attention_factor: f32,
}

/// cos and sin for every row of one batch, [rows, head_dim / 2] each: the two halves of one
/// tensor, uploaded at once.
pub struct RopeTables {
    values: Tensor,
    cos: Tensor,
    sin: Tensor,
}

impl RotaryEmbedding {
    pub fn new(head_dim: usize, cfg: &RopeConfig) -> Self {
        let base = cfg.theta as f32;
        let inv_freq = match cfg.scaling {
            RopeScaling::Yarn { .. } => yarn_inv_freq(head_dim, cfg.theta, &cfg.scaling),
            _ => (0..head_dim / 2)
                .map(|i| 1.0 / base.powf((2 * i) as f32 / head_dim as f32))
                .map(|f| scale(f, &cfg.scaling))
                .collect(),
        };
        Self {
            inv_freq,
            attention_factor: cfg.scaling.attention_factor() as f32,
        }
    }

    /// The frequency of each dimension pair, scaling applied.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    pub fn tables(&self, positions: &[u32], device: &Device) -> Result<RopeTables> {
        let (rows, half) = (positions.len(), self.inv_freq.len());
        let values = Tensor::from_vec(self.table_values(positions), (2, rows, half), device)?;
        Ok(RopeTables {
            cos: values.get(0)?,
            sin: values.get(1)?,
            values,
        })
    }

    /// The values of `tables`, on the host: the cos table [rows, head_dim / 2], then the sin.
    pub fn table_values(&self, positions: &[u32]) -> Vec<f32> {
        let (rows, half) = (positions.len(), self.inv_freq.len());
        let mut values = vec![0f32; 2 * rows * half];
        let (cos, sin) = values.split_at_mut(rows * half);
        let angles = positions
            .iter()
            .flat_map(|&p| self.inv_freq.iter().map(move |&f| p as f32 * f));
        for ((angle, c), s) in angles.zip(cos).zip(sin) {
            *c = angle.cos() * self.attention_factor;
            *s = angle.sin() * self.attention_factor;
        }
        values
    }
}

/// YaRN's frequencies, in transformers' f32 arithmetic: each dimension pair blends the
/// interpolated frequency (divided by `factor`) and the original by a linear ramp between the
/// dimensions that turn `beta_fast` and `beta_slow` times within the original length.
fn yarn_inv_freq(head_dim: usize, theta: f64, scaling: &RopeScaling) -> Vec<f32> {
    let RopeScaling::Yarn {
        factor,
        original_max_position_embeddings,
        beta_fast,
        beta_slow,
        truncate,
        ..
    } = *scaling
    else {
        unreachable!("yarn_inv_freq takes YaRN scaling")
    };
    let dim = head_dim as f64;
    // The dimension whose wavelength fits `rotations` times in the original length.
    let correction_dim = |rotations: f64| {
        dim * (original_max_position_embeddings as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * theta.ln())
    };
    let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
    if low == high {
        high += 0.001;
    }
    (0..head_dim / 2)
        .map(|i| {
            let pos_freq = (theta as f32).powf((2 * i) as f32 / head_dim as f32);
            let extrapolation = 1.0 / pos_freq;
            let interpolation = 1.0 / (factor as f32 * pos_freq);
            let ramp = ((i as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            interpolation * (1.0 - keep) + extrapolation * keep
        })
        .collect()
}

fn scale(inv_freq: f32, scaling: &RopeScaling) -> f32 {
    match *scaling {
        RopeScaling::None | RopeScaling::Yarn { .. } => inv_freq,
        RopeScaling::Linear { factor } => inv_freq / factor as f32,
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            // Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
            let old_len = original_max_position_embeddings as f64;
            let f = inv_freq as f64;
            let wavelen = 2.0 * std::f64::consts::PI / f;
            if wavelen < old_len / high_freq_factor {
                inv_freq
            } else if wavelen > old_len / low_freq_factor {
                (f / factor) as f32
            } else {
                let smooth = (old_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                ((1.0 - smooth) * f / factor + smooth * f) as f32
            }
        }
    }
}

impl RopeTables {
    /// Both tables, [2, rows, head_dim / 2]: what a CUDA graph's inputs are written into.
    pub fn values(&self) -> &Tensor {
        &self.values
    }

    pub fn cos(&self) -> &Tensor {
        &self.cos
    }

    pub fn sin(&self) -> &Tensor {
        &self.sin
    }

    /// Rotates `x` [rows, heads * head_dim].
    pub fn apply(&self, x: &Tensor, heads: usize, head_dim: usize) -> Result<Tensor> {
        ops::rope(x, &self.cos, &self.sin, heads, head_dim)
    }
}
