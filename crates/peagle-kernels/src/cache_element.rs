//! What a KV cache stores: f32, or bf16 at half the bytes. Attention is bound by reading the
//! cache once a batch holds a few long sequences, so halving its bytes is what bf16 buys.
//! Kernels widen bf16 to f32 on load, which is exact, and then do f32 arithmetic: a bf16 cache
//! gives the bits an f32 cache holding the same rounded values gives.

use candle_core::WithDType;
use half::bf16;

pub trait CacheElement: WithDType + Into<f32> + Send + Sync {
    /// The cached value of a computed key or value: rounded to nearest even for bf16.
    fn from_f32(x: f32) -> Self;

    /// Sixteen elements at `p`, widened.
    ///
    /// # Safety
    /// The CPU has AVX-512F and `p` points at 16 readable elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;

    /// Eight elements at `p`, widened.
    ///
    /// # Safety
    /// The CPU has AVX2 and `p` points at 8 readable elements.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl CacheElement for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        std::arch::x86_64::_mm512_loadu_ps(p)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
}

impl CacheElement for bf16 {
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }

    /// A bf16 is the top half of an f32: zero-extend each to 32 bits and shift it up.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
    }

    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<bf16> {
        (0..64)
            .map(|i| bf16::from_f32((i as f32 * 0.731 - 20.0).sin() * 10f32.powi(i % 7 - 3)))
            .chain([
                bf16::INFINITY,
                bf16::NEG_INFINITY,
                bf16::MIN_POSITIVE_SUBNORMAL,
                bf16::ZERO,
            ])
            .collect()
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_loads_widen_bf16_exactly() {
        let isas = crate::isa::Isa::runnable();
        let xs = samples();
        for chunk in xs.chunks_exact(16) {
            let want: Vec<u32> = chunk.iter().map(|x| f32::from(*x).to_bits()).collect();
            if isas.contains(&crate::isa::Isa::Avx512) {
                let mut got = [0f32; 16];
                // SAFETY: AVX-512F is present; the chunk has 16 elements.
                unsafe { std::arch::x86_64::_mm512_storeu_ps(got.as_mut_ptr(), bf16::load16(chunk.as_ptr())) };
                assert_eq!(got.map(f32::to_bits).to_vec(), want);
            }
            if isas.contains(&crate::isa::Isa::Avx2) {
                let mut got = [0f32; 8];
                // SAFETY: AVX2 is present; the chunk has at least 8 elements.
                unsafe { std::arch::x86_64::_mm256_storeu_ps(got.as_mut_ptr(), bf16::load8(chunk.as_ptr())) };
                assert_eq!(got.map(f32::to_bits).to_vec(), want[..8]);
            }
        }
    }

    #[test]
    fn rounding_to_bf16_is_to_nearest_even() {
        // 1 + 2^-8 lies halfway between 1 and the next bf16 (1 + 2^-7): ties go to even, 1.
        let round = |x: f32| f32::from(<bf16 as CacheElement>::from_f32(x));
        assert_eq!(round(1.0 + 2f32.powi(-8)), 1.0);
        // Halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
        assert_eq!(round(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
    }
}
