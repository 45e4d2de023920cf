use candle_core::{DType, Result, Tensor};

/// Token embedding table; rows are gathered then cast to f32 (exact for bf16 tables).
pub struct Embedding {
    table: Tensor,
}

impl Embedding {
    pub fn new(table: Tensor) -> Self {
        Self { table }
    }

    pub fn table(&self) -> &Tensor {
        &self.table
    }

    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.table.index_select(ids, 0)?.to_dtype(DType::F32)
    }
}
