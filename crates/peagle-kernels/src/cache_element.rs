//! What a KV cache stores: f32, bf16 at half the bytes, or FP8 (e4m3) at a quarter. Attention
//! is bound by reading the cache once a batch holds a few long sequences, so fewer bytes per
//! element is what the narrow types buy, and they hold more tokens in the same memory. Kernels
//! widen each element to f32 on load, which is exact, and then do f32 arithmetic: a narrow
//! cache gives the bits an f32 cache holding the same rounded values gives.

use candle_core::WithDType;
use float8::F8E4M3;
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

/// 2^120: an e4m3 exponent field (bias 7) read in an f32's exponent field (bias 127) is 2^120
/// too small.
#[cfg(target_arch = "x86_64")]
const E4M3_REBIAS: f32 = 1.329_228e36;

impl CacheElement for F8E4M3 {
    /// Rounded to nearest even and saturated at ±448 (e4m3 has no infinity), as CUDA's
    /// `__nv_fp8_e4m3` conversion does, so the CPU and GPU caches hold the same bytes.
    fn from_f32(x: f32) -> Self {
        F8E4M3::from_f32(x)
    }

    /// Each byte's sign to bit 31 and its exponent and mantissa to bits 23..=26 and 20..=22,
    /// then times 2^120: exact for normals and subnormals alike. Bytes 0x7f and 0xff are NaN.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let x = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()));
        let magnitude = _mm512_and_si512(x, _mm512_set1_epi32(0x7f));
        let sign = _mm512_slli_epi32::<24>(_mm512_and_si512(x, _mm512_set1_epi32(0x80)));
        let bits = _mm512_or_si512(sign, _mm512_slli_epi32::<20>(magnitude));
        let value = _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(E4M3_REBIAS));
        let nan = _mm512_cmpeq_epi32_mask(magnitude, _mm512_set1_epi32(0x7f));
        _mm512_mask_blend_ps(nan, value, _mm512_set1_ps(f32::NAN))
    }

    /// As `load16`, eight at a time.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        let x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast()));
        let magnitude = _mm256_and_si256(x, _mm256_set1_epi32(0x7f));
        let sign = _mm256_slli_epi32::<24>(_mm256_and_si256(x, _mm256_set1_epi32(0x80)));
        let bits = _mm256_or_si256(sign, _mm256_slli_epi32::<20>(magnitude));
        let value = _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(E4M3_REBIAS));
        let nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(magnitude, _mm256_set1_epi32(0x7f)));
        _mm256_blendv_ps(value, _mm256_set1_ps(f32::NAN), nan)
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

    /// Bit patterns, with every NaN as one, so NaN compares equal to NaN.
    #[cfg(target_arch = "x86_64")]
    fn bits(xs: &[f32]) -> Vec<u32> {
        xs.iter()
            .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
            .collect()
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_loads_widen_every_e4m3_byte_exactly() {
        assert_eq!(E4M3_REBIAS, 2f32.powi(120));
        let isas = crate::isa::Isa::runnable();
        let all: Vec<F8E4M3> = (0..=255u8).map(F8E4M3::from_bits).collect();
        for chunk in all.chunks_exact(16) {
            let want: Vec<f32> = chunk.iter().map(|x| f32::from(*x)).collect();
            if isas.contains(&crate::isa::Isa::Avx512) {
                let mut got = [0f32; 16];
                // SAFETY: AVX-512F is present; the chunk has 16 elements.
                unsafe { std::arch::x86_64::_mm512_storeu_ps(got.as_mut_ptr(), F8E4M3::load16(chunk.as_ptr())) };
                assert_eq!(bits(&got), bits(&want));
            }
            if isas.contains(&crate::isa::Isa::Avx2) {
                let mut got = [0f32; 8];
                // SAFETY: AVX2 is present; the chunk has at least 8 elements.
                unsafe { std::arch::x86_64::_mm256_storeu_ps(got.as_mut_ptr(), F8E4M3::load8(chunk.as_ptr())) };
                assert_eq!(bits(&got), bits(&want[..8]));
            }
        }
    }

    #[test]
    fn rounding_to_e4m3_is_to_nearest_even_and_saturates() {
        let round = |x: f32| f32::from(<F8E4M3 as CacheElement>::from_f32(x));
        // 1 + 2^-4 lies halfway between 1 and 1 + 2^-3 (odd): ties go to even, 1.
        assert_eq!(round(1.0 + 2f32.powi(-4)), 1.0);
        assert_eq!(round(1.0 + 3.0 * 2f32.powi(-4)), 1.25);
        assert_eq!(round(1e6), 448.0);
        assert_eq!(round(f32::NEG_INFINITY), -448.0);
        // The smallest subnormal, 2^-9, and half of it, which ties to even (zero).
        assert_eq!(round(2f32.powi(-9)), 2f32.powi(-9));
        assert_eq!(round(2f32.powi(-10)), 0.0);
        assert!(round(f32::NAN).is_nan());
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
