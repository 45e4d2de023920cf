//! AdamW with decoupled weight decay, global-norm gradient clipping, and a linear-warmup
//! cosine schedule. Its moments are plain tensors so a checkpoint can save and restore them.

use crate::params::Params;
use crate::step::Gradients;
use candle_core::{Result, Tensor};

#[derive(Debug, Clone, Copy)]
pub struct AdamWConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub max_grad_norm: f64,
}

pub struct AdamW {
    pub config: AdamWConfig,
    /// Updates applied so far.
    pub step: usize,
    pub m: Vec<Tensor>,
    pub v: Vec<Tensor>,
}

impl AdamW {
    pub fn new(params: &Params, config: AdamWConfig) -> Result<Self> {
        let zeros = || {
            params
                .vars
                .iter()
                .map(|v| v.as_tensor().zeros_like())
                .collect::<Result<Vec<_>>>()
        };
        Ok(Self {
            config,
            step: 0,
            m: zeros()?,
            v: zeros()?,
        })
    }

    /// Clips the gradients to `max_grad_norm` (global L2), then updates every parameter with
    /// learning rate `lr`. Returns the norm before clipping.
    pub fn update(&mut self, params: &Params, grads: &Gradients, lr: f64) -> Result<f64> {
        let c = self.config;
        let mut squares = 0f64;
        for g in grads.0.iter().flatten() {
            squares += g.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
        }
        let norm = squares.sqrt();
        let clip = if c.max_grad_norm > 0.0 && norm > c.max_grad_norm {
            c.max_grad_norm / (norm + 1e-6)
        } else {
            1.0
        };
        self.step += 1;
        let t = self.step as i32;
        let (bias1, bias2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        for (i, var) in params.vars.iter().enumerate() {
            let Some(g) = &grads.0[i] else { continue };
            let g = (g * clip)?;
            self.m[i] = ((&self.m[i] * c.beta1)? + (&g * (1.0 - c.beta1))?)?;
            self.v[i] = ((&self.v[i] * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
            let m_hat = (&self.m[i] / bias1)?;
            let v_hat = (&self.v[i] / bias2)?;
            let update = (m_hat / (v_hat.sqrt()? + c.eps)?)?;
            let decayed = (var.as_tensor() * (1.0 - lr * c.weight_decay))?;
            var.set(&(decayed - (update * lr)?)?)?;
        }
        Ok(norm)
    }
}

/// Learning rate at `step` of `total`: linear warmup over `warmup` steps, then cosine decay to
/// `min_ratio` of the peak.
pub fn lr_at(step: usize, total: usize, warmup: usize, peak: f64, min_ratio: f64) -> f64 {
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1);
    let progress = ((step - warmup) as f64 / span as f64).min(1.0);
    let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
    peak * (min_ratio + (1.0 - min_ratio) * cosine)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_decays_to_the_floor() {
        assert!((lr_at(0, 100, 10, 1.0, 0.1) - 0.1).abs() < 1e-12);
        assert!((lr_at(9, 100, 10, 1.0, 0.1) - 1.0).abs() < 1e-12);
        assert!((lr_at(10, 100, 10, 1.0, 0.1) - 1.0).abs() < 1e-12);
        assert!((lr_at(55, 100, 10, 1.0, 0.1) - 0.55).abs() < 1e-12);
        assert!((lr_at(100, 100, 10, 1.0, 0.1) - 0.1).abs() < 1e-12);
    }
}
