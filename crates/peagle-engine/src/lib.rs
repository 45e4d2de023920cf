//! Requests to tokens: KV block management, sequences, sampling, detokenization and the
//! generation loop on top of the model runtime.

pub mod block_manager;
pub mod detokenizer;
pub mod engine;
pub mod generator;
pub mod logit_rows;
pub mod logprobs;
pub mod model_runner;
pub mod nucleus;
pub mod penalties;
pub mod proposer;
pub mod rejection_sampler;
pub mod sampler;
pub mod scheduler;
pub mod sequence;
pub mod spec_stats;
pub mod speculation_policy;
pub mod step_times;
pub mod top_tokens;
pub mod verifier;

pub use block_manager::{BlockManager, OutOfBlocks};
pub use detokenizer::{special_token_ids, IncrementalDecoder};
pub use engine::{EngineConfig, EngineHandle, EngineMetrics, Event, Request, SubmitError};
pub use generator::{DraftOptions, GenerateError, GenerateOutput, Generator, GeneratorOptions};
pub use model_runner::{CacheConfig, ModelRunner, SpeculativeConfig, Work};
pub use penalties::Penalties;
pub use rejection_sampler::{rejection_sample, Verified, Window};
pub use sampler::{Sampler, SamplingParams};
pub use scheduler::SchedulerConfig;
pub use sequence::{FinishReason, GenerateParams, Sequence, TokenOutput};
pub use spec_stats::SpecStats;
pub use step_times::StepTimes;
pub use verifier::{verify, Verdict};
