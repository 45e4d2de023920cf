use super::module::{function, Kernel, Module};
use super::{aligned_16, arg_or_null, by_dtypes_or_fp8, dtype_name, dtype_name_or_fp8, int, output, swiglu, view};
use crate::cuda_matmul::{CudaMatmul, MmaTiles};
use crate::error::{bad_input, matmul_dims};
use crate::invariant_matmul::MatmulOutput;
use crate::kernel_constants::{LINEAR_ROWS, LINEAR_WARPS, LINEAR_WIDE_COLUMNS, MMA_STEP, MMA_WARPS, STAGED_ROWS};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaView, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Result, Shape};

/// Where the tensor cores take a product in their staged form by the batch: from a whole
/// block's 64 rows (`STAGED_ROWS`: a block is 64 by 64), and where that makes at least 256
/// blocks, about two for each SM of an H100 (132). With fewer rows the wide form's reads are
/// as few and more of them are in flight (a warp loads its own step, where the staged block
/// shares one), and with fewer blocks its four times the blocks keep more of the GPU busy.
const STAGED_BLOCKS: usize = 256;

/// How a kernel of `kernels/linear.cu` or `kernels/linear_mma.cu` splits the work.
#[derive(Clone, Copy)]
enum Form {
    /// `linear_*_row`: one row, one column a warp.
    Row,
    /// `linear_*`: 8 rows, one column a warp.
    Rows,
    /// `linear_*_wide`: 8 rows, 4 columns a warp.
    Wide,
    /// `linear_mma_bf16` (`linear_mma_bf16_f8e4m3` for an FP8 weight): 8 rows, 16 columns a
    /// block.
    Mma,
    /// `linear_mma_bf16_wide` (`linear_mma_bf16_f8e4m3_wide`): 32 rows, 32 columns a block.
    MmaWide,
    /// `linear_mma_bf16_staged`: 64 rows, 64 columns a block, the operands staged in shared
    /// memory.
    MmaStaged,
}

impl Form {
    /// The form for an [m, k] by [n, k] product by `kernel`, the tensor cores' in `tiles`, of
    /// an FP8 weight in blocks `block_k` wide where `fp8_block_k` says so. Every form of a
    /// kernel computes each element by the same chain, so a row's bits do not depend on which
    /// one its batch's size picks; which kernel runs depends on the dtypes, K and the FP8
    /// block alone. Tensor cores take bf16 rows with K a multiple of 32 times bf16 weights, or
    /// FP8 ones whose blocks a step of 32 does not straddle (`kernels/linear_mma.cu`; no
    /// staged form: the wide one serves), every other product the CUDA cores.
    fn choose(
        kernel: CudaMatmul,
        [m, n, k]: [usize; 3],
        dtypes: (DType, DType),
        fp8_block_k: Option<usize>,
        tiles: MmaTiles,
    ) -> Self {
        let weights = match (dtypes, fp8_block_k) {
            ((DType::BF16, DType::BF16), _) => true,
            ((DType::BF16, DType::F8E4M3), Some(block_k)) => block_k.is_multiple_of(MMA_STEP),
            _ => false,
        };
        let tensor_cores = kernel == CudaMatmul::Mma && weights && k.is_multiple_of(MMA_STEP);
        let has_staged = dtypes.1 == DType::BF16;
        let staged = m >= STAGED_ROWS && m.div_ceil(STAGED_ROWS) * n.div_ceil(STAGED_ROWS) >= STAGED_BLOCKS;
        match (tensor_cores, tiles, m) {
            (true, MmaTiles::Narrow, _) | (true, MmaTiles::ByBatch, 1..=8) => Self::Mma,
            (true, MmaTiles::Staged, _) if has_staged => Self::MmaStaged,
            (true, MmaTiles::ByBatch, _) if staged && has_staged => Self::MmaStaged,
            (true, _, _) => Self::MmaWide,
            (false, _, 1) => Self::Row,
            (false, _, 2..=LINEAR_ROWS) => Self::Rows,
            (false, _, _) => Self::Wide,
        }
    }

    /// Whether the form's kernel writes SwiGLU's gating itself: the tensor cores' have forms
    /// that do for bf16 weights; after the others, kernels/swiglu.cu gates their sums.
    fn gates(self, output: MatmulOutput, w_dtype: DType) -> bool {
        output == MatmulOutput::Swiglu
            && w_dtype == DType::BF16
            && matches!(self, Self::Mma | Self::MmaWide | Self::MmaStaged)
    }

    fn name(self, x_dtype: &str, w_dtype: &str, gates: bool) -> String {
        let swiglu = if gates { "swiglu_" } else { "" };
        // The tensor cores' kernels are named by their weight where it is not bf16.
        let weight = if w_dtype == "bf16" {
            String::new()
        } else {
            format!("_{w_dtype}")
        };
        match self {
            Self::Row => format!("linear_{x_dtype}_{w_dtype}_row"),
            Self::Rows => format!("linear_{x_dtype}_{w_dtype}"),
            Self::Wide => format!("linear_{x_dtype}_{w_dtype}_wide"),
            Self::Mma => format!("linear_mma_{swiglu}bf16{weight}"),
            Self::MmaWide => format!("linear_mma_{swiglu}bf16{weight}_wide"),
            Self::MmaStaged => format!("linear_mma_{swiglu}bf16_staged"),
        }
    }

    fn module(self) -> Module {
        match self {
            Self::Row | Self::Rows | Self::Wide => Module::Linear,
            Self::Mma | Self::MmaWide | Self::MmaStaged => Module::LinearMma,
        }
    }

    fn warps(self) -> usize {
        match self.module() {
            Module::LinearMma => MMA_WARPS,
            _ => LINEAR_WARPS,
        }
    }

    /// Rows of x and output columns a block covers: the grid's two dimensions. A block that
    /// gates writes a column for each pair of a gate and an up column it sums: the narrow form
    /// 16, as its plain form, the others half their plain forms' columns.
    fn block_tile(self, gates: bool) -> (usize, usize) {
        match self {
            Self::Row => (1, LINEAR_WARPS),
            Self::Rows => (LINEAR_ROWS, LINEAR_WARPS),
            Self::Wide => (LINEAR_ROWS, LINEAR_WIDE_COLUMNS * LINEAR_WARPS),
            Self::Mma => (8, 16),
            Self::MmaWide if gates => (32, 16),
            Self::MmaWide => (32, 32),
            Self::MmaStaged if gates => (STAGED_ROWS, STAGED_ROWS / 2),
            Self::MmaStaged => (STAGED_ROWS, STAGED_ROWS),
        }
    }

    /// Whether the kernel takes FP8 block scales: `kernels/linear.cu`'s do, and
    /// `kernels/linear_mma.cu`'s FP8 forms (`fp8`: the weight is FP8, and so has scales).
    fn takes_scales(self, fp8: bool) -> bool {
        matches!(self, Self::Row | Self::Rows | Self::Wide) || fp8
    }
}

/// An FP8 weight's block scales [ceil(N / bn), ceil(K / bk)] (f32) and its block (bn, bk).
pub(crate) type BlockScales<'a> = ((&'a CudaStorage, &'a Layout), (usize, usize));

/// `x` [M, K] times `w` [N, K] transposed, plus `bias` [N] (in x's dtype) where given, [M, N]
/// in x's dtype, by `kernel` where it takes the product, the tensor cores in `tiles`
/// (`Form::choose`); an FP8 weight with its block scales. With `MatmulOutput::Swiglu`, `w` is
/// a fused gate/up projection (N even, which `InvariantMatmul::apply` checks; the gate's rows
/// first) and the result its gating, [M, N / 2], in one launch where the form gates
/// (`Form::gates`), else in two.
pub(crate) fn linear(
    x: (&CudaStorage, &Layout),
    w: (&CudaStorage, &Layout),
    scales: Option<BlockScales>,
    bias: Option<(&CudaStorage, &Layout)>,
    kernel: CudaMatmul,
    tiles: MmaTiles,
    output: MatmulOutput,
) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "linear";
    let (m, k, n) = matmul_dims(OP, x.1.shape(), w.1.shape())?;
    if k % 8 != 0 {
        return Err(bad_input(
            OP,
            format!("{k} input features: the CUDA kernel reads them 8 at a time"),
        ));
    }
    let (x_dtype, w_dtype) = (x.0.dtype(), w.0.dtype());
    if (x_dtype, w_dtype) == (DType::BF16, DType::F32) {
        return Err(bad_input(
            OP,
            "bf16 activations with an f32 weight: cast the weight to bf16",
        ));
    }
    for (what, l, dtype) in [("x", x.1, x_dtype), ("weight", w.1, w_dtype)] {
        aligned_16(OP, what, l, dtype)?;
    }
    let device = x.0.device.clone();
    if (w_dtype == DType::F8E4M3) != scales.is_some() {
        return Err(bad_input(
            OP,
            "an FP8 weight needs its block scales, and only an FP8 weight has them",
        ));
    }
    if let Some((b, l)) = bias {
        if b.dtype() != x_dtype || l.shape().dims() != [n] {
            return Err(bad_input(
                OP,
                format!(
                    "a bias of {:?} {:?} for {n} outputs of {x_dtype:?}",
                    l.shape(),
                    b.dtype()
                ),
            ));
        }
    }
    let fp8_block_k = scales.map(|(_, (_, block_k))| block_k);
    let form = Form::choose(kernel, [m, n, k], (x_dtype, w_dtype), fp8_block_k, tiles);
    let gates = form.gates(output, w_dtype);
    let name = form.name(dtype_name(OP, x_dtype)?, dtype_name_or_fp8(OP, w_dtype)?, gates);
    let (block_n, block_k) = scales.map_or((1, 8), |(_, block)| block);
    let args = Args {
        func: function(&device, form.module(), &name)?,
        form,
        gates,
        dims: [int(OP, m)?, int(OP, n)?, int(OP, k)?],
        scales: scales.map(|((s, l), _)| view::<f32>(s, l, "scales")).transpose()?,
        block: [int(OP, block_n)?, int(OP, block_k)?],
    };
    let out = by_dtypes_or_fp8!(OP, (x_dtype, w_dtype), launch(x, w, bias, &args))?;
    match output {
        MatmulOutput::Swiglu if !gates => swiglu((&out, &Layout::contiguous((m, n))), m, n / 2),
        MatmulOutput::Swiglu => Ok((out, Shape::from((m, n / 2)))),
        MatmulOutput::Sums => Ok((out, Shape::from((m, n)))),
    }
}

struct Args<'a> {
    func: Kernel,
    form: Form,
    /// The kernel writes SwiGLU's gating of its sums, [M, N / 2].
    gates: bool,
    /// M, N, K.
    dims: [i32; 3],
    scales: Option<CudaView<'a, f32>>,
    /// block_n, block_k of the scales (unread without them).
    block: [i32; 2],
}

fn launch<T: CudaDType + DeviceRepr, W: CudaDType>(
    x: (&CudaStorage, &Layout),
    w: (&CudaStorage, &Layout),
    bias: Option<(&CudaStorage, &Layout)>,
    a: &Args,
) -> Result<CudaStorage> {
    let device = &x.0.device;
    let [m, n, _] = a.dims.map(|d| d as usize);
    let columns = if a.gates { n / 2 } else { n };
    let mut out = output::<T>(device, m * columns)?;
    let xs = view::<T>(x.0, x.1, "x")?;
    let ws = view::<W>(w.0, w.1, "weight")?;
    let bias = bias.map(|(b, l)| view::<T>(b, l, "bias")).transpose()?;
    let mut builder = a.func.builder();
    builder.arg(&mut out).arg(&xs).arg(&ws);
    arg_or_null(&mut builder, bias.as_ref());
    for d in &a.dims {
        builder.arg(d);
    }
    // Only an FP8 weight has scales (`linear` checks).
    if a.form.takes_scales(a.scales.is_some()) {
        arg_or_null(&mut builder, a.scales.as_ref());
        builder.arg(&a.block[0]).arg(&a.block[1]);
    }
    let (block_rows, block_columns) = a.form.block_tile(a.gates);
    let config = LaunchConfig {
        grid_dim: (m.div_ceil(block_rows) as u32, columns.div_ceil(block_columns) as u32, 1),
        block_dim: (32 * a.form.warps() as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: shapes checked above, the bias's against N; K is a multiple of 8 (of 32 for the
    // tensor-core forms, `Form::choose`) and both operands are 16-byte aligned, as the
    // kernels' vector loads need; FP8 scales were checked against the weight and its block
    // (`Fp8Weight::new`), whose width is a multiple of 8 (of 32 for the tensor cores). A gating form's output holds
    // M * N / 2, its kernel writing columns below N / 2 and reading weight rows below N.
    unsafe { builder.launch(config) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, device.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel_of(m: usize, dtypes: (DType, DType), fp8_block_k: Option<usize>, tiles: MmaTiles) -> String {
        let form = Form::choose(CudaMatmul::Mma, [m, 4096, 4096], dtypes, fp8_block_k, tiles);
        let name = |d| dtype_name_or_fp8("test", d).unwrap();
        form.name(name(dtypes.0), name(dtypes.1), false)
    }

    /// FP8 weights take the tensor cores for bf16 rows where a step of 32 lies in one block:
    /// narrow for a few rows, wide for more (their staged requests too); blocks 48 wide, and
    /// f32 rows, the CUDA cores. bf16 weights keep their forms.
    #[test]
    fn fp8_weights_take_the_tensor_cores_where_a_step_lies_in_a_block() {
        let (fp8, bf16) = ((DType::BF16, DType::F8E4M3), (DType::BF16, DType::BF16));
        let cases = [
            (1, fp8, Some(128), MmaTiles::ByBatch, "linear_mma_bf16_f8e4m3"),
            (9, fp8, Some(128), MmaTiles::ByBatch, "linear_mma_bf16_f8e4m3_wide"),
            (2048, fp8, Some(128), MmaTiles::ByBatch, "linear_mma_bf16_f8e4m3_wide"),
            (2048, fp8, Some(128), MmaTiles::Staged, "linear_mma_bf16_f8e4m3_wide"),
            (2048, fp8, Some(128), MmaTiles::Narrow, "linear_mma_bf16_f8e4m3"),
            (1, fp8, Some(48), MmaTiles::ByBatch, "linear_bf16_f8e4m3_row"),
            (
                9,
                (DType::F32, DType::F8E4M3),
                Some(128),
                MmaTiles::ByBatch,
                "linear_f32_f8e4m3_wide",
            ),
            (2048, bf16, None, MmaTiles::ByBatch, "linear_mma_bf16_staged"),
            (1, bf16, None, MmaTiles::ByBatch, "linear_mma_bf16"),
        ];
        for (m, dtypes, block_k, tiles, want) in cases {
            assert_eq!(
                kernel_of(m, dtypes, block_k, tiles),
                want,
                "M = {m}, {dtypes:?}, {block_k:?}, {tiles:?}"
            );
        }
        let wide = Form::choose(CudaMatmul::Mma, [9, 64, 64], fp8, Some(128), MmaTiles::ByBatch);
        assert!(wide.takes_scales(true) && !wide.gates(MatmulOutput::Swiglu, DType::F8E4M3));
        assert!(!wide.takes_scales(false) && wide.gates(MatmulOutput::Swiglu, DType::BF16));
    }
}
