//! Requests to tokens: KV block management, sequences, sampling, detokenization and the
//! generation loop on top of the model runtime.

pub mod block_manager;
pub mod detokenizer;
pub mod generator;
pub mod sampler;
pub mod sequence;

pub use block_manager::{BlockManager, OutOfBlocks};
pub use detokenizer::IncrementalDecoder;
pub use generator::{FinishReason, GenerateError, GenerateOutput, GenerateParams, Generator, GeneratorOptions};
pub use sampler::{Sampler, SamplingParams};
pub use sequence::Sequence;
