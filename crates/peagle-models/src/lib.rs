//! Neural networks on candle: target architectures and their weight loading, run over a paged
//! KV cache in the flattened batch format (see DESIGN.md section 2).

pub mod batch;
pub mod checkpoint;
pub mod config;
pub mod drafter;
pub mod drafter_config;
pub mod error;
pub mod kv_cache;
pub mod layers;
mod llama;
mod model;
mod qwen3;
pub mod transformer;

pub use batch::{BatchBuilder, ForwardBatch, Rows, SequenceRows};
pub use checkpoint::{Checkpoint, LoadOptions};
pub use config::TextConfig;
pub use drafter::{DraftHidden, DraftOutput, Drafter};
pub use drafter_config::{DraftAlgorithm, DrafterConfig};
pub use error::LoadError;
pub use kv_cache::{KvCache, KvCacheDtype};
pub use model::{load_causal_lm, GenerationConfig, LoadedModel, SamplingDefaults, SUPPORTED_ARCHITECTURES};
pub use transformer::{default_capture_layers, CausalLm, ForwardOutput, ModelDims};
