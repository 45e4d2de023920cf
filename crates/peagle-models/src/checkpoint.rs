//! Memory-mapped safetensors weights of one model directory, single-file or sharded.

use crate::error::LoadError;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use peagle_kernels::Fp8Weight;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// How weights are materialised.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub device: Device,
    /// Dtype of activations. The CPU kernels compute in f32.
    pub dtype: DType,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            dtype: DType::F32,
        }
    }
}

pub struct Checkpoint {
    dir: PathBuf,
    files: Vec<(PathBuf, MmapedSafetensors)>,
    /// Tensor name to index in `files`.
    index: HashMap<String, usize>,
    /// Tensors held in memory instead of files: a drafter being trained, whose weights are
    /// variables the model must share rather than copy.
    memory: HashMap<String, Tensor>,
    options: LoadOptions,
    /// The scale blocks of a block-scaled FP8 checkpoint (`TextConfig::fp8_weight_blocks`).
    fp8_blocks: Option<(usize, usize)>,
}

impl Checkpoint {
    /// Opens `model.safetensors.index.json` and its shards when present, else `model.safetensors`.
    pub fn open(dir: &Path, options: LoadOptions) -> Result<Self, LoadError> {
        let index_path = dir.join("model.safetensors.index.json");
        let paths = if index_path.exists() {
            shard_paths(dir, &index_path)?
        } else {
            vec![dir.join("model.safetensors")]
        };
        let mut files = Vec::with_capacity(paths.len());
        let mut index = HashMap::new();
        for path in paths {
            if !path.exists() {
                return Err(LoadError::MissingFile {
                    what: "weights file",
                    path,
                });
            }
            // SAFETY: the mapping is read-only; as with every mmap loader, the file must not be
            // truncated while the model is loaded.
            let st = unsafe { MmapedSafetensors::new(&path) }.map_err(|source| LoadError::Candle {
                context: format!("cannot map {}", path.display()),
                source,
            })?;
            for (name, _) in st.tensors() {
                index.insert(name, files.len());
            }
            files.push((path, st));
        }
        Ok(Self {
            dir: dir.to_owned(),
            files,
            index,
            memory: HashMap::new(),
            options,
            fp8_blocks: None,
        })
    }

    /// The checkpoint with FP8 weights in scale blocks of `blocks` (rows, columns).
    pub fn with_fp8_blocks(self, blocks: Option<(usize, usize)>) -> Self {
        Self {
            fp8_blocks: blocks,
            ..self
        }
    }

    /// A checkpoint over tensors already in memory; `origin` names them in errors.
    pub fn from_tensors(origin: &Path, tensors: HashMap<String, Tensor>, options: LoadOptions) -> Self {
        Self {
            dir: origin.to_owned(),
            files: Vec::new(),
            index: HashMap::new(),
            memory: tensors,
            options,
            fp8_blocks: None,
        }
    }

    pub fn device(&self) -> &Device {
        &self.options.device
    }

    /// The activation dtype the weights are loaded for.
    pub fn dtype(&self) -> DType {
        self.options.dtype
    }

    /// Every tensor's name, in no particular order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().chain(self.memory.keys()).map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name) || self.memory.contains_key(name)
    }

    /// A weight matrix for the matmul kernels. bf16 weights stay bf16 on the CPU: the kernels
    /// upcast them exactly, so results equal f32 weights at half the memory traffic.
    pub fn matrix(&self, name: &str, shape: &[usize]) -> Result<Tensor, LoadError> {
        self.load(name, shape, |stored| match (stored, &self.options.device) {
            (DType::BF16, Device::Cpu) => DType::BF16,
            _ => self.options.dtype,
        })
    }

    /// `name` [out, in] as a block-scaled FP8 weight with its `{name}_scale_inv`, kept in FP8
    /// on the device; None when the checkpoint stores `name` in another dtype.
    pub fn fp8_matrix(&self, name: &str, shape: &[usize]) -> Result<Option<Fp8Weight>, LoadError> {
        if self.memory.contains_key(name) {
            return Ok(None);
        }
        let (file, st) = self.file_of(name)?;
        let candle = |context: String| move |source| LoadError::Candle { context, source };
        let view = st
            .get(name)
            .map_err(candle(format!("tensor {name} in {}", file.display())))?;
        if view.dtype() != safetensors::Dtype::F8_E4M3 {
            return Ok(None);
        }
        let Some(blocks) = self.fp8_blocks else {
            return Err(LoadError::InvalidTensor {
                name: name.to_owned(),
                msg: "stored in FP8, but config.json has no quantization_config of quant_method \"fp8\"".into(),
            });
        };
        check_shape(name, file, view.shape(), shape)?;
        let weight = st
            .load(name, &self.options.device)
            .map_err(candle(format!("loading tensor {name} from {}", file.display())))?;
        let scales_name = format!("{name}_scale_inv");
        let scales_shape = [shape[0].div_ceil(blocks.0), shape[1].div_ceil(blocks.1)];
        let scales = self.load(&scales_name, &scales_shape, |_| DType::F32)?;
        Fp8Weight::new(weight, scales, blocks)
            .map(Some)
            .map_err(candle(format!("{name} and its scales")))
    }

    /// A tensor in the activation dtype (norm weights, biases, embeddings).
    pub fn vector(&self, name: &str, shape: &[usize]) -> Result<Tensor, LoadError> {
        self.load(name, shape, |_| self.options.dtype)
    }

    /// A u8 tensor as stored (MXFP4 blocks and scales), on the host whatever the device: its
    /// users repack it there before any upload. (A slice of a CUDA tensor copied back with
    /// candle's `to_vec1` brings the whole tensor along, once per expert.)
    pub fn bytes(&self, name: &str, shape: &[usize]) -> Result<Tensor, LoadError> {
        self.load_on(&Device::Cpu, name, shape, |_| DType::U8)
    }

    /// An int64 tensor (index maps such as `d2t`), as stored.
    pub fn int64(&self, name: &str, shape: &[usize]) -> Result<Tensor, LoadError> {
        self.load(name, shape, |_| DType::I64)
    }

    pub fn shape_of(&self, name: &str) -> Result<Vec<usize>, LoadError> {
        if let Some(t) = self.memory.get(name) {
            return Ok(t.dims().to_vec());
        }
        let (file, st) = self.file_of(name)?;
        let view = st.get(name).map_err(|source| LoadError::Candle {
            context: format!("tensor {name} in {}", file.display()),
            source,
        })?;
        Ok(view.shape().to_vec())
    }

    /// Loads `name` after checking its shape; `dtype` maps the stored dtype to the one wanted.
    /// Float tensors must be stored as F32/BF16/F16, integer ones as I64, bytes as U8.
    fn load(&self, name: &str, shape: &[usize], dtype: impl Fn(DType) -> DType) -> Result<Tensor, LoadError> {
        self.load_on(&self.options.device, name, shape, dtype)
    }

    /// `load` onto `device`.
    fn load_on(
        &self,
        device: &Device,
        name: &str,
        shape: &[usize],
        dtype: impl Fn(DType) -> DType,
    ) -> Result<Tensor, LoadError> {
        if let Some(t) = self.memory.get(name) {
            return self.load_from_memory(name, t, shape, dtype(t.dtype()), device);
        }
        let (file, st) = self.file_of(name)?;
        let view = st.get(name).map_err(|source| LoadError::Candle {
            context: format!("tensor {name} in {}", file.display()),
            source,
        })?;
        let stored = match view.dtype() {
            safetensors::Dtype::F32 => Some(DType::F32),
            safetensors::Dtype::BF16 => Some(DType::BF16),
            safetensors::Dtype::F16 => Some(DType::F16),
            safetensors::Dtype::I64 => Some(DType::I64),
            safetensors::Dtype::U8 => Some(DType::U8),
            _ => None,
        };
        // Bytes stay bytes, integers integers and floats floats.
        let wanted = match stored.map(|s| (s, dtype(s))) {
            Some((DType::U8, DType::U8)) => Some(DType::U8),
            Some((s, w)) if s != DType::U8 && w != DType::U8 && s.is_int() == w.is_int() => Some(w),
            _ => None,
        };
        let Some(wanted) = wanted else {
            return Err(LoadError::UnsupportedDtype {
                name: name.to_owned(),
                file: file.clone(),
                dtype: format!("{:?}", view.dtype()),
            });
        };
        check_shape(name, file, view.shape(), shape)?;
        st.load(name, device)
            .and_then(|t| t.to_dtype(wanted))
            .map_err(|source| LoadError::Candle {
                context: format!("loading tensor {name} from {}", file.display()),
                source,
            })
    }

    /// Same-dtype conversion and a move to its own device are no-ops in candle, so a variable
    /// stays the variable.
    fn load_from_memory(
        &self,
        name: &str,
        t: &Tensor,
        shape: &[usize],
        wanted: DType,
        device: &Device,
    ) -> Result<Tensor, LoadError> {
        if t.dims() != shape {
            return Err(LoadError::ShapeMismatch {
                name: name.to_owned(),
                file: self.dir.clone(),
                expected: shape.to_vec(),
                found: t.dims().to_vec(),
            });
        }
        t.to_dtype(wanted)
            .and_then(|t| t.to_device(device))
            .map_err(|source| LoadError::Candle {
                context: format!("converting tensor {name}"),
                source,
            })
    }

    fn file_of(&self, name: &str) -> Result<&(PathBuf, MmapedSafetensors), LoadError> {
        self.index
            .get(name)
            .map(|i| &self.files[*i])
            .ok_or_else(|| LoadError::MissingTensor {
                name: name.to_owned(),
                dir: self.dir.clone(),
            })
    }
}

fn check_shape(name: &str, file: &Path, found: &[usize], expected: &[usize]) -> Result<(), LoadError> {
    if found == expected {
        return Ok(());
    }
    Err(LoadError::ShapeMismatch {
        name: name.to_owned(),
        file: file.to_owned(),
        expected: expected.to_vec(),
        found: found.to_vec(),
    })
}

fn shard_paths(dir: &Path, index_path: &Path) -> Result<Vec<PathBuf>, LoadError> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: HashMap<String, String>,
    }
    let text = std::fs::read_to_string(index_path).map_err(|source| LoadError::Io {
        path: index_path.to_owned(),
        source,
    })?;
    let index: Index = serde_json::from_str(&text).map_err(|source| LoadError::Json {
        path: index_path.to_owned(),
        source,
    })?;
    let mut shards: Vec<&String> = index.weight_map.values().collect();
    shards.sort();
    shards.dedup();
    Ok(shards.into_iter().map(|s| dir.join(s)).collect())
}
