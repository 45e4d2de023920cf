//! Neural networks on candle: the target architectures, one file each behind `TargetModel`,
//! the drafter head, their weight loading, and the ops layer that runs them over a paged KV
//! cache in the flattened batch format (docs/ARCHITECTURE.md).

mod architectures;
pub mod batch;
pub mod checkpoint;
pub mod config;
pub mod cuda_graphs;
mod device_ids;
pub mod drafter;
pub mod drafter_config;
pub mod drafter_graphs;
pub mod error;
pub mod forward_inputs;
mod generation_config;
mod gpt_oss;
#[cfg(feature = "cuda")]
mod graph_capture;
pub mod kv_cache;
pub mod layers;
mod llama;
pub mod ops;
mod placement;
mod qwen3;
mod qwen3_moe;
mod target_model;

pub use architectures::{load_target, supported_architectures, LoadedModel};
pub use batch::{BatchBuilder, ForwardBatch, Rows, SequenceRows};
pub use checkpoint::{Checkpoint, LoadOptions};
pub use config::{ModelDims, TextConfig};
pub use cuda_graphs::{graph_shape, startup_steps, CudaGraphs, GraphLimits, GraphShape, DEFAULT_GRAPH_MAX_ROWS};
pub use device_ids::{DeviceIds, DeviceTokens};
pub use drafter::{DraftHidden, DraftOutput, Drafter, GreedyDrafts};
pub use drafter_config::{DraftAlgorithm, DrafterConfig};
pub use drafter_graphs::{
    draft_shape, draft_startup_steps, padded_pass, DeviceDrafts, DraftInputs, DraftShape, DrafterGraphs, PaddedPass,
    PassHidden, PassRows,
};
pub use error::LoadError;
pub use forward_inputs::{ForwardInputs, RowSelection};
pub use generation_config::{GenerationConfig, SamplingDefaults};
pub use kv_cache::{KvCache, KvCacheDtype};
pub use placement::{DTypeSpec, DeviceSpec};
pub use target_model::{default_capture_layers, ForwardOutput, ForwardStates, TargetModel};
