//! Structured output's bans applied where the logits lie. A grammar bans most of a large
//! vocabulary at most positions, so a row's bans cross to the device as bits (vocab / 8 bytes)
//! rather than as the banned tokens and their values.

use crate::contiguous::contiguous;
use crate::error::bad_input;
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

/// Bits per word of an `allowed` row: bit `t % 32` of word `t / 32` allows token `t`.
pub const TOKEN_MASK_WORD_BITS: usize = 32;

/// `x` [rows, vocab] (f32) with each row's tokens that `allowed` [rows, words] (u32, `words =
/// ceil(vocab / 32)`) leaves out set to -inf; the others keep their bits.
pub fn mask_tokens(x: &Tensor, allowed: &Tensor) -> Result<Tensor> {
    let (rows, vocab) = x.dims2()?;
    let words = vocab.div_ceil(TOKEN_MASK_WORD_BITS);
    if x.dtype() != DType::F32 || allowed.dtype() != DType::U32 {
        return Err(bad_input("mask_tokens", "f32 logits and u32 bits are expected"));
    }
    if allowed.dims2()? != (rows, words) {
        return Err(bad_input(
            "mask_tokens",
            format!("bits {:?} for {rows} rows of {vocab} tokens", allowed.dims()),
        ));
    }
    if rows == 0 {
        return Ok(x.clone());
    }
    x.apply_op2_no_bwd(allowed, &MaskTokens)
}

/// Whether `words` (one row's bits) allow `token`.
pub fn allows(words: &[u32], token: u32) -> bool {
    let t = token as usize;
    words
        .get(t / TOKEN_MASK_WORD_BITS)
        .is_some_and(|w| w >> (t % TOKEN_MASK_WORD_BITS) & 1 == 1)
}

struct MaskTokens;

impl CustomOp2 for MaskTokens {
    fn name(&self) -> &'static str {
        "peagle-mask-tokens"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout, b: &CpuStorage, b_l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, vocab) = l.shape().dims2()?;
        let x = contiguous(s.as_slice::<f32>()?, l, "x")?;
        let bits = contiguous(b.as_slice::<u32>()?, b_l, "allowed")?;
        let words = vocab.div_ceil(TOKEN_MASK_WORD_BITS);
        let mut out = x.to_vec();
        for (row, values) in out.chunks_mut(vocab.max(1)).enumerate() {
            let row_bits = &bits[row * words..][..words];
            for (token, value) in values.iter_mut().enumerate() {
                if !allows(row_bits, token as u32) {
                    *value = f32::NEG_INFINITY;
                }
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((rows, vocab))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
        b: &candle_core::CudaStorage,
        b_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (rows, vocab) = l.shape().dims2()?;
        crate::cuda::mask_tokens((s, l), (b, b_l), rows, vocab)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn tokens_left_out_of_a_rows_bits_become_minus_infinity() {
        let vocab = 37;
        let x: Vec<f32> = (0..2 * vocab).map(|i| i as f32 - 30.0).collect();
        let x = Tensor::from_vec(x, (2, vocab), &Device::Cpu).unwrap();
        // Row 0 allows tokens 0, 5 and 36 (the second word's bit 4); row 1 every token.
        let bits = vec![1 | 1 << 5, 1 << 4, u32::MAX, u32::MAX];
        let allowed = Tensor::from_vec(bits, (2, 2), &Device::Cpu).unwrap();
        let got: Vec<Vec<f32>> = mask_tokens(&x, &allowed).unwrap().to_vec2().unwrap();
        let kept: Vec<usize> = (0..vocab).filter(|&t| got[0][t].is_finite()).collect();
        assert_eq!(kept, [0, 5, 36]);
        assert_eq!(got[0][5], 5.0 - 30.0);
        assert_eq!(got[1], x.to_vec2::<f32>().unwrap()[1]);
        let wrong = Tensor::from_vec(vec![0u32; 2], (2, 1), &Device::Cpu).unwrap();
        assert!(mask_tokens(&x, &wrong).is_err());
    }
}
