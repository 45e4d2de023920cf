//! The PTX of each `kernels/*.cu`, one build per virtual architecture, and the loading of the
//! newest one a device runs.

use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaStream, LaunchArgs};
use candle_core::cuda_backend::{CudaDevice, DeviceId, WrapErr};
use candle_core::Result;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// One `kernels/*.cu` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Module {
    Argmax,
    GatherRows,
    GumbelSample,
    KvWrite,
    Linear,
    LinearMma,
    Moe,
    MoeDense,
    MoeMxfp4,
    MoeMxfp4Mma,
    PagedAttention,
    RmsNorm,
    Rope,
    RowCandidates,
    Swiglu,
    TokenMask,
}

/// The compute capability each PTX build needs, oldest first, as build.rs's `ARCHES`.
const ARCH_MAJORS: [i32; 3] = [8, 9, 10];

macro_rules! ptx {
    ($stem:literal) => {
        (
            $stem,
            [
                include_str!(concat!(env!("OUT_DIR"), "/", $stem, ".compute_80.ptx")),
                include_str!(concat!(env!("OUT_DIR"), "/", $stem, ".compute_90.ptx")),
                include_str!(concat!(env!("OUT_DIR"), "/", $stem, ".compute_100.ptx")),
            ],
        )
    };
}

impl Module {
    fn sources(self) -> (&'static str, [&'static str; 3]) {
        match self {
            Self::Argmax => ptx!("argmax"),
            Self::GatherRows => ptx!("gather_rows"),
            Self::GumbelSample => ptx!("gumbel_sample"),
            Self::KvWrite => ptx!("kv_write"),
            Self::Linear => ptx!("linear"),
            Self::LinearMma => ptx!("linear_mma"),
            Self::Moe => ptx!("moe"),
            Self::MoeDense => ptx!("moe_dense"),
            Self::MoeMxfp4 => ptx!("moe_mxfp4"),
            Self::MoeMxfp4Mma => ptx!("moe_mxfp4_mma"),
            Self::PagedAttention => ptx!("paged_attention"),
            Self::RmsNorm => ptx!("rms_norm"),
            Self::Rope => ptx!("rope"),
            Self::RowCandidates => ptx!("row_candidates"),
            Self::Swiglu => ptx!("swiglu"),
            Self::TokenMask => ptx!("token_mask"),
        }
    }
}

/// A loaded kernel and the device stream it launches on.
pub(crate) struct Kernel {
    func: CudaFunction,
    stream: Arc<CudaStream>,
}

impl Kernel {
    pub(crate) fn builder(&self) -> LaunchArgs<'_> {
        self.stream.launch_builder(&self.func)
    }
}

/// The kernels each device has looked up, by module and name: a launch asks the driver for
/// its kernel (the device's architecture, the module, the function in it) only the first time,
/// not at each of a decode step's hundreds of launches. Kept for the process, as candle keeps
/// the modules.
type Loaded = HashMap<(DeviceId, Module), HashMap<String, CudaFunction>>;

fn loaded() -> MutexGuard<'static, Loaded> {
    static LOADED: OnceLock<Mutex<Loaded>> = OnceLock::new();
    let loaded = LOADED.get_or_init(Default::default);
    loaded.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Kernel `name` of `module`, compiled by the driver from the newest PTX the device runs.
pub(crate) fn function(device: &CudaDevice, module: Module, name: &str) -> Result<Kernel> {
    let key = (device.id(), module);
    let known = loaded().get(&key).and_then(|functions| functions.get(name)).cloned();
    let func = match known {
        Some(func) => func,
        None => {
            let func = load(device, module, name)?;
            loaded().entry(key).or_default().insert(name.to_owned(), func.clone());
            func
        }
    };
    Ok(Kernel {
        func,
        stream: device.cuda_stream(),
    })
}

fn load(device: &CudaDevice, module: Module, name: &str) -> Result<CudaFunction> {
    let major = device
        .cuda_stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        .w()?;
    let (stem, ptx) = module.sources();
    let newest = ARCH_MAJORS.iter().rposition(|m| *m <= major).ok_or_else(|| {
        candle_core::Error::Cuda(
            format!("a GPU of compute capability {major}.x: peagle's kernels need 8.0 or newer").into(),
        )
    })?;
    let arch = ARCH_MAJORS[newest];
    let func = device.get_or_load_custom_func(name, &format!("peagle_{stem}_sm{arch}x"), ptx[newest])?;
    Ok(func.into_cuda_function())
}
