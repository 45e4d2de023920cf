//! Rows sampled where they are, by the Gumbel-max trick: a row's token is the one whose scaled
//! logit plus its Gumbel noise is largest, which draws it with probability
//! softmax(logits / temperature). A token's noise depends only on the request's key and the
//! token's index, so a row's draw depends on its logits and its key alone. On a GPU, a
//! sampled row with no cut (every token may be drawn) brings one token id to the host.
//!
//! score(i) = ((logit_i - max) / temperature, in f32, widened) - ln(-ln(u_i)), with u_i in
//! (0, 1] from the top 53 bits of splitmix64(key + (i + 1) * golden); a logit equal to the max
//! scales to 0, so that a row with +inf logits draws among those alone, each as likely, as the
//! softmax's limit does. The largest score wins, the lower index on a tie; NaN logits are never
//! chosen; a row with nothing else gives 0.
//! The device's f64 `log` and the host's may differ in the last bit, so the two agree but for
//! scores within an ulp of each other.

use crate::contiguous::contiguous;
use crate::requested_rows::{apply_to_rows, Issued};
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};

/// One row to sample, its temperature (> 0) and the key of its noise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GumbelRequest {
    pub row: usize,
    pub temperature: f32,
    pub key: u64,
}

/// The token drawn from each requested row of `logits` ([rows, cols], f32 or bf16), in order.
pub fn gumbel_sample(logits: &Tensor, requests: &[GumbelRequest]) -> Result<Vec<u32>> {
    issue_gumbel_sample(logits, requests)?.read()
}

/// `gumbel_sample`, issued where the logits are and read later.
pub fn issue_gumbel_sample(logits: &Tensor, requests: &[GumbelRequest]) -> Result<Issued<u32>> {
    let rows = requests.iter().map(|r| r.row);
    let words = apply_to_rows("gumbel_sample", logits, rows, &GumbelSample(requests))?;
    Ok(Issued::tokens(words))
}

struct GumbelSample<'a>(&'a [GumbelRequest]);

impl CustomOp1 for GumbelSample<'_> {
    fn name(&self) -> &'static str {
        "peagle-gumbel-sample"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, cols) = l.shape().dims2()?;
        let x = contiguous(s.as_slice::<f32>()?, l, "logits")?;
        let tokens = self.0.iter().map(|r| of_row(&x[r.row * cols..][..cols], r)).collect();
        Ok((CpuStorage::U32(tokens), Shape::from(self.0.len())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((crate::cuda::gumbel_sample((s, l), self.0)?, Shape::from(self.0.len())))
    }
}

/// The host's computation, in index order: the reference the kernel is tested against.
fn of_row(row: &[f32], request: &GumbelRequest) -> u32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut pick: Option<(usize, f64)> = None;
    for (i, &logit) in row.iter().enumerate() {
        if logit.is_nan() {
            continue;
        }
        let scaled = if logit == max {
            0.0
        } else {
            (logit - max) / request.temperature
        };
        let score = scaled as f64 + gumbel(request.key, i);
        if pick.is_none_or(|(_, best)| score > best) {
            pick = Some((i, score));
        }
    }
    pick.map_or(0, |(i, _)| i as u32)
}

fn gumbel(key: u64, index: usize) -> f64 {
    let bits = splitmix64(key.wrapping_add((index as u64 + 1).wrapping_mul(GOLDEN)));
    let u = ((bits >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64);
    -(-u.ln()).ln()
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// splitmix64's step and finaliser: neighbouring inputs get unrelated outputs.
pub fn splitmix64(x: u64) -> u64 {
    let x = x.wrapping_add(GOLDEN);
    let x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
