use super::module::{function, Module};
use super::moe_dense::DenseLaunch;
use super::{aligned_16, by_dtype, dtype_name, grid, int, output, row_blocks, tensor, view, with_view, MAX_GRID_Y};
use crate::cuda_matmul::{CudaMatmul, MmaTiles};
use crate::dense_experts::DenseMatrix;
use crate::error::bad_input;
use crate::experts::{DeviceExperts, ExpertOutputs, ExpertShape, Routing};
use crate::kernel_constants::{
    MMA_WARPS as DENSE_WARPS, MOE_MAX_EXPERTS, MOE_MMA_WARPS, MOE_TILE, MOE_WARPS, MOE_WIDE_TILE,
};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage, WrapErr};
use candle_core::{DType, Device, Layout, Result, Storage, Tensor};

/// Pairs per tile (wide: of the wide tensor-core kernels), output columns per block and the
/// most experts; the tensor-core kernels' columns (two m16n8k16 tiles' 8) and warps per
/// block, and the threads that route and group (a warp a row, then a warp an expert).
const TILE: usize = MOE_TILE;
const WIDE_TILE: usize = MOE_WIDE_TILE;
const WARPS: usize = MOE_WARPS;
pub(crate) const MAX_EXPERTS: usize = MOE_MAX_EXPERTS;
const MMA_COLUMNS: usize = 16;
const MMA_WARPS: u32 = MOE_MMA_WARPS as u32;
const ROUTE_THREADS: u32 = MAX_EXPERTS as u32;

/// The device's copy of the experts' weights, each tensor's over all experts end to end.
pub(crate) enum ExpertWeights {
    Mxfp4(Box<Mxfp4Buffers>),
    /// bf16 or FP8 [E * 2I, H] and [E * H, I], with bf16 biases [E * 2I] and [E * H] or none.
    Dense {
        gate_up: DenseMatrix,
        gate_up_bias: Option<Tensor>,
        down: DenseMatrix,
        down_bias: Option<Tensor>,
    },
}

/// MXFP4 blocks and scales in the kernels' order (`lay_out_experts`), and f32 biases.
pub(crate) struct Mxfp4Buffers {
    pub gate_up_blocks: CudaSlice<u8>,
    pub gate_up_scales: CudaSlice<u8>,
    pub gate_up_bias: CudaSlice<f32>,
    pub down_blocks: CudaSlice<u8>,
    pub down_scales: CudaSlice<u8>,
    pub down_bias: CudaSlice<f32>,
}

/// `experts` MXFP4 weights of `(rows, groups)` end to end, as loaded (`codes` 16 bytes a block,
/// `scales` one), on the device in the order the kernels read them (`moe_lay_out`): the
/// checkpoint's order goes up, and the kernel writes the device's from it.
pub(crate) fn lay_out_experts(
    device: &CudaDevice,
    (codes, scales): (&[u8], &[u8]),
    experts: usize,
    (rows, groups): (usize, usize),
) -> Result<(CudaSlice<u8>, CudaSlice<u8>)> {
    const OP: &str = "moe_lay_out";
    let blocks = experts * rows * groups;
    if codes.len() != 16 * blocks || scales.len() != blocks {
        return Err(bad_input(
            OP,
            format!(
                "{} bytes of codes and {} scales for {blocks} blocks",
                codes.len(),
                scales.len()
            ),
        ));
    }
    let (experts_i, rows_i, groups_i) = (int(OP, experts)?, int(OP, rows)?, int(OP, groups)?);
    let (from_codes, from_scales) = (device.clone_htod(codes)?, device.clone_htod(scales)?);
    let mut to_codes = output::<u8>(device, codes.len())?;
    let mut to_scales = output::<u8>(device, blocks)?;
    let lay_out = function(device, Module::MoeMxfp4, "moe_lay_out")?;
    let mut b = lay_out.builder();
    b.arg(&mut to_codes)
        .arg(&mut to_scales)
        .arg(&from_codes)
        .arg(&from_scales);
    b.arg(&experts_i).arg(&rows_i).arg(&groups_i);
    // SAFETY: the buffers hold 16 bytes and one scale for each of the experts' blocks (checked
    // above), which block_index maps one to one; the kernel loops over the blocks past its grid.
    unsafe { b.launch(grid((blocks.div_ceil(256).clamp(1, 4096) as u32, 1), 256)) }.w()?;
    Ok((to_codes, to_scales))
}

/// A mixture-of-experts block from the router's `logits` [rows, experts] up to the combine:
/// each (row, rank) pair's expert output and routing weight, which `moe_combine` sums. Routed
/// and grouped by `kernels/moe.cu`; MXFP4 projections on the tensor cores
/// (`kernels/moe_mxfp4_mma.cu`), in `tiles`, where `kernel` is `Mma` and x is bf16, else on the
/// CUDA cores (`kernels/moe_mxfp4.cu`); dense ones (`kernels/moe_dense.cu`) on the tensor cores
/// only.
pub(crate) fn moe_experts(
    x: &Tensor,
    logits: &Tensor,
    experts: &DeviceExperts,
    routing: &Routing,
    kernel: CudaMatmul,
    tiles: MmaTiles,
) -> Result<ExpertOutputs> {
    let shape = &experts.shape;
    const OP: &str = "moe_experts";
    let (rows, _) = x.dims2()?;
    let dtype = x.dtype();
    if logits.dtype() != dtype {
        return Err(bad_input(OP, "the router's logits and x differ in dtype"));
    }
    let (xs, xl) = x.storage_and_layout();
    let (ls, ll) = logits.storage_and_layout();
    let (Storage::Cuda(xs), Storage::Cuda(ls)) = (&*xs, &*ls) else {
        return Err(bad_input(OP, "the experts are on a CUDA device, the rows on the CPU"));
    };
    // The kernels read x's rows 8 values at a time, by vector loads.
    aligned_16(OP, "x", xl, dtype)?;
    let device = xs.device.clone();
    let wide = match tiles {
        MmaTiles::ByBatch => rows * routing.top_k > TILE * shape.num_experts,
        MmaTiles::Narrow => false,
        MmaTiles::Wide | MmaTiles::Staged => true,
    };
    let projections = match (&experts.weights, kernel, dtype) {
        (ExpertWeights::Dense { gate_up, .. }, CudaMatmul::Mma, DType::BF16) => Projections::Dense {
            wide,
            fp8: matches!(gate_up, DenseMatrix::Fp8(_)),
        },
        (ExpertWeights::Dense { .. }, ..) => {
            return Err(bad_input(OP, "dense experts take bf16 rows on the tensor cores"));
        }
        (_, CudaMatmul::Mma, DType::BF16) => Projections::TensorCores { wide },
        _ => Projections::CudaCores(format!("moe_gate_up_{}", dtype_name(OP, dtype)?)),
    };
    let route = format!("moe_route_group_{}", dtype_name(OP, dtype)?);
    let (y, weights, pair_of) = by_dtype!(
        OP,
        dtype,
        launch(&device, (xs, xl), (ls, ll), experts, routing, &route, &projections)
    )?;
    let pairs = rows * routing.top_k;
    Ok(ExpertOutputs {
        y: tensor(y, &device, (pairs, shape.hidden)),
        weights: tensor(weights, &device, pairs),
        pair_of: tensor(pair_of, &device, pairs),
        rows,
        top_k: routing.top_k,
        dtype,
    })
}

/// `moe_combine`: each row's pairs' outputs weighted in rank order, [rows, hidden] in the
/// rows' dtype.
pub(crate) fn moe_combine(o: &ExpertOutputs) -> Result<Tensor> {
    const OP: &str = "moe_combine";
    let hidden = o.y.dim(1)?;
    let Device::Cuda(device) = o.y.device() else {
        return Err(bad_input(OP, "expert outputs off the GPU"));
    };
    let name = format!("moe_combine_{}", dtype_name(OP, o.dtype)?);
    let out = by_dtype!(OP, o.dtype, launch_combine(device, o, hidden, &name))?;
    Ok(out)
}

fn launch_combine<T: CudaDType + DeviceRepr>(
    device: &CudaDevice,
    o: &ExpertOutputs,
    hidden: usize,
    name: &str,
) -> Result<Tensor> {
    const OP: &str = "moe_combine";
    let (hidden_i, k_i) = (int(OP, hidden)?, int(OP, o.top_k)?);
    let mut out = output::<T>(device, o.rows * hidden)?;
    let combine = function(device, Module::Moe, name)?;
    with_expert_views(o, |[y, weights], pair_of| {
        let mut b = combine.builder();
        b.arg(&mut out)
            .arg(&y)
            .arg(&weights)
            .arg(&pair_of)
            .arg(&hidden_i)
            .arg(&k_i);
        // SAFETY: `pair_of` maps each row's k pairs into `y` [pairs, hidden].
        unsafe { b.launch(grid((o.rows as u32, row_blocks(hidden, 256)), 256)) }.w()?;
        Ok(())
    })?;
    Ok(tensor(out, device, (o.rows, hidden)))
}

/// Calls `f` with views of the experts' outputs and routing weights, and of the pairs'
/// indices, as the kernels that combine them read them.
pub(crate) fn with_expert_views<R>(
    o: &ExpertOutputs,
    f: impl FnOnce([CudaView<'_, f32>; 2], CudaView<'_, i32>) -> Result<R>,
) -> Result<R> {
    with_view::<f32, _>(&o.y, "expert outputs", |y| {
        with_view::<f32, _>(&o.weights, "routing weights", |weights| {
            with_view::<i32, _>(&o.pair_of, "pair indices", |pair_of| f([y, weights], pair_of))
        })
    })
}

/// The most tiles `pairs` (row, expert) pairs make over `experts` experts, which bounds the
/// grid of the projections: a tile holds at least one pair, and each expert's tiles hold
/// `tile` pairs but its last. Blocks past the tiles there are return at once, but each still
/// takes a launch slot, so the bound is kept tight.
fn max_tiles(pairs: usize, experts: usize, tile: usize) -> usize {
    pairs.min(pairs.div_ceil(tile) + experts)
}

/// Which kernels run the expert projections.
enum Projections {
    /// `moe_gate_up_*` (the named one) and `moe_down_f32`: TILE pairs and WARPS columns a block.
    CudaCores(String),
    /// `moe_gate_up_mma` and `moe_down_mma`: a tile of TILE pairs and 16 columns a block; or
    /// their `_wide` forms, WIDE_TILE pairs, where the average expert has more than TILE (each
    /// weight dequantized once for four times the pairs). Both give the same bits.
    TensorCores { wide: bool },
    /// `moe_dense_gate_up_W` and `moe_dense_down_W` (kernels/moe_dense.cu, W the weights'
    /// type: bf16, or f8e4m3 where `fp8`), a tile of TILE pairs and 16 columns a block; or
    /// their `_wide` forms, WIDE_TILE pairs and 16 activation or 32 output columns a block,
    /// where the average expert has more than TILE. Both give the same bits.
    Dense { wide: bool, fp8: bool },
}

impl Projections {
    fn names(&self) -> (String, String) {
        let (gate_up, down) = match self {
            Self::CudaCores(gate_up) => return (gate_up.clone(), "moe_down_f32".into()),
            Self::TensorCores { .. } => ("moe_gate_up_mma".to_string(), "moe_down_mma".to_string()),
            Self::Dense { fp8, .. } => {
                let w = if *fp8 { "f8e4m3" } else { "bf16" };
                (format!("moe_dense_gate_up_{w}"), format!("moe_dense_down_{w}"))
            }
        };
        match self {
            Self::TensorCores { wide: true } | Self::Dense { wide: true, .. } => {
                (format!("{gate_up}_wide"), format!("{down}_wide"))
            }
            _ => (gate_up, down),
        }
    }

    fn module(&self) -> Module {
        match self {
            Self::CudaCores(_) => Module::MoeMxfp4,
            Self::TensorCores { .. } => Module::MoeMxfp4Mma,
            Self::Dense { .. } => Module::MoeDense,
        }
    }

    /// Columns a block computes of the activations and of the outputs, and its threads.
    fn block(&self) -> (usize, usize, u32) {
        match self {
            Self::CudaCores(_) => (WARPS, WARPS, 32 * WARPS as u32),
            Self::TensorCores { .. } => (MMA_COLUMNS, MMA_COLUMNS, 32 * MMA_WARPS),
            Self::Dense { wide, .. } => (
                MMA_COLUMNS,
                MMA_COLUMNS * (1 + usize::from(*wide)),
                32 * DENSE_WARPS as u32,
            ),
        }
    }

    /// The most pairs of a tile.
    fn tile(&self) -> usize {
        match self {
            Self::TensorCores { wide: true } | Self::Dense { wide: true, .. } => WIDE_TILE,
            _ => TILE,
        }
    }
}

/// The buffers `ExpertOutputs` holds: the pairs' outputs, routing weights and indices.
type ExpertBuffers = (CudaSlice<f32>, CudaSlice<f32>, CudaSlice<i32>);

fn launch<T: CudaDType + DeviceRepr>(
    device: &CudaDevice,
    x: (&CudaStorage, &Layout),
    logits: (&CudaStorage, &Layout),
    experts: &DeviceExperts,
    routing: &Routing,
    route_name: &str,
    projections: &Projections,
) -> Result<ExpertBuffers> {
    const OP: &str = "moe_experts";
    let (rows, k) = (x.1.shape().dims2()?.0, routing.top_k);
    let ExpertShape {
        num_experts,
        hidden,
        intermediate: inter,
    } = experts.shape;
    let pairs = rows * k;
    let tile = projections.tile();
    let max_tiles = max_tiles(pairs, num_experts, tile);
    if max_tiles > MAX_GRID_Y {
        return Err(bad_input(
            OP,
            format!("{rows} rows make up to {max_tiles} tiles, more than one launch takes ({MAX_GRID_Y}): batch fewer tokens a step"),
        ));
    }
    let i = |n| int(OP, n);
    let (rows_i, experts_i, k_i, tile_i) = (i(rows)?, i(num_experts)?, i(k)?, i(tile)?);
    // The kernels index pairs with 32-bit integers too.
    i(pairs)?;
    let (hidden_i, inter_i) = (i(hidden)?, i(inter)?);
    let x = view::<T>(x.0, x.1, "x")?;
    let logits = view::<T>(logits.0, logits.1, "router logits")?;

    let mut ids = output::<i32>(device, pairs)?;
    let mut weights = output::<f32>(device, pairs)?;
    let mut pair_rows = output::<i32>(device, pairs)?;
    let mut pair_of = output::<i32>(device, pairs)?;
    let mut tiles = output::<i32>(device, 3 * max_tiles)?;
    let mut num_tiles = output::<i32>(device, 1)?;
    let route = function(device, Module::Moe, route_name)?;
    let normalize = i32::from(routing.normalize);
    let mut b = route.builder();
    b.arg(&logits).arg(&rows_i).arg(&experts_i).arg(&k_i).arg(&normalize);
    b.arg(&mut ids).arg(&mut weights);
    b.arg(&mut pair_rows)
        .arg(&mut pair_of)
        .arg(&mut tiles)
        .arg(&mut num_tiles)
        .arg(&tile_i);
    // SAFETY: logits hold rows * experts elements; ids, weights, pair_rows and pair_of rows * k;
    // every id is an expert below `experts`, at most MAX_EXPERTS (checked at load), which the
    // block's shared counts cover; an expert's tiles number ceil(its pairs / tile), so all of them
    // fit `max_tiles`, and the projections take tiles of `tile` pairs.
    unsafe { b.launch(grid((1, 1), ROUTE_THREADS)) }.w()?;

    let (gate_up_name, down_name) = projections.names();
    let gate_up = function(device, projections.module(), &gate_up_name)?;
    let down = function(device, projections.module(), &down_name)?;
    let (gate_up_columns, down_columns, threads) = projections.block();
    let tiles_y = max_tiles as u32;
    let gate_up_grid = grid((inter.div_ceil(gate_up_columns) as u32, tiles_y), threads);
    let down_grid = grid((hidden.div_ceil(down_columns) as u32, tiles_y), threads);
    let (alpha, limit) = routing.clamp.unwrap_or((0.0, 0.0));
    let mut y = output::<f32>(device, pairs * hidden)?;
    match &experts.weights {
        ExpertWeights::Mxfp4(w) => {
            let mut act = output::<f32>(device, pairs * inter)?;
            let mut b = gate_up.builder();
            b.arg(&mut act).arg(&x).arg(&pair_rows);
            b.arg(&w.gate_up_blocks).arg(&w.gate_up_scales).arg(&w.gate_up_bias);
            b.arg(&tiles)
                .arg(&num_tiles)
                .arg(&hidden_i)
                .arg(&inter_i)
                .arg(&alpha)
                .arg(&limit);
            // SAFETY: every tile's pairs and rows are in range (moe_route_group); the weights
            // hold experts * 2I rows of H / 32 blocks; tiles past `num_tiles` return at once.
            unsafe { b.launch(gate_up_grid) }.w()?;
            let mut b = down.builder();
            b.arg(&mut y)
                .arg(&act)
                .arg(&w.down_blocks)
                .arg(&w.down_scales)
                .arg(&w.down_bias);
            b.arg(&tiles).arg(&num_tiles).arg(&hidden_i).arg(&inter_i);
            // SAFETY: as for gate_up, with experts * H rows of I / 32 blocks.
            unsafe { b.launch(down_grid) }.w()?;
        }
        ExpertWeights::Dense {
            gate_up: gate_up_weight,
            gate_up_bias,
            down: down_weight,
            down_bias,
        } => {
            let mut act = output::<half::bf16>(device, pairs * inter)?;
            let dense = DenseLaunch {
                x: &x,
                pair_rows: &pair_rows,
                tiles: &tiles,
                num_tiles: &num_tiles,
                dims: (hidden_i, inter_i),
                gating: (alpha, limit),
            };
            let kernels = [(&gate_up, gate_up_grid), (&down, down_grid)];
            let weights = [
                (gate_up_weight, gate_up_bias.as_ref()),
                (down_weight, down_bias.as_ref()),
            ];
            dense.run(kernels, weights, &mut act, &mut y)?;
        }
    }
    Ok((y, weights, pair_of))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against every way of routing up to 70 pairs to 3 experts, in tiles of either width: the
    /// bound holds, and some routing reaches it.
    #[test]
    fn max_tiles_bounds_every_routing_tightly() {
        let experts = 3;
        for tile in [TILE, WIDE_TILE] {
            for pairs in 1..=70 {
                let mut most = 0;
                for a in 0..=pairs {
                    for b in 0..=pairs - a {
                        let tiles: usize = [a, b, pairs - a - b].map(|n: usize| n.div_ceil(tile)).iter().sum();
                        most = most.max(tiles);
                    }
                }
                let bound = max_tiles(pairs, experts, tile);
                assert!(most <= bound, "{pairs} pairs in tiles of {tile}: {most} tiles");
                assert!(bound - most <= experts, "{pairs} pairs in tiles of {tile}");
            }
        }
        assert_eq!(max_tiles(4, 32, TILE), 4, "a decode row's 4 pairs");
    }
}
