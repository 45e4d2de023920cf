//! Dot products with a reduction order fixed by the vector length alone.
//!
//! Every matmul and attention score in the CPU path goes through these two functions, so a
//! value never depends on how many rows were computed alongside it. The AVX2/FMA path is chosen
//! once per process (CPU feature detection is cached), so all calls in a process agree.

use half::bf16;

pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32 length mismatch");
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above); lengths are equal.
        return unsafe { x86::dot_f32(a, b) };
    }
    portable::dot(a, b, |x| x)
}

/// `a · b` with `b` stored as bf16; the upcast to f32 is exact, so this equals `dot_f32` on the
/// upcast weights bit for bit.
pub fn dot_bf16(a: &[f32], b: &[bf16]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_bf16 length mismatch");
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above); lengths are equal.
        return unsafe { x86::dot_bf16(a, b) };
    }
    portable::dot(a, b, bf16::to_f32)
}

mod portable {
    const LANES: usize = 8;

    pub fn dot<T: Copy>(a: &[f32], b: &[T], up: impl Fn(T) -> f32) -> f32 {
        let mut acc = [0f32; LANES];
        let body = a.len() / LANES * LANES;
        for (ca, cb) in a[..body].chunks_exact(LANES).zip(b[..body].chunks_exact(LANES)) {
            for l in 0..LANES {
                acc[l] += ca[l] * up(cb[l]);
            }
        }
        let mut sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for i in body..a.len() {
            sum += a[i] * up(b[i]);
        }
        sum
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::bf16;
    use std::arch::x86_64::*;

    pub fn available() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_bf16(p: *const bf16) -> __m256 {
        let raw = _mm_loadu_si128(p as *const __m128i);
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)))
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps::<1>(v);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }

    /// Four independent accumulators over 32-element blocks (to hide FMA latency), then 8-wide
    /// steps, then a scalar tail; the combination order is fixed.
    macro_rules! dot_body {
        ($a:expr, $b:expr, $load:expr, $scalar:expr) => {{
            let (a, b) = ($a, $b);
            let n = a.len();
            let pa = a.as_ptr();
            let pb = b.as_ptr();
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i + 32 <= n {
                for (j, acc) in acc.iter_mut().enumerate() {
                    let off = i + 8 * j;
                    *acc = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(off)), $load(pb.add(off)), *acc);
                }
                i += 32;
            }
            while i + 8 <= n {
                acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), $load(pb.add(i)), acc[0]);
                i += 8;
            }
            let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let mut sum = hsum(v);
            while i < n {
                sum += a[i] * $scalar(b[i]);
                i += 1;
            }
            sum
        }};
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        dot_body!(a, b, |p| _mm256_loadu_ps(p), |x: f32| x)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_bf16(a: &[f32], b: &[bf16]) -> f32 {
        dot_body!(a, b, |p| load_bf16(p), bf16::to_f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
    }

    fn ramp(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect()
    }

    #[test]
    fn matches_f64_reference_for_all_tail_lengths() {
        for n in [0, 1, 7, 8, 9, 31, 32, 33, 64, 100, 257] {
            let (a, b) = (ramp(n, 0.1), ramp(n, 2.0));
            let got = dot_f32(&a, &b) as f64;
            assert!((got - naive(&a, &b)).abs() < 1e-4, "n={n}");
        }
    }

    #[test]
    fn bf16_weights_equal_f32_on_upcast_weights() {
        let a = ramp(131, 0.3);
        let b16: Vec<bf16> = ramp(131, 1.0).into_iter().map(bf16::from_f32).collect();
        let b32: Vec<f32> = b16.iter().map(|x| x.to_f32()).collect();
        assert_eq!(dot_bf16(&a, &b16).to_bits(), dot_f32(&a, &b32).to_bits());
    }
}
