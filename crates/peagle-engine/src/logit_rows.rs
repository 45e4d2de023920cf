//! Rows of a step's logits tensor on the host, without copying the rows nobody reads.

use candle_core::{DType, Result, Storage, Tensor};
use std::ops::Range;
use std::slice::ChunksExact;

/// Calls `f` with rows `rows` of `logits` ([rows, vocab]), in order: the tensor's own memory
/// when it is a contiguous f32 tensor on the CPU, else a copy of those rows alone (narrowed,
/// then brought to the host).
pub fn with_rows<T>(logits: &Tensor, rows: Range<usize>, f: impl FnOnce(ChunksExact<'_, f32>) -> T) -> Result<T> {
    let (count, vocab) = logits.dims2()?;
    if rows.start > rows.end || rows.end > count {
        candle_core::bail!("logits rows {rows:?} out of {count}");
    }
    if host_readable(logits) {
        let (storage, layout) = logits.storage_and_layout();
        if let (Storage::Cpu(cpu), Some((offset, _))) = (&*storage, layout.contiguous_offsets()) {
            let data = cpu.as_slice::<f32>()?;
            return Ok(f(
                data[offset + rows.start * vocab..offset + rows.end * vocab].chunks_exact(vocab)
            ));
        }
    }
    let copied: Vec<f32> = logits
        .narrow(0, rows.start, rows.len())?
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1()?;
    Ok(f(copied.chunks_exact(vocab)))
}

/// Whether the host reads the tensor's elements in place: a contiguous f32 tensor on the CPU.
/// Any other costs a copy of the rows read.
pub fn host_readable(logits: &Tensor) -> bool {
    let (storage, layout) = logits.storage_and_layout();
    matches!(&*storage, Storage::Cpu(cpu) if cpu.as_slice::<f32>().is_ok()) && layout.is_contiguous()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn rows_read_in_place_or_copied_are_the_same() {
        let values: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let logits = Tensor::from_vec(values, (6, 4), &Device::Cpu).unwrap();
        let read = |t: &Tensor| with_rows(t, 2..4, |rows| rows.flatten().copied().collect::<Vec<f32>>()).unwrap();
        let expected: Vec<f32> = (8..16).map(|v| v as f32).collect();
        assert_eq!(read(&logits), expected);
        // A view one row in is read in place from its offset; a strided view and bf16 are copied.
        assert_eq!(
            read(&logits.narrow(0, 1, 5).unwrap()),
            (12..20).map(|v| v as f32).collect::<Vec<_>>()
        );
        let strided = logits.t().unwrap().contiguous().unwrap().t().unwrap();
        assert_eq!(read(&strided), expected);
        assert_eq!(read(&logits.to_dtype(DType::BF16).unwrap()), expected);
        assert!(with_rows(&logits, 5..7, |_| ()).is_err());
    }
}
