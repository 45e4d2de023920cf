//! Weight formats. Each format is one variant; `ops::linear` knows how to multiply by each.

use candle_core::{Result, Tensor};
use peagle_kernels::{Fp8Weight, Mxfp4Weight, PackedWeight};

/// A linear layer's weight [out, in].
pub enum Weight {
    /// As loaded: weights that training updates (variables, or fused from them), and weights
    /// on devices without a packed format. candle's matmul.
    Plain(Tensor),
    /// A CPU inference weight, f32 or bf16, held only in the batch-invariant kernel's layout.
    Packed(PackedWeight),
    /// MXFP4 blocks and scales as the checkpoint stores them (gpt-oss's experts), dequantized
    /// only as the kernel reads them. CPU inference.
    Mxfp4(Mxfp4Weight),
    /// Block-scaled FP8 (e4m3) as the checkpoint stores it, on the CPU or a GPU, each value
    /// scaled as the kernel reads it.
    Fp8(Fp8Weight),
}

impl Weight {
    /// The format `ops::linear` runs fastest for this tensor's device and use.
    pub fn new(w: Tensor) -> Result<Self> {
        if w.device().is_cpu() && !w.track_op() {
            Ok(Self::Packed(PackedWeight::new(&w)?))
        } else {
            Ok(Self::Plain(w))
        }
    }

    /// The weight [out, in] as a plain tensor (unpacked from the kernel's layout on the CPU).
    pub fn to_tensor(&self) -> Result<Tensor> {
        match self {
            Self::Plain(w) => Ok(w.clone()),
            Self::Packed(p) => p.unpack(),
            Self::Mxfp4(m) => m.dequantize(&candle_core::Device::Cpu),
            Self::Fp8(f) => f.dequantize(),
        }
    }
}
