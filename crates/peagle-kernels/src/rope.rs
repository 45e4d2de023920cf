//! Rotary position embedding in the rotate-halves layout, one row at a time.
//!
//! The same arithmetic as candle's `rope_thd` (two products and a difference or sum per
//! element, no fused multiply-add), so results are identical, but each head's halves are
//! walked contiguously so the loop vectorises: candle's CPU loop strides over heads innermost.

use crate::contiguous::{contiguous, strided_rows};
use crate::error::bad_input;
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};

/// Rotates `x` [rows, heads * head_dim] by `cos` and `sin` [rows, head_dim / 2]; `x` may be a
/// column range of a wider tensor.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, head_dim: usize) -> Result<Tensor> {
    x.apply_op3_no_bwd(cos, sin, &Rope { head_dim })
}

/// A batch's rotation as the ops that rotate what they read take it (`write_rotated_kv`,
/// `rotated_paged_attention`): on a GPU in the kernel that reads the rows, saving a launch of
/// `rope` and its output; on the CPU by `rope` first. Either way each element is rotated by
/// `rope`'s arithmetic and rounded to the rows' dtype before use, so the bits are the same.
#[derive(Clone, Copy)]
pub struct Rotation<'a> {
    /// [2, n, head_dim / 2] f32, contiguous: cos for n table rows, then sin.
    pub tables: &'a Tensor,
    /// [rows] u32, contiguous, on the tables' device: the table row of each row rotated (a
    /// table of every position read by the rows' positions). None: row t is table row t (a
    /// batch's own tables, n = rows). The kernels read an index past the table as its last
    /// row, so whoever writes these checks them against n.
    pub table_rows: Option<&'a Tensor>,
    pub head_dim: usize,
}

impl<'a> Rotation<'a> {
    /// `x` rotated by `rope`.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let own;
        let tables = match self.table_rows {
            Some(rows) => {
                own = self.tables.index_select(rows, 1)?;
                &own
            }
            None => self.tables,
        };
        rope(x, &tables.get(0)?, &tables.get(1)?, self.head_dim)
    }

    /// This rotation, its tables and table rows checked against `rows` rows of `width` as the
    /// kernels read them.
    #[cfg(feature = "cuda")]
    pub(crate) fn checked(self, op: &'static str, rows: usize, width: usize) -> Result<Self> {
        let d = self.head_dim;
        if d == 0 || !d.is_multiple_of(2) || !width.is_multiple_of(d) {
            return Err(bad_input(
                op,
                format!("width {width} is not whole heads of even size {d}"),
            ));
        }
        let dims = self.tables.dims();
        let n = match self.table_rows {
            Some(_) => dims.get(1).copied().filter(|&n| n > 0).unwrap_or(rows),
            None => rows,
        };
        if dims != [2, n, d / 2] || !self.tables.is_contiguous() || self.tables.dtype() != candle_core::DType::F32 {
            return Err(bad_input(
                op,
                format!(
                    "rotary tables {dims:?} of {:?}, expected [2, {n}, {}] of f32, contiguous",
                    self.tables.dtype(),
                    d / 2
                ),
            ));
        }
        if let Some(table_rows) = self.table_rows {
            if table_rows.dims() != [rows]
                || !table_rows.is_contiguous()
                || table_rows.dtype() != candle_core::DType::U32
            {
                return Err(bad_input(
                    op,
                    format!(
                        "rotary table rows {:?} of {:?}, expected [{rows}] of u32, contiguous",
                        table_rows.dims(),
                        table_rows.dtype()
                    ),
                ));
            }
        }
        Ok(self)
    }
}

struct Rope {
    head_dim: usize,
}

impl CustomOp3 for Rope {
    fn name(&self) -> &'static str {
        "peagle-rope"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        cs: &CpuStorage,
        cl: &Layout,
        ss: &CpuStorage,
        sl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (rows, width) = self.check(xl, cl, sl)?;
        let (d, half) = (self.head_dim, self.head_dim / 2);
        let x_rows = strided_rows(xl, "rope", "the input")?;
        let x = xs.as_slice::<f32>()?;
        let cos = contiguous(cs.as_slice::<f32>()?, cl, "cos")?;
        let sin = contiguous(ss.as_slice::<f32>()?, sl, "sin")?;
        let mut out = vec![0f32; rows * width];
        for (t, out_row) in out.chunks_exact_mut(width).enumerate() {
            let x_row = x_rows.row(x, t);
            let (c, s) = (&cos[t * half..][..half], &sin[t * half..][..half]);
            for (head, out_head) in x_row.chunks_exact(d).zip(out_row.chunks_exact_mut(d)) {
                let (a, b) = head.split_at(half);
                let (out_a, out_b) = out_head.split_at_mut(half);
                for i in 0..half {
                    out_a[i] = a[i] * c[i] - b[i] * s[i];
                    out_b[i] = a[i] * s[i] + b[i] * c[i];
                }
            }
        }
        Ok((CpuStorage::F32(out), xl.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        xs: &candle_core::CudaStorage,
        xl: &Layout,
        cs: &candle_core::CudaStorage,
        cl: &Layout,
        ss: &candle_core::CudaStorage,
        sl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.check(xl, cl, sl)?;
        crate::cuda::rope((xs, xl), (cs, cl), (ss, sl), self.head_dim)
    }
}

impl Rope {
    /// Checks whole even heads, tables of [rows, head_dim / 2] and contiguous rows; returns
    /// the rows and width.
    fn check(&self, xl: &Layout, cl: &Layout, sl: &Layout) -> Result<(usize, usize)> {
        let (rows, width) = xl.shape().dims2()?;
        let d = self.head_dim;
        let half = d / 2;
        if d == 0 || !d.is_multiple_of(2) || !width.is_multiple_of(d) {
            return Err(bad_input(
                "rope",
                format!("width {width} is not whole heads of even size {d}"),
            ));
        }
        for (what, layout) in [("cos", cl), ("sin", sl)] {
            if layout.shape().dims() != [rows, half] {
                return Err(bad_input(
                    "rope",
                    format!("{what} is {:?}, expected [{rows}, {half}]", layout.shape().dims()),
                ));
            }
        }
        // Rows may be strided (columns of a fused q/k/v projection); elements must not be.
        strided_rows(xl, "rope", "the input")?;
        Ok((rows, width))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn equals_candles_rope_bitwise() {
        let dev = Device::Cpu;
        let (rows, heads, d) = (5, 3, 8);
        let x = Tensor::randn(0f32, 1.0, (rows, heads * d), &dev).unwrap();
        let angles = Tensor::randn(0f32, 3.0, (rows, d / 2), &dev).unwrap();
        let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
        let ours: Vec<f32> = rope(&x, &cos, &sin, d)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let x4 = x.reshape((1, rows, heads, d)).unwrap();
        let wide = Tensor::cat(&[&x, &x], 1).unwrap();
        let strided: Vec<f32> = rope(&wide.narrow(1, heads * d, heads * d).unwrap(), &cos, &sin, d)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(strided, ours);
        let theirs: Vec<f32> = candle_nn::rotary_emb::rope_thd(&x4, &cos, &sin)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(
            ours.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            theirs.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn mismatched_tables_are_an_error() {
        let dev = Device::Cpu;
        let x = Tensor::zeros((2, 16), candle_core::DType::F32, &dev).unwrap();
        let cos = Tensor::zeros((2, 3), candle_core::DType::F32, &dev).unwrap();
        let err = rope(&x, &cos, &cos, 8).unwrap_err();
        assert!(err.to_string().contains("expected [2, 4]"), "{err}");
    }
}
