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
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F (checked above).
        return unsafe { avx512::exp_sum(xs, shift) };
    }
    portable_exp_sum(xs, shift)
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

/// Lanes of the sum in `exp_sum`: one AVX-512 register.
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

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub unsafe fn exp_sum(xs: &mut [f32], shift: f32) -> f32 {
        let shift = _mm512_set1_ps(shift);
        let mut sum = _mm512_setzero_ps();
        let mut chunks = xs.chunks_exact_mut(LANES);
        for chunk in &mut chunks {
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(chunk.as_ptr()), shift));
            _mm512_storeu_ps(chunk.as_mut_ptr(), e);
            sum = _mm512_add_ps(sum, e);
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
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
            x,
            _mm512_set1_ps(LOG2_E),
        ));
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
        let mut p = _mm512_set1_ps(POLY[0]);
        for c in &POLY[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
        }
        let y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0));
        // Lanes out of range get garbage exponents; the blends below replace them.
        let n = _mm512_cvtps_epi32(n);
        let a = _mm512_srai_epi32::<1>(n);
        let b = _mm512_sub_epi32(n, a);
        let scaled = _mm512_mul_ps(_mm512_mul_ps(y, pow2(a)), pow2(b));
        let low = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(MIN_INPUT));
        let high = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(MAX_INPUT));
        let flushed = _mm512_mask_blend_ps(low, scaled, _mm512_setzero_ps());
        _mm512_mask_blend_ps(high, flushed, _mm512_set1_ps(f32::INFINITY))
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn pow2(e: __m512i) -> __m512 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(e, _mm512_set1_epi32(127))))
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
        for len in [1, 15, 16, 17, 33, 100] {
            for start in 0..16 {
                let input = &xs[start * 997..][..len];
                let mut ours = input.to_vec();
                let sum = exp_sum(&mut ours, 1.5);
                let mut theirs = input.to_vec();
                let their_sum = portable_exp_sum(&mut theirs, 1.5);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&ours), bits(&theirs), "length {len} from {start}");
                assert_eq!(sum.to_bits(), their_sum.to_bits(), "length {len} from {start}");
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
