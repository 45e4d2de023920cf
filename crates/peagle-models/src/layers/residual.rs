use super::RmsNorm;
use candle_core::{Result, Tensor};

/// The residual stream between blocks: `base + delta`, where the add of a block's output
/// (`delta`) is left for the next block's input norm to fuse (`RmsNorm::forward_residual`),
/// one launch fewer a layer. Fused or not, the sum is rounded to the activations' dtype
/// before it is normed, so the bits are those of adding first.
pub struct Residual {
    base: Tensor,
    delta: Option<Tensor>,
}

impl Residual {
    /// A stream whose value is `x`, with nothing pending.
    pub fn new(x: Tensor) -> Self {
        Self { base: x, delta: None }
    }

    /// `base + delta`, the add left pending.
    pub fn pending(base: Tensor, delta: Tensor) -> Self {
        Self {
            base,
            delta: Some(delta),
        }
    }

    /// The stream's value and its norm by `norm`: `(sum, norm(sum))`.
    pub fn normed(self, norm: &RmsNorm) -> Result<(Tensor, Tensor)> {
        match self.delta {
            None => {
                let normed = norm.forward(&self.base)?;
                Ok((self.base, normed))
            }
            Some(delta) => norm.forward_residual(&delta, &self.base),
        }
    }

    /// The stream's value, its pending add done.
    pub fn sum(self) -> Result<Tensor> {
        match self.delta {
            None => Ok(self.base),
            Some(delta) => &self.base + &delta,
        }
    }
}
