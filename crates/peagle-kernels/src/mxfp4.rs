//! Matrix product with MXFP4 weights (gpt-oss's experts), dequantized as they are read: the
//! weights stay packed in memory (4.25 bits a value) and never exist in a wider form.
//!
//! Layout, as the checkpoint stores it: `blocks` [out, in / 32, 16] bytes, two e2m1 values a
//! byte (low nibble first), and `scales` [out, in / 32] bytes, each the exponent e of one
//! 32-value block, which scales it by 2^(e - 127). Each output element is the dot product of
//! its input row and its dequantized weight row (`dot::dots`, whose order depends on the length
//! alone, `dequantized_linear`), the same whatever rows share the call.

use crate::contiguous::contiguous;
use crate::dequantized_linear::{dequantized_linear, GroupSums, ROWS_AT_ONCE};
use crate::error::{bad_input, matmul_dims};
use crate::mxfp4_dequant;
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};

/// Values per scale.
pub const MXFP4_BLOCK: usize = mxfp4_dequant::BLOCK;

/// An MXFP4 weight [out, in], packed as loaded.
#[derive(Debug, Clone)]
pub struct Mxfp4Weight {
    blocks: Vec<u8>,
    scales: Vec<u8>,
    out_dim: usize,
    in_dim: usize,
}

impl Mxfp4Weight {
    /// From `blocks` [out, in / 32, 16] and `scales` [out, in / 32], both u8.
    pub fn new(blocks: &Tensor, scales: &Tensor) -> Result<Self> {
        let (out_dim, groups, bytes) = blocks.dims3()?;
        if bytes != MXFP4_BLOCK / 2 || scales.dims() != [out_dim, groups] {
            return Err(bad_input(
                "mxfp4",
                format!(
                    "blocks {:?} and scales {:?} are not [out, in/32, 16] and [out, in/32]",
                    blocks.dims(),
                    scales.dims()
                ),
            ));
        }
        Ok(Self {
            blocks: blocks.flatten_all()?.to_vec1()?,
            scales: scales.flatten_all()?.to_vec1()?,
            out_dim,
            in_dim: groups * MXFP4_BLOCK,
        })
    }

    pub fn dims(&self) -> (usize, usize) {
        (self.out_dim, self.in_dim)
    }

    /// The blocks and scales, as `new` describes them.
    #[cfg(feature = "cuda")]
    pub(crate) fn packed(&self) -> (&[u8], &[u8]) {
        (&self.blocks, &self.scales)
    }

    /// Keeps output rows `rows`, in that order (gpt-oss de-interleaves gate and up this way).
    pub fn select_rows(&self, rows: &[usize]) -> Self {
        let (blocks, scales): (Vec<&[u8]>, Vec<&[u8]>) = rows.iter().map(|&r| self.packed_row(r)).unzip();
        Self {
            blocks: blocks.concat(),
            scales: scales.concat(),
            out_dim: rows.len(),
            in_dim: self.in_dim,
        }
    }

    /// Output row `r`'s codes (16 bytes a block) and scales (a byte a block).
    fn packed_row(&self, r: usize) -> (&[u8], &[u8]) {
        let groups = self.in_dim / MXFP4_BLOCK;
        (
            &self.blocks[r * self.in_dim / 2..][..self.in_dim / 2],
            &self.scales[r * groups..][..groups],
        )
    }

    /// Output row `r` dequantized into `out` [in].
    fn row(&self, r: usize, out: &mut [f32]) {
        let (codes, scales) = self.packed_row(r);
        mxfp4_dequant::dequantize(codes, scales, out);
    }

    /// The dot products of `x0` (and `x1`) with rows `first..first + ROWS_AT_ONCE`, dequantized
    /// in registers (`mxfp4_dequant::dots`); None where the CPU has no vector path for it.
    fn group_sums(&self, x0: &[f32], x1: Option<&[f32]>, first: usize) -> Option<GroupSums> {
        let rows: [_; ROWS_AT_ONCE] = std::array::from_fn(|c| self.packed_row(first + c));
        let (codes, scales) = (rows.map(|(codes, _)| codes), rows.map(|(_, scales)| scales));
        match x1 {
            Some(x1) => mxfp4_dequant::dots([x0, x1], codes, scales),
            None => mxfp4_dequant::dots([x0], codes, scales).map(|[sums]| [sums, [0.0; ROWS_AT_ONCE]]),
        }
    }

    /// The whole weight [out, in] in f32: for tests and for moving it where no kernel reads
    /// MXFP4, never on the inference path.
    pub fn dequantize(&self, device: &candle_core::Device) -> Result<Tensor> {
        let mut values = vec![0f32; self.out_dim * self.in_dim];
        for (r, row) in values.chunks_exact_mut(self.in_dim).enumerate() {
            self.row(r, row);
        }
        Tensor::from_vec(values, (self.out_dim, self.in_dim), device)
    }
}

/// `x` [rows, in] (f32) times the MXFP4 weight [out, in] transposed: [rows, out].
pub fn mxfp4_linear(x: &Tensor, w: &Mxfp4Weight) -> Result<Tensor> {
    x.apply_op1_no_bwd(&Mxfp4Linear { w })
}

struct Mxfp4Linear<'a> {
    w: &'a Mxfp4Weight,
}

impl CustomOp1 for Mxfp4Linear<'_> {
    fn name(&self) -> &'static str {
        "peagle-mxfp4-linear"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, in_dim, out_dim) = matmul_dims("mxfp4_linear", l.shape(), &Shape::from(self.w.dims()))?;
        let x = contiguous(s.as_slice::<f32>()?, l, "x")?;
        let out = dequantized_linear(
            x,
            rows,
            (out_dim, in_dim),
            |r, buf| self.w.row(r, buf),
            |x0, x1, first| self.w.group_sums(x0, x1, first),
        );
        Ok((CpuStorage::F32(out), Shape::from((rows, out_dim))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{max_abs_diff, values};
    use candle_core::{DType, Device};

    fn packed(out: usize, groups: usize) -> (Tensor, Tensor) {
        let blocks: Vec<u8> = (0..out * groups * 16).map(|i| (i * 37 % 256) as u8).collect();
        let scales: Vec<u8> = (0..out * groups).map(|i| 120 + (i % 9) as u8).collect();
        (
            Tensor::from_vec(blocks, (out, groups, 16), &Device::Cpu).unwrap(),
            Tensor::from_vec(scales, (out, groups), &Device::Cpu).unwrap(),
        )
    }

    #[test]
    fn dequantizes_low_nibble_first_with_power_of_two_scales() {
        let mut blocks = vec![0u8; 16];
        blocks[0] = 0x72; // 1.0 then 6.0
        blocks[1] = 0xf9; // -0.5 then -6.0
        let w = Mxfp4Weight::new(
            &Tensor::from_vec(blocks, (1, 1, 16), &Device::Cpu).unwrap(),
            &Tensor::from_vec(vec![129u8], (1, 1), &Device::Cpu).unwrap(),
        )
        .unwrap();
        let values: Vec<f32> = w
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(&values[..4], &[4.0, 24.0, -2.0, -24.0]);
        assert!(values[4..].iter().all(|v| *v == 0.0));
    }

    #[test]
    fn equals_a_matmul_by_the_dequantized_weight_and_is_batch_invariant() {
        let (blocks, scales) = packed(11, 3);
        let w = Mxfp4Weight::new(&blocks, &scales).unwrap();
        let x = Tensor::randn(0f32, 1.0, (5, 96), &Device::Cpu).unwrap();
        let ours = mxfp4_linear(&x, &w).unwrap();
        let dense = x.matmul(&w.dequantize(&Device::Cpu).unwrap().t().unwrap()).unwrap();
        let diff = max_abs_diff(&ours, &dense);
        assert!(diff < 1e-4, "{diff}");
        // Every row alone (in registers) as in batches of 5 and 3 (the buffer's chunks of four,
        // or two, input rows, and their tails).
        let three = mxfp4_linear(&x.narrow(0, 1, 3).unwrap(), &w).unwrap();
        for r in 0..5 {
            let alone = values(&mxfp4_linear(&x.narrow(0, r, 1).unwrap(), &w).unwrap());
            assert_eq!(alone, ours.get(r).unwrap().to_vec1::<f32>().unwrap(), "row {r} of 5");
            if (1..4).contains(&r) {
                assert_eq!(
                    alone,
                    three.get(r - 1).unwrap().to_vec1::<f32>().unwrap(),
                    "row {r} of 3"
                );
            }
        }
        let picked = w.select_rows(&[3, 0]).dequantize(&Device::Cpu).unwrap();
        let full = w.dequantize(&Device::Cpu).unwrap();
        assert_eq!(
            picked.get(0).unwrap().to_vec1::<f32>().unwrap(),
            full.get(3).unwrap().to_vec1::<f32>().unwrap()
        );
        let err = mxfp4_linear(&Tensor::zeros((1, 64), DType::F32, &Device::Cpu).unwrap(), &w).unwrap_err();
        assert!(err.to_string().contains("64 columns"), "{err}");
    }
}
