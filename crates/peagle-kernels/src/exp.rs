//! `exp` over a slice, 16 lanes at a time, and the row maximum and sum a softmax wraps it in.
//!
//! Attention's softmax and SwiGLU's gate take one `exp` per score and per gate column, and the
//! scalar libm call took 6% of a 16-sequence decode step. This is the classic range reduction
//! `exp(x) = 2^n * exp(r)`, `n = round(x / ln 2)`, `|r| <= ln 2 / 2` (ln 2 split in two so `r`
//! is exact), with a degree-6 polynomial for `exp(r)`: within 1 ulp of the exact value over
//! the whole range (tested).
//!
//! Every lane, vector or not, runs the same operations (the multiply-adds fused in both), so
//! an element's result does not depend on where it sits in the slice: batch invariance holds.
//! Results below the smallest normal float flush to zero; they are at most 1.2e-38.

use crate::isa::Isa;

/// Below this, `exp` is under the smallest normal float.
const MIN_INPUT: f32 = -87.336_54;
/// Above this, `exp` overflows.
const MAX_INPUT: f32 = 88.722_84;
const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// ln 2 = LN2_HI + LN2_LO, with LN2_HI (355 / 512) short enough that `n * LN2_HI` is exact.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Taylor-like coefficients of `(exp(r) - 1 - r) / r^2` fitted on `|r| <= ln 2 / 2` (Cephes).
const POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// Replaces every `x` in `xs` with `exp(x)`.
pub fn exp_in_place(xs: &mut [f32]) {
    exp_sum(xs, 0.0);
}

/// Replaces every `x` in `xs` with `exp(x - shift)` and returns their sum: softmax's numerators
/// and denominator in one pass. The sum runs in 16 lanes, element i in lane i % 16, and the
/// lanes are then added in order, so it too is the same on every path.
pub fn exp_sum(xs: &mut [f32], shift: f32) -> f32 {
    exp_sum_on(Isa::detected(), xs, shift)
}

/// `exp_sum` on `isa`, which this CPU runs (`Isa::runnable`).
fn exp_sum_on(isa: Isa, xs: &mut [f32], shift: f32) -> f32 {
    match isa {
        // SAFETY: the CPU runs `isa` (the callers' contract).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512::exp_sum(xs, shift) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2::exp_sum(xs, shift) },
        _ => portable_exp_sum(xs, shift),
    }
}

/// `exp_sum` one element at a time: the reference the vector path matches bit for bit.
fn portable_exp_sum(xs: &mut [f32], shift: f32) -> f32 {
    let mut lanes = [0f32; LANES];
    for (i, x) in xs.iter_mut().enumerate() {
        *x = exp(*x - shift);
        lanes[i % LANES] += *x;
    }
    lanes.iter().sum()
}

/// Lanes of the sum in `exp_sum`: one AVX-512 register, two AVX2 ones.
const LANES: usize = 16;

/// The largest of `xs` (negative infinity when empty): softmax's shift. The maximum is exact
/// in any order, so this takes 16 lanes at a time, which the compiler vectorises.
pub fn row_max(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, x) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(*x);
        }
    }
    let rest = chunks.remainder().iter().copied().fold(f32::NEG_INFINITY, f32::max);
    lanes.iter().copied().fold(rest, f32::max)
}

/// One lane of the computation, as the vector path computes it.
pub fn exp(x: f32) -> f32 {
    if x < MIN_INPUT {
        return 0.0;
    }
    if x > MAX_INPUT {
        return f32::INFINITY;
    }
    let n = (x * LOG2_E).round_ties_even();
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let p = POLY[1..].iter().fold(POLY[0], |p, c| p.mul_add(r, *c));
    let y = p.mul_add(r * r, r) + 1.0;
    // 2^n in two factors, each a normal float: n runs from -126 to 128, one past the largest
    // exponent a float holds, and 2^n itself may not exist where y * 2^n does.
    let n = n as i32;
    let (a, b) = (n >> 1, n - (n >> 1));
    y * pow2(a) * pow2(b)
}

/// 2^e for -126 <= e <= 127.
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// `exp(r)` scaled by `2^n` for a register of lanes, as the scalar `exp` computes it. Each
/// vector module imports its intrinsics under the names used here (`splat`, `fmadd`, ...), so
/// the one body serves every register width. Lanes out of range get garbage exponents; the
/// caller replaces them.
#[cfg(target_arch = "x86_64")]
macro_rules! scaled_exp {
    ($x:expr) => {{
        let x = $x;
        let n = round(mul(x, splat(LOG2_E)));
        let r = fnmadd(n, splat(LN2_LO), fnmadd(n, splat(LN2_HI), x));
        let mut p = splat(POLY[0]);
        for c in &POLY[1..] {
            p = fmadd(p, r, splat(*c));
        }
        let y = add(fmadd(p, mul(r, r), r), splat(1.0));
        let n = to_int(n);
        let a = shift_right::<1>(n);
        let b = sub_int(n, a);
        mul(mul(y, pow2(a)), pow2(b))
    }};
}

/// Eight lanes per register, two registers for the sum's 16 lanes. Without AVX-512 the scalar
/// path ran `mul_add` as a libm call, and exp was a third of a 16-sequence decode step.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::{
        _mm256_add_epi32 as add_int, _mm256_add_ps as add, _mm256_cvtps_epi32 as to_int, _mm256_fmadd_ps as fmadd,
        _mm256_fnmadd_ps as fnmadd, _mm256_mul_ps as mul, _mm256_set1_ps as splat, _mm256_srai_epi32 as shift_right,
        _mm256_sub_epi32 as sub_int, *,
    };

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_sum(xs: &mut [f32], shift: f32) -> f32 {
        let shift = splat(shift);
        let mut sums = [_mm256_setzero_ps(); 2];
        let mut chunks = xs.chunks_exact_mut(LANES);
        for chunk in &mut chunks {
            for (h, sum) in sums.iter_mut().enumerate() {
                let p = chunk.as_mut_ptr().add(8 * h);
                let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p), shift));
                _mm256_storeu_ps(p, e);
                *sum = add(*sum, e);
            }
        }
        let rest = chunks.into_remainder();
        let len = _mm256_set1_epi32(rest.len() as i32);
        for (h, sum) in sums.iter_mut().enumerate().take(rest.len().div_ceil(8)) {
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let mask = _mm256_cmpgt_epi32(len, add_int(lane, _mm256_set1_epi32(8 * h as i32)));
            let p = rest.as_mut_ptr().add(8 * h);
            let e = exp8(_mm256_sub_ps(_mm256_maskload_ps(p, mask), shift));
            _mm256_maskstore_ps(p, mask, e);
            // Adding +0 leaves every lane's bits as they are (the sums are never -0).
            *sum = add(*sum, _mm256_and_ps(e, _mm256_castsi256_ps(mask)));
        }
        let mut lanes = [0f32; LANES];
        _mm256_storeu_ps(lanes.as_mut_ptr(), sums[0]);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), sums[1]);
        lanes.iter().sum()
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp8(x: __m256) -> __m256 {
        let scaled = scaled_exp!(x);
        let low = _mm256_cmp_ps::<_CMP_LT_OQ>(x, splat(MIN_INPUT));
        let high = _mm256_cmp_ps::<_CMP_GT_OQ>(x, splat(MAX_INPUT));
        let flushed = _mm256_blendv_ps(scaled, _mm256_setzero_ps(), low);
        _mm256_blendv_ps(flushed, splat(f32::INFINITY), high)
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn round(x: __m256) -> __m256 {
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x)
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn pow2(e: __m256i) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(add_int(e, _mm256_set1_epi32(127))))
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use std::arch::x86_64::{
        _mm512_add_epi32 as add_int, _mm512_add_ps as add, _mm512_cvtps_epi32 as to_int, _mm512_fmadd_ps as fmadd,
        _mm512_fnmadd_ps as fnmadd, _mm512_mul_ps as mul, _mm512_set1_ps as splat, _mm512_srai_epi32 as shift_right,
        _mm512_sub_epi32 as sub_int, *,
    };

    #[target_feature(enable = "avx512f")]
    pub unsafe fn exp_sum(xs: &mut [f32], shift: f32) -> f32 {
        let shift = splat(shift);
        let mut sum = _mm512_setzero_ps();
        let mut chunks = xs.chunks_exact_mut(LANES);
        for chunk in &mut chunks {
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(chunk.as_ptr()), shift));
            _mm512_storeu_ps(chunk.as_mut_ptr(), e);
            sum = add(sum, e);
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let mask: __mmask16 = (1u16 << rest.len()) - 1;
            let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, rest.as_ptr()), shift));
            _mm512_mask_storeu_ps(rest.as_mut_ptr(), mask, e);
            sum = _mm512_mask_add_ps(sum, mask, sum, e);
        }
        let mut lanes = [0f32; LANES];
        _mm512_storeu_ps(lanes.as_mut_ptr(), sum);
        lanes.iter().sum()
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn exp16(x: __m512) -> __m512 {
        let scaled = scaled_exp!(x);
        let low = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, splat(MIN_INPUT));
        let high = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, splat(MAX_INPUT));
        let flushed = _mm512_mask_blend_ps(low, scaled, _mm512_setzero_ps());
        _mm512_mask_blend_ps(high, flushed, splat(f32::INFINITY))
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn round(x: __m512) -> __m512 {
        _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn pow2(e: __m512i) -> __m512 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<23>(add_int(e, _mm512_set1_epi32(127))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs across the whole range, the edges and specials included.
    fn inputs() -> Vec<f32> {
        let mut xs: Vec<f32> = (-20_000..=20_000).map(|i| i as f32 * 0.004_5).collect();
        xs.extend([MIN_INPUT, MAX_INPUT, -87.4, 88.8, 0.0, -0.0, 1e-30, -1e-30, -1e4, 1e4]);
        xs.extend([f32::NEG_INFINITY, f32::INFINITY, f32::MAX, f32::MIN]);
        xs
    }

    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn is_within_one_ulp_of_the_exact_value() {
        for x in inputs() {
            let exact = (x as f64).exp() as f32;
            let ours = exp(x);
            if exact < f32::MIN_POSITIVE {
                assert!(
                    ours == 0.0 || ulps(ours, exact) <= 1,
                    "exp({x}) = {ours}, exact {exact}"
                );
            } else {
                assert!(ulps(ours, exact) <= 1, "exp({x}) = {ours}, exact {exact}");
            }
        }
    }

    #[test]
    fn the_slice_path_equals_the_scalar_one_bitwise_at_every_offset() {
        let xs = inputs();
        for isa in Isa::runnable() {
            for len in [1, 7, 8, 9, 15, 16, 17, 25, 33, 100] {
                for start in 0..16 {
                    let input = &xs[start * 997..][..len];
                    let mut ours = input.to_vec();
                    let sum = exp_sum_on(isa, &mut ours, 1.5);
                    let mut theirs = input.to_vec();
                    let their_sum = portable_exp_sum(&mut theirs, 1.5);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&ours), bits(&theirs), "{isa:?} length {len} from {start}");
                    assert_eq!(sum.to_bits(), their_sum.to_bits(), "{isa:?} length {len} from {start}");
                }
            }
        }
    }

    #[test]
    fn row_max_is_the_largest_element() {
        let xs: Vec<f32> = (0..50).map(|i| ((i * 37) % 50) as f32 - 60.0).collect();
        for len in [0, 1, 16, 17, 50] {
            let expected = xs[..len].iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(row_max(&xs[..len]), expected, "length {len}");
        }
    }

    #[test]
    fn the_sum_is_the_sum_of_the_terms() {
        let mut xs: Vec<f32> = (0..37).map(|i| -(i as f32) * 0.25).collect();
        let sum = exp_sum(&mut xs, -1.0);
        let exact: f64 = (0..37).map(|i| (1.0 - i as f64 * 0.25).exp()).sum();
        assert!((sum as f64 - exact).abs() < 1e-6 * exact, "{sum} against {exact}");
    }

    #[test]
    fn overflow_underflow_and_nan() {
        let mut xs = vec![f32::NAN, 100.0, -100.0, f32::INFINITY, f32::NEG_INFINITY];
        exp_in_place(&mut xs);
        assert!(xs[0].is_nan());
        assert_eq!(&xs[1..], &[f32::INFINITY, 0.0, f32::INFINITY, 0.0]);
        assert!(exp(f32::NAN).is_nan());
    }
}
