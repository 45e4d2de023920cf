//! Rows gathered from two tables in one op: a drafter pass's hidden input, each row from the
//! projected target states or (P-EAGLE's mask slots) the mask state. On a GPU it is one launch
//! (`kernels/gather_rows.cu`), with an upload of the picks unless they came with the forward's
//! inputs (`Indices`), where concatenating the tables and candle's gather would take four
//! operations; on the CPU it is those two candle ops, the kernel's reference.

use crate::error::bad_input;
use crate::indices::Indices;
use candle_core::{Result, Tensor};

/// Row i is row `picks[i]` of `first` [a, cols] where that is below a, else row
/// `picks[i] - a` of `second` [b, cols] (None: no rows past `first`'s); both tables of one
/// dtype on one device. A pick past both tables is an error.
pub fn gather_rows(first: &Tensor, second: Option<&Tensor>, picks: &Indices) -> Result<Tensor> {
    check(first, second, picks.values())?;
    if picks.is_empty() {
        return crate::no_rows(first.dim(1)?, first.dtype(), first.device());
    }
    #[cfg(feature = "cuda")]
    if first.device().is_cuda() {
        return on_the_gpu(first, second, picks, None);
    }
    let table = match second {
        Some(s) => Tensor::cat(&[first, s], 0)?,
        None => first.contiguous()?,
    };
    table.index_select(&Tensor::from_slice(picks.values(), picks.len(), first.device())?, 0)
}

/// `gather_rows` written into `out` [picks, cols], contiguous and of the tables' dtype: on a
/// GPU into its memory, with no buffer of its own and no copy (a CUDA graph's input).
pub fn gather_rows_into(out: &Tensor, first: &Tensor, second: Option<&Tensor>, picks: &Indices) -> Result<()> {
    check(first, second, picks.values())?;
    if out.dims() != [picks.len(), first.dim(1)?]
        || out.dtype() != first.dtype()
        || !out.is_contiguous()
        || !out.device().same_device(first.device())
    {
        return Err(bad_input(
            "gather_rows_into",
            format!(
                "{} rows of {:?} {:?} into a {:?} tensor of {:?} on {:?}",
                picks.len(),
                first.dtype(),
                first.dims(),
                out.dtype(),
                out.dims(),
                out.device().location()
            ),
        ));
    }
    #[cfg(feature = "cuda")]
    if first.device().is_cuda() && !picks.is_empty() {
        return on_the_gpu(first, second, picks, Some(out)).map(|_| ());
    }
    out.slice_set(&gather_rows(first, second, picks)?, 0, 0)
}

/// `kernels/gather_rows.cu` over the tables made contiguous, into `out` or a new tensor.
#[cfg(feature = "cuda")]
fn on_the_gpu(first: &Tensor, second: Option<&Tensor>, picks: &Indices, out: Option<&Tensor>) -> Result<Tensor> {
    let first = first.contiguous()?;
    let second = second.map(Tensor::contiguous).transpose()?;
    crate::cuda::gather_rows(&first, second.as_ref(), picks, out)
}

/// Checks the tables against each other and the picks against the tables.
fn check(first: &Tensor, second: Option<&Tensor>, picks: &[u32]) -> Result<()> {
    const OP: &str = "gather_rows";
    let (a, cols) = first.dims2()?;
    let b = match second {
        None => 0,
        Some(s) => {
            let (b, width) = s.dims2()?;
            if width != cols || s.dtype() != first.dtype() || !s.device().same_device(first.device()) {
                return Err(bad_input(
                    OP,
                    format!(
                        "tables {:?} {:?} and {:?} {:?} differ in width, dtype or device",
                        first.dims(),
                        first.dtype(),
                        s.dims(),
                        s.dtype()
                    ),
                ));
            }
            b
        }
    };
    match picks.iter().find(|&&p| p as usize >= a + b) {
        Some(bad) => Err(bad_input(OP, format!("row {bad} of tables of {a} and {b} rows"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn picks_past_the_first_table_read_the_second() {
        let dev = Device::Cpu;
        let first = Tensor::arange(0f32, 6., &dev).unwrap().reshape((3, 2)).unwrap();
        let second = Tensor::new(&[[10f32, 11.]], &dev).unwrap();
        let got = gather_rows(&first, Some(&second), &Indices::new(&[3, 0, 2, 3])).unwrap();
        assert_eq!(
            got.to_vec2::<f32>().unwrap(),
            [[10., 11.], [0., 1.], [4., 5.], [10., 11.]]
        );
        let got = gather_rows(&first.t().unwrap(), None, &Indices::new(&[1, 1])).unwrap();
        assert_eq!(got.to_vec2::<f32>().unwrap(), [[1., 3., 5.], [1., 3., 5.]]);
        assert_eq!(gather_rows(&first, None, &Indices::new(&[])).unwrap().dims(), [0, 2]);
        let err = gather_rows(&first, Some(&second), &Indices::new(&[4]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("row 4 of tables of 3 and 1 rows"), "{err}");
        let other = second.to_dtype(DType::BF16).unwrap();
        assert!(gather_rows(&first, Some(&other), &Indices::new(&[0])).is_err());

        // Into a tensor that exists: the same rows, and a tensor of another shape refused.
        let out = Tensor::zeros((2, 2), DType::F32, &dev).unwrap();
        gather_rows_into(&out, &first, Some(&second), &Indices::new(&[3, 1])).unwrap();
        assert_eq!(out.to_vec2::<f32>().unwrap(), [[10., 11.], [2., 3.]]);
        assert!(gather_rows_into(&out, &first, None, &Indices::new(&[1])).is_err());
    }
}
