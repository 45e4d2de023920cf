use candle_core::{DType, Result, Tensor};

/// Token embedding table; rows are gathered then cast to the activation dtype (exact from a
/// bf16 table to f32, the CPU's).
pub struct Embedding {
    table: Tensor,
    dtype: DType,
}

impl Embedding {
    pub fn new(table: Tensor, dtype: DType) -> Self {
        Self { table, dtype }
    }

    pub fn table(&self) -> &Tensor {
        &self.table
    }

    /// The dtype of the activations it makes.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.table.index_select(ids, 0)?.to_dtype(self.dtype)
    }
}
