//! The value side of attention: each output column is one fused multiply-add chain
//! `Σ_j weights[j] * values[j]` over the keys in order, so every instruction set and every way
//! of grouping heads or columns gives the same bits. (Fused, not a multiply and then an add:
//! half the instructions, 6% off a 16-sequence attention call. The portable loop's `mul_add`
//! is a libm call on x86 without FMA, but there it only serves CPUs without AVX2 and head
//! sizes that are not a multiple of 8.)
//!
//! The query heads that share a key head also share its values: `value_sums` runs them
//! together, so each value is loaded and widened once for all of them. The sums stay in
//! registers across the keys (writing them back after every key cost more than the
//! multiplies).

use crate::cache_element::CacheElement;
use crate::head_rows::HeadRows;
use crate::isa::Isa;

/// Accumulator registers a pass over the keys keeps: `H` heads times `N` vectors of columns.
/// Eight leave AVX2's other registers for a row of values and a broadcast weight.
const ACCUMULATORS: usize = 8;

/// `outs[h][col] = Σ_j weights[h][j] * values.row(j)[col]` for `H` heads reading the same
/// values; every `outs[h]` is `head_dim` wide and every `weights[h]` has one weight per row.
pub fn value_sums<T: CacheElement, const H: usize>(outs: [&mut [f32]; H], weights: [&[f32]; H], values: HeadRows<T>) {
    value_sums_on(Isa::detected(), outs, weights, values)
}

/// Calls the `$isa` kernel for the runtime count of vectors per head.
macro_rules! dispatch {
    ($isa:ident, $vectors:expr, $outs:expr, $weights:expr, $values:expr, $col:expr) => {
        match $vectors {
            8 => $isa::<_, H, 8>($outs, $weights, $values, $col),
            4 => $isa::<_, H, 4>($outs, $weights, $values, $col),
            2 => $isa::<_, H, 2>($outs, $weights, $values, $col),
            _ => $isa::<_, H, 1>($outs, $weights, $values, $col),
        }
    };
}

/// `value_sums` on `isa`, which this CPU runs (`Isa::runnable`).
fn value_sums_on<T: CacheElement, const H: usize>(
    isa: Isa,
    mut outs: [&mut [f32]; H],
    weights: [&[f32]; H],
    values: HeadRows<T>,
) {
    let width = values.head_dim;
    assert!(
        outs.iter().all(|o| o.len() == width) && weights.iter().all(|w| w.len() == values.len()),
        "value_sums: a head's output or weights do not fit the values"
    );
    let lanes = match isa {
        Isa::Avx512 => 16,
        Isa::Avx2 => 8,
        Isa::Portable => return portable(outs, weights, values, 0),
    };
    let mut col = 0;
    // Widest passes first: a pass of N vectors per head, N = 8 / H down to 1, while that many
    // columns are left; the last few columns go through the portable loop.
    let mut vectors = ACCUMULATORS / H;
    while vectors > 0 {
        let pass = vectors * lanes;
        while col + pass <= width {
            let cols: [&mut [f32]; H] = outs.each_mut().map(|o| &mut o[col..col + pass]);
            match isa {
                // SAFETY: the CPU runs `isa`; `cols` are `pass` wide from column `col`, which
                // the values have too.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe { dispatch!(avx512, vectors, cols, weights, values, col) },
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe { dispatch!(avx2, vectors, cols, weights, values, col) },
                _ => portable(cols, weights, values, col),
            }
            col += pass;
        }
        vectors /= 2;
    }
    if col < width {
        portable(outs.each_mut().map(|o| &mut o[col..]), weights, values, col);
    }
}

/// Columns from `col` on, `outs[h].len()` of them, one term at a time.
fn portable<T: CacheElement, const H: usize>(
    outs: [&mut [f32]; H],
    weights: [&[f32]; H],
    values: HeadRows<T>,
    col: usize,
) {
    for (out, weights) in outs.into_iter().zip(weights) {
        out.fill(0.0);
        for (j, w) in weights.iter().enumerate() {
            for (o, x) in out.iter_mut().zip(&values.row(j)[col..]) {
                *o = w.mul_add((*x).into(), *o);
            }
        }
    }
}

/// `H` heads times `N` vectors of `$lanes` columns, one fused multiply-add per term, as the
/// portable loop does.
#[cfg(target_arch = "x86_64")]
macro_rules! value_pass {
    ($outs:expr, $weights:expr, $values:expr, $col:expr, lanes: $lanes:literal,
     $zero:path, $set1:path, $load:path, $fma:path, $store:path) => {{
        let (outs, weights, values) = ($outs, $weights, $values);
        let mut acc = [[$zero(); N]; H];
        for j in 0..values.len() {
            let value = values.row(j)[$col..][..$lanes * N].as_ptr();
            let mut v = [$zero(); N];
            for n in 0..N {
                v[n] = $load(value.add($lanes * n));
            }
            for h in 0..H {
                let w = $set1(*weights[h].get_unchecked(j));
                for n in 0..N {
                    acc[h][n] = $fma(w, v[n], acc[h][n]);
                }
            }
        }
        for h in 0..H {
            for n in 0..N {
                $store(outs[h].as_mut_ptr().add($lanes * n), acc[h][n]);
            }
        }
    }};
}

/// # Safety
/// The CPU has AVX-512F; `outs` are `16 * N` wide, rows of `values` that many from `col`, and
/// every `weights[h]` has a weight per row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512<T: CacheElement, const H: usize, const N: usize>(
    outs: [&mut [f32]; H],
    weights: [&[f32]; H],
    values: HeadRows<T>,
    col: usize,
) {
    use std::arch::x86_64::*;
    value_pass!(outs, weights, values, col, lanes: 16,
        _mm512_setzero_ps, _mm512_set1_ps, T::load16, _mm512_fmadd_ps, _mm512_storeu_ps)
}

/// # Safety
/// The CPU has AVX2; `outs` are `8 * N` wide, rows of `values` that many from `col`, and every
/// `weights[h]` has a weight per row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2<T: CacheElement, const H: usize, const N: usize>(
    outs: [&mut [f32]; H],
    weights: [&[f32]; H],
    values: HeadRows<T>,
    col: usize,
) {
    use std::arch::x86_64::*;
    value_pass!(outs, weights, values, col, lanes: 8,
        _mm256_setzero_ps, _mm256_set1_ps, T::load8, _mm256_fmadd_ps, _mm256_storeu_ps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    const KEYS: usize = 37;

    fn values(width: usize) -> Vec<Vec<f32>> {
        (0..KEYS)
            .map(|j| (0..width).map(|i| ((i * 7 + j * 13) as f32 * 0.37).sin()).collect())
            .collect()
    }

    fn weights(heads: usize) -> Vec<Vec<f32>> {
        (0..heads)
            .map(|h| (0..KEYS).map(|j| ((j + 5 * h) as f32 * 0.11).cos().abs()).collect())
            .collect()
    }

    fn to_bf16(values: &[Vec<f32>]) -> Vec<Vec<bf16>> {
        values
            .iter()
            .map(|v| v.iter().map(|x| bf16::from_f32(*x)).collect())
            .collect()
    }

    /// `H` heads' sums on `isa`, as bits, with the values in reverse slot order behind a
    /// column of another head.
    fn sums<T: CacheElement + Copy, const H: usize>(
        isa: Isa,
        weights: &[Vec<f32>],
        values: &[Vec<T>],
    ) -> Vec<Vec<u32>> {
        let head_dim = values[0].len();
        let data: Vec<T> = values.iter().rev().flat_map(|v| [&v[..1], &v[..]].concat()).collect();
        let slots: Vec<usize> = (0..KEYS).rev().collect();
        let rows = HeadRows {
            data: &data,
            slots: &slots,
            width: head_dim + 1,
            offset: 1,
            head_dim,
        };
        let mut outs = vec![vec![f32::NAN; head_dim]; H];
        let mut heads = outs.iter_mut();
        let outs_ref: [&mut [f32]; H] = std::array::from_fn(|_| &mut heads.next().unwrap()[..]);
        value_sums_on(isa, outs_ref, std::array::from_fn(|h| &weights[h][..]), rows);
        outs.iter().map(|o| o.iter().map(|x| x.to_bits()).collect()).collect()
    }

    /// Every head count on every path against the portable loop one head at a time, at widths
    /// that take every pass size and a portable tail.
    fn assert_all_paths_agree<T: CacheElement + Copy>(values: &[Vec<T>], what: &str) {
        let weights = weights(8);
        let alone: Vec<Vec<u32>> = (0..8)
            .map(|h| sums::<T, 1>(Isa::Portable, &weights[h..], values).remove(0))
            .collect();
        for isa in Isa::runnable() {
            assert_eq!(
                sums::<T, 1>(isa, &weights, values)[..],
                alone[..1],
                "{isa:?} {what} 1 head"
            );
            assert_eq!(
                sums::<T, 2>(isa, &weights, values)[..],
                alone[..2],
                "{isa:?} {what} 2 heads"
            );
            assert_eq!(
                sums::<T, 4>(isa, &weights, values)[..],
                alone[..4],
                "{isa:?} {what} 4 heads"
            );
            assert_eq!(
                sums::<T, 8>(isa, &weights, values)[..],
                alone[..8],
                "{isa:?} {what} 8 heads"
            );
        }
    }

    #[test]
    fn every_path_and_head_grouping_sums_as_the_portable_loop_bitwise() {
        for width in [64, 128, 80, 24, 3] {
            let values = values(width);
            assert_all_paths_agree(&values, &format!("f32 width {width}"));
            assert_all_paths_agree(&to_bf16(&values), &format!("bf16 width {width}"));
        }
    }

    #[test]
    fn bf16_values_sum_exactly_as_their_f32_values() {
        let halves = to_bf16(&values(64));
        let wide: Vec<Vec<f32>> = halves
            .iter()
            .map(|v| v.iter().map(|x| f32::from(*x)).collect())
            .collect();
        let weights = weights(2);
        for isa in Isa::runnable() {
            assert_eq!(
                sums::<bf16, 2>(isa, &weights, &halves),
                sums::<f32, 2>(isa, &weights, &wide),
                "{isa:?}"
            );
        }
    }

    #[test]
    fn the_sums_are_the_weighted_values() {
        let (values, weights) = (values(64), weights(1));
        let got = sums::<f32, 1>(Isa::detected(), &weights, &values);
        for col in 0..64 {
            let want: f64 = (0..KEYS).map(|j| weights[0][j] as f64 * values[j][col] as f64).sum();
            assert!((f32::from_bits(got[0][col]) as f64 - want).abs() < 1e-5, "column {col}");
        }
    }
}
