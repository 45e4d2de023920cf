//! The launches of `kernels/moe_dense.cu`'s projections, for `moe.rs`'s `launch` once it has
//! routed and grouped a block's rows: dense experts' weights, bf16 or FP8, with their scales.

use super::module::Kernel;
use super::{arg_or_null, int, with_optional_view, with_views};
use crate::dense_experts::DenseMatrix;
use crate::error::bad_input;
use crate::fp8_weight::Fp8Weight;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{Result, Tensor};

/// What both of a dense block's projections take beside their own weights.
pub(super) struct DenseLaunch<'a, T> {
    pub x: &'a CudaView<'a, T>,
    pub pair_rows: &'a CudaSlice<i32>,
    pub tiles: &'a CudaSlice<i32>,
    pub num_tiles: &'a CudaSlice<i32>,
    /// (H, I).
    pub dims: (i32, i32),
    /// The SwiGLU clamp's (alpha, limit); limit 0 for none.
    pub gating: (f32, f32),
}

/// A projection's weight as its kernel takes it: the values, their blocks' scales (none for
/// bf16) and the block a scale covers.
type DenseWeight<'a> = (&'a Tensor, Option<&'a Tensor>, (usize, usize));

/// An FP8 weight as its kernel takes it.
fn scaled(w: &Fp8Weight) -> DenseWeight<'_> {
    let (values, scales) = w.parts();
    (values, Some(scales), w.block())
}

impl<T: DeviceRepr> DenseLaunch<'_, T> {
    /// The projections (`kernels`: moe_dense_gate_up_W and moe_dense_down_W, with their grids)
    /// over the experts' matrices and biases (`weights`: gate_up's, then down's), of one kind W
    /// (`DenseExperts::new` checks), into the activations `act` [pairs, I] and the outputs `y`
    /// [pairs, H].
    pub(super) fn run(
        &self,
        kernels: [(&Kernel, LaunchConfig); 2],
        weights: [(&DenseMatrix, Option<&Tensor>); 2],
        act: &mut CudaSlice<half::bf16>,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let [(gate_up, gate_up_bias), (down, down_bias)] = weights;
        let biases = [gate_up_bias, down_bias];
        match (gate_up, down) {
            (DenseMatrix::Bf16(g), DenseMatrix::Bf16(d)) => {
                let no_scales = [(g, None, (1, 1)), (d, None, (1, 1))];
                self.launch::<half::bf16>(kernels, no_scales, biases, act, y)
            }
            (DenseMatrix::Fp8(g), DenseMatrix::Fp8(d)) => {
                self.launch::<float8::F8E4M3>(kernels, [scaled(g), scaled(d)], biases, act, y)
            }
            _ => Err(bad_input("moe_dense", "dense experts' projections of two kinds")),
        }
    }

    /// `run` for weights of W.
    fn launch<W: CudaDType>(
        &self,
        kernels: [(&Kernel, LaunchConfig); 2],
        weights: [DenseWeight; 2],
        biases: [Option<&Tensor>; 2],
        act: &mut CudaSlice<half::bf16>,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        const OP: &str = "moe_dense";
        let [(gate_up, gate_up_grid), (down, down_grid)] = kernels;
        let [(gate_up_w, gate_up_scales, gate_up_block), (down_w, down_scales, down_block)] = weights;
        let blocks = |(bn, bk): (usize, usize)| Ok::<_, candle_core::Error>((int(OP, bn)?, int(OP, bk)?));
        let (gate_up_block, down_block) = (blocks(gate_up_block)?, blocks(down_block)?);
        let (hidden, inter) = &self.dims;
        let (alpha, limit) = &self.gating;
        with_views::<W, _, 2>(
            [(gate_up_w, "gate_up weights"), (down_w, "down weights")],
            |[gate_up_w, down_w]| {
                with_optional_view::<f32, _>(gate_up_scales, "gate_up scales", |gate_up_scales| {
                    with_optional_view::<f32, _>(down_scales, "down scales", |down_scales| {
                        with_optional_view::<half::bf16, _>(biases[0], "gate_up biases", |gate_up_bias| {
                            with_optional_view::<half::bf16, _>(biases[1], "down biases", |down_bias| {
                                let mut b = gate_up.builder();
                                b.arg(&mut *act).arg(self.x).arg(self.pair_rows).arg(&gate_up_w);
                                arg_or_null(&mut b, gate_up_bias.as_ref());
                                arg_or_null(&mut b, gate_up_scales.as_ref());
                                b.arg(&gate_up_block.0).arg(&gate_up_block.1);
                                b.arg(self.tiles)
                                    .arg(self.num_tiles)
                                    .arg(hidden)
                                    .arg(inter)
                                    .arg(alpha)
                                    .arg(limit);
                                // SAFETY: x is bf16 (`moe_experts`); every tile's pairs and rows are
                                // in range (moe_route_group); the weight holds experts * 2I rows of H,
                                // FP8 ones with a scale a block, each expert's from a row of blocks,
                                // and the bias, where there is one, experts * 2I values
                                // (`DenseExperts::new`); H and I are multiples of 32, and x 16-byte
                                // aligned; tiles past `num_tiles` return at once.
                                unsafe { b.launch(gate_up_grid) }.w()?;
                                let mut b = down.builder();
                                b.arg(&mut *y).arg(&*act).arg(&down_w);
                                arg_or_null(&mut b, down_bias.as_ref());
                                arg_or_null(&mut b, down_scales.as_ref());
                                b.arg(&down_block.0).arg(&down_block.1);
                                b.arg(self.tiles).arg(self.num_tiles).arg(hidden).arg(inter);
                                // SAFETY: as for gate_up, with experts * H rows of I and experts * H
                                // bias values; the activations' rows, I bf16 values, are 16-byte
                                // aligned.
                                unsafe { b.launch(down_grid) }.w()?;
                                Ok(())
                            })
                        })
                    })
                })
            },
        )
    }
}
