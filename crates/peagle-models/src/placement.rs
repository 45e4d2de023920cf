//! Where a process computes: the device and activation dtype, chosen once from its options
//! and fixed in the `LoadOptions` every model and cache is built with.

use crate::checkpoint::LoadOptions;
use crate::error::LoadError;
use candle_core::{DType, Device};
use std::fmt;
use std::str::FromStr;

/// A device by name: `auto`, `cpu`, `cuda` (GPU 0) or `cuda:N`. `auto` is GPU 0 where the
/// build has CUDA and the driver sees a GPU, else the CPU: a GPU host serves on its GPU, as
/// vLLM does, and a build without CUDA, or a host whose driver finds no GPU, on the CPU. A
/// driver that fails otherwise is an error, not a quiet fall back to the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    #[default]
    Auto,
    Cpu,
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            None if s == "auto" => Ok(Self::Auto),
            None if s == "cpu" => Ok(Self::Cpu),
            None if s == "cuda" => Ok(Self::Cuda(0)),
            Some(("cuda", n)) => n
                .parse()
                .map(Self::Cuda)
                .map_err(|_| format!("bad GPU number in {s:?}")),
            _ => Err(format!("unknown device {s:?}: expected auto, cpu, cuda or cuda:N")),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl DeviceSpec {
    pub fn open(self) -> Result<Device, LoadError> {
        match self {
            Self::Auto => match peagle_kernels::cuda_devices() {
                Ok(0) => {
                    tracing::info!("device auto: no GPU, running on the CPU");
                    Ok(Device::Cpu)
                }
                Ok(gpus) => {
                    tracing::info!("device auto: running on cuda:0 of {gpus} GPUs");
                    open_gpu(0, "").map_err(|e| {
                        LoadError::Placement(format!(
                            "device auto chose cuda:0 of {gpus} GPUs: {e}; --device cpu runs on the CPU"
                        ))
                    })
                }
                Err(e) => Err(LoadError::Placement(format!(
                    "device auto: the CUDA driver fails ({e}); --device cpu runs on the CPU"
                ))),
            },
            Self::Cpu => Ok(Device::Cpu),
            Self::Cuda(n) => {
                open_gpu(n, " (CUDA needs a GPU and a build with the cuda feature)").map_err(LoadError::Placement)
            }
        }
    }
}

/// GPU `n`, ready for a model; `hint` follows the driver's error where it cannot be opened.
fn open_gpu(n: usize, hint: &str) -> Result<Device, String> {
    // The matmul kernel a GPU process keeps to, checked before anything loads.
    peagle_kernels::CudaMatmul::chosen()?;
    peagle_kernels::open_cuda(n).map_err(|e| format!("cannot open cuda:{n}: {e}{hint}"))
}

/// The dtype activations are computed in; `auto` is f32 on the CPU and bf16 on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DTypeSpec {
    #[default]
    Auto,
    F32,
    Bf16,
    F16,
}

impl FromStr for DTypeSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "f32" | "float32" => Ok(Self::F32),
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "f16" | "float16" => Ok(Self::F16),
            _ => Err(format!("unknown dtype {s:?}: expected auto, f32, bf16 or f16")),
        }
    }
}

impl fmt::Display for DTypeSpec {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
        })
    }
}

impl DTypeSpec {
    /// The dtype on `device`. The CPU kernels compute in f32 (bf16 weights stay bf16 in
    /// memory and are widened exactly as they are read), so the CPU takes nothing else.
    pub fn resolve(self, device: &Device) -> Result<DType, LoadError> {
        match (self, device.is_cpu()) {
            (Self::Auto | Self::F32, true) => Ok(DType::F32),
            (Self::Auto, false) | (Self::Bf16, false) => Ok(DType::BF16),
            (Self::F32, false) => Ok(DType::F32),
            (Self::F16, false) => Ok(DType::F16),
            (other, true) => Err(LoadError::Placement(format!(
                "dtype {other} on the CPU: the CPU kernels compute in f32 (bf16 weights are read as they are stored)"
            ))),
        }
    }
}

impl LoadOptions {
    /// Opens the device and resolves the dtype: the one place both are chosen.
    pub fn place(device: DeviceSpec, dtype: DTypeSpec) -> Result<Self, LoadError> {
        let device = device.open()?;
        let dtype = dtype.resolve(&device)?;
        Ok(Self { device, dtype })
    }

    /// `place` for training: gradients, the optimizer and the loss are computed in f32, so
    /// that is what `auto` means here, and no other dtype is taken.
    pub fn for_training(device: DeviceSpec, dtype: DTypeSpec) -> Result<Self, LoadError> {
        if !matches!(dtype, DTypeSpec::Auto | DTypeSpec::F32) {
            return Err(LoadError::Placement(format!(
                "dtype {dtype} for training: the trainer computes in f32"
            )));
        }
        Self::place(device, DTypeSpec::F32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse_and_print() {
        assert_eq!("auto".parse(), Ok(DeviceSpec::Auto));
        assert_eq!(DeviceSpec::default().to_string(), "auto");
        assert_eq!("cpu".parse(), Ok(DeviceSpec::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceSpec::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceSpec::Cuda(3)));
        assert_eq!(DeviceSpec::Cuda(3).to_string(), "cuda:3");
        assert!("cuda:x".parse::<DeviceSpec>().unwrap_err().contains("GPU number"));
        assert!("tpu".parse::<DeviceSpec>().unwrap_err().contains("expected auto, cpu"));
    }

    #[test]
    fn the_cpu_computes_in_f32() {
        let cpu = LoadOptions::place(DeviceSpec::Cpu, DTypeSpec::Auto).unwrap();
        assert_eq!(cpu.dtype, DType::F32);
        assert_eq!(DTypeSpec::F32.resolve(&Device::Cpu).unwrap(), DType::F32);
        let err = DTypeSpec::Bf16.resolve(&Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("compute in f32"), "{err}");
        assert_eq!("bfloat16".parse(), Ok(DTypeSpec::Bf16));
        assert!("int8".parse::<DTypeSpec>().is_err());
    }

    #[test]
    fn training_takes_f32_only() {
        let err = LoadOptions::for_training(DeviceSpec::Cpu, DTypeSpec::Bf16).unwrap_err();
        assert!(err.to_string().contains("computes in f32"), "{err}");
        let auto = LoadOptions::for_training(DeviceSpec::Cpu, DTypeSpec::Auto).unwrap();
        assert_eq!(auto.dtype, DType::F32);
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_is_one_clear_error() {
        let err = DeviceSpec::Cuda(0).open().unwrap_err().to_string();
        assert!(err.starts_with("cannot open cuda:0") && !err.contains('\n'), "{err}");
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn auto_without_cuda_is_the_cpu() {
        let placed = LoadOptions::place(DeviceSpec::Auto, DTypeSpec::Auto).unwrap();
        assert!(placed.device.is_cpu());
        assert_eq!(placed.dtype, DType::F32);
    }
}
