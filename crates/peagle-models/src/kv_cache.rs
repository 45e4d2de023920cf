//! The paged KV cache: per layer, one key and one value tensor of `num_blocks * block_size`
//! slots. Which blocks belong to which sequence is the engine's business (its block manager);
//! the cache only stores rows.

use crate::transformer::ModelDims;
use candle_core::{DType, Device, Result, Tensor};

pub struct LayerKv {
    /// [num_blocks * block_size, kv_heads * head_dim]
    pub k: Tensor,
    pub v: Tensor,
}

pub struct KvCache {
    layers: Vec<LayerKv>,
    block_size: usize,
    num_blocks: usize,
}

impl KvCache {
    pub fn new(dims: &ModelDims, num_blocks: usize, block_size: usize, device: &Device) -> Result<Self> {
        let width = dims.num_kv_heads * dims.head_dim;
        let layers = (0..dims.num_layers)
            .map(|_| {
                Ok(LayerKv {
                    k: Tensor::zeros((num_blocks * block_size, width), DType::F32, device)?,
                    v: Tensor::zeros((num_blocks * block_size, width), DType::F32, device)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            layers,
            block_size,
            num_blocks,
        })
    }

    /// Bytes one block takes across all layers, for sizing the cache from a memory budget.
    pub fn bytes_per_block(dims: &ModelDims, block_size: usize) -> usize {
        2 * dims.num_layers * block_size * dims.num_kv_heads * dims.head_dim * std::mem::size_of::<f32>()
    }

    pub fn layer(&self, i: usize) -> &LayerKv {
        &self.layers[i]
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }
}
