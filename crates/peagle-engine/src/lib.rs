//! Requests to tokens: the engine and its step (scheduling over paged KV blocks, the target
//! forward, sampling and verification, drafting), sequences, detokenization, and the ways to
//! drive it: a thread for the server, a generator for one prompt at a time.

mod adjustments;
pub mod block_manager;
pub mod builder;
pub mod detokenizer;
mod device_adjustments;
mod device_choices;
mod drafting;
pub mod engine;
pub mod engine_metrics;
pub mod error;
pub mod generator;
pub mod handle;
pub mod kv_budget;
pub mod logit_rows;
pub mod logprobs;
mod model_runner;
pub mod nucleus;
pub mod penalties;
pub mod prefix_cache;
pub mod proposer;
pub mod rejection_sampler;
pub mod request;
pub mod sampler;
pub mod sampling_params;
pub mod scheduler;
pub mod sequence;
pub mod spec_stats;
pub mod speculation_policy;
pub mod step_times;
pub mod top_tokens;
mod verification;
pub mod verifier;
pub mod window;

pub use block_manager::{BlockManager, OutOfBlocks};
pub use builder::{BuiltEngine, DraftModel, EngineBuilder, GenerationDefaults, DEFAULT_K};
pub use detokenizer::{special_token_ids, IncrementalDecoder};
pub use engine::Engine;
pub use engine_metrics::EngineMetrics;
pub use error::{GenerateError, SubmitError};
pub use generator::{GenerateOutput, Generator, GeneratorOptions};
pub use handle::EngineHandle;
pub use kv_budget::DEFAULT_GPU_MEMORY_UTILIZATION;
pub use penalties::Penalties;
pub use rejection_sampler::{rejection_sample, Verified};
pub use request::{Event, FinishReason, GenerateParams, InvalidRequest, Request, TokenOutput};
pub use sampler::Sampler;
pub use sampling_params::{InvalidSampling, SamplingParams};
pub use scheduler::{SchedulerConfig, Work};
pub use sequence::Sequence;
pub use spec_stats::SpecStats;
pub use step_times::StepTimes;
pub use verifier::{verify, Verdict};
pub use window::Window;
