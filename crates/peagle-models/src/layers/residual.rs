use super::RmsNorm;
use candle_core::{Result, Tensor};

/// The residual stream between blocks: `base + delta`, where the add of a block's output
/// (`delta`) is left for the next block's input norm to fuse (`RmsNorm::forward_residual`),
/// one launch fewer a layer. Fused or not, the sum is rounded to the activations' dtype
/// before it is normed, so the bits are those of adding first.
pub struct Residual {
    base: Tensor,
    delta: Option<Delta>,
}

/// A block's output, to be added to the stream.
pub enum Delta {
    /// Its rows.
    Rows(Tensor),
    /// Experts' outputs on a GPU before their weighted sum, which the next block's input
    /// norm computes as it adds them (`RmsNorm::forward_experts`), one launch fewer again;
    /// `sum` combines them, then adds.
    #[cfg(feature = "cuda")]
    Experts(Box<peagle_kernels::ExpertOutputs>),
}

impl From<Tensor> for Delta {
    fn from(rows: Tensor) -> Self {
        Self::Rows(rows)
    }
}

impl Residual {
    /// A stream whose value is `x`, with nothing pending.
    pub fn new(x: Tensor) -> Self {
        Self { base: x, delta: None }
    }

    /// `base + delta`, the add left pending.
    pub fn pending(base: Tensor, delta: impl Into<Delta>) -> Self {
        Self {
            base,
            delta: Some(delta.into()),
        }
    }

    /// The stream's value and its norm by `norm`: `(sum, norm(sum))`.
    pub fn normed(self, norm: &RmsNorm) -> Result<(Tensor, Tensor)> {
        match self.delta {
            None => {
                let normed = norm.forward(&self.base)?;
                Ok((self.base, normed))
            }
            Some(Delta::Rows(delta)) => norm.forward_residual(&delta, &self.base),
            #[cfg(feature = "cuda")]
            Some(Delta::Experts(experts)) => norm.forward_experts(&experts, &self.base),
        }
    }

    /// The stream's value, its pending add done.
    pub fn sum(self) -> Result<Tensor> {
        match self.delta {
            None => Ok(self.base),
            Some(Delta::Rows(delta)) => &self.base + &delta,
            #[cfg(feature = "cuda")]
            Some(Delta::Experts(experts)) => &self.base + &experts.combine()?,
        }
    }
}
