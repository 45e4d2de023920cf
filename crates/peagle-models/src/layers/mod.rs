//! Building blocks shared by the architectures and the drafter. They compute through `ops`
//! and never choose a device or kernel themselves.

mod attention;
mod decoder_layer;
mod eagle_input_layer;
mod embedding;
mod feed_forward;
mod linear;
mod mlp;
mod moe;
mod residual;
mod rms_norm;
mod rope;

pub use attention::{Attention, AttentionContext, AttentionOptions};
pub use decoder_layer::DecoderLayer;
pub use eagle_input_layer::EagleInputLayer;
pub use embedding::Embedding;
pub use feed_forward::FeedForward;
pub use linear::Linear;
pub use mlp::Mlp;
pub use moe::{dense_on_device, Activation, Moe, MoeConfig};
pub use residual::{Delta, Residual};
pub use rms_norm::RmsNorm;
pub use rope::{RopeTables, RotaryEmbedding};
