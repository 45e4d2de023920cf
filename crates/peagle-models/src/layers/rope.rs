use crate::config::{RopeConfig, RopeScaling};
use crate::ops;
use candle_core::{bail, Device, Result, Tensor};
use peagle_kernels::Rotation;

/// Rotary position embedding in the rotate-halves layout (HF Llama, Qwen3).
///
/// Frequencies follow transformers' f32 arithmetic so cos/sin match the reference closely. A
/// forward's tables are built for just the positions in it, once for all layers; on a GPU, once
/// `place_table` has made the table of every position there, a forward reads that instead, by
/// its rows' positions, and uploads none (vLLM's cos/sin cache).
pub struct RotaryEmbedding {
    inv_freq: Vec<f32>,
    /// Multiplies cos and sin (YaRN's attention factor; 1 otherwise).
    attention_factor: f32,
    /// [2, positions, head_dim / 2] on the model's device, by `place_table`.
    table: Option<Tensor>,
}

/// The cos and sin a forward's rows are rotated by, [2, n, head_dim / 2] (cos, then sin): the
/// rows' own (n = rows), or the table of every position read by the rows' positions.
pub struct RopeTables {
    values: Tensor,
    /// Where `values` is the table of every position: each row's position, on its device.
    positions: Option<Tensor>,
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
            table: None,
        }
    }

    /// Makes the table of positions 0 to `positions - 1` on `device`, which every forward's
    /// rows then read by position: their positions must be fewer than `positions`. Each entry
    /// is the value `tables` computes for that position, so the bits do not change.
    pub fn place_table(&mut self, positions: usize, device: &Device) -> Result<()> {
        let all: Vec<u32> = (0..positions as u32).collect();
        self.table = Some(self.tables(&all, device)?.values);
        Ok(())
    }

    /// The tables of a forward's rows at `positions`: with a placed table and the positions on
    /// its device (`on_device`), that table; otherwise the rows' own, made on `device`.
    pub fn forward_tables(&self, positions: &[u32], on_device: Option<Tensor>, device: &Device) -> Result<RopeTables> {
        match (&self.table, on_device) {
            (Some(table), Some(on_device)) => {
                let tables = RopeTables {
                    values: table.clone(),
                    positions: Some(on_device),
                };
                tables.check_positions(positions)?;
                Ok(tables)
            }
            _ => self.tables(positions, device),
        }
    }

    /// The frequency of each dimension pair, scaling applied.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// The rows' own tables, made on `device`.
    pub fn tables(&self, positions: &[u32], device: &Device) -> Result<RopeTables> {
        let (rows, half) = (positions.len(), self.inv_freq.len());
        let values = Tensor::from_vec(self.table_values(positions), (2, rows, half), device)?;
        Ok(RopeTables {
            values,
            positions: None,
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
    /// [2, n, head_dim / 2]: the rows' own tables, what a CUDA graph's inputs are written into,
    /// or the table of every position.
    pub fn values(&self) -> &Tensor {
        &self.values
    }

    /// Whether the rows read the table of every position (`RotaryEmbedding::place_table`).
    pub fn by_position(&self) -> bool {
        self.positions.is_some()
    }

    /// Fails where the rows read the table of every position and one of `positions` is past
    /// it: the kernels would read it as the table's last row.
    pub fn check_positions(&self, positions: &[u32]) -> Result<()> {
        if !self.by_position() {
            return Ok(());
        }
        let rows = self.values.dim(1)?;
        match positions.iter().find(|&&p| p as usize >= rows) {
            Some(p) => bail!("position {p} is past the rotary table's {rows} positions"),
            None => Ok(()),
        }
    }

    /// As the kernels that rotate what they read take it.
    pub fn rotation(&self, head_dim: usize) -> Rotation<'_> {
        Rotation {
            tables: &self.values,
            table_rows: self.positions.as_ref(),
            head_dim,
        }
    }

    /// Rotates `x` [rows, heads * head_dim].
    pub fn apply(&self, x: &Tensor, heads: usize, head_dim: usize) -> Result<Tensor> {
        let rows = match &self.positions {
            Some(positions) => self.values.index_select(positions, 1)?,
            None => self.values.clone(),
        };
        ops::rope(x, &rows.get(0)?, &rows.get(1)?, heads, head_dim)
    }
}
