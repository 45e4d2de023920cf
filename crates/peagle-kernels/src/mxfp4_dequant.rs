//! MXFP4 values to f32, into a buffer (`dequantize`) or in registers straight into dot products
//! with f32 rows (`dots`), by the instruction set the process runs (`Isa::detected`).
//!
//! Every path gives the same bits: each value is its e2m1 value (a table entry, -0.0 included)
//! times the block's 2^(e - 127) (a table entry too), one f32 multiply, so the vector paths
//! only do many of those multiplies at once; `dots` sums as `dot::dots` does over the values.
//! Where a CPU runs gpt-oss's experts, this is most of a decode step's arithmetic: each weight
//! row is dequantized for the few input rows it meets.

use crate::isa::Isa;

/// The 16 e2m1 values by their 4-bit code.
const FP4: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// 2^(e - 127) for every scale byte e, exactly (2^-127 is a subnormal f32, 2^128 infinity).
static SCALES: std::sync::LazyLock<[f32; 256]> =
    std::sync::LazyLock::new(|| std::array::from_fn(|e| 2f32.powi(e as i32 - 127)));

/// Values per block: per scale byte, in 16 bytes of codes (low nibble first).
pub(crate) const BLOCK: usize = 32;

/// Writes the values of `scales.len()` blocks, whose codes are `codes` (16 bytes a block), into
/// `out` (32 a block).
pub(crate) fn dequantize(codes: &[u8], scales: &[u8], out: &mut [f32]) {
    dequantize_on(Isa::detected(), codes, scales, out)
}

/// The dot products of the input rows `xs` with the weight rows whose blocks are `codes` and
/// `scales` (as `dequantize` takes them), dequantized in registers: the bits of
/// `dot::dots::<f32, Q, C>` over the dequantized rows, with no row of them written. None where
/// the process runs no vector path (the caller dequantizes then).
pub(crate) fn dots<const Q: usize, const C: usize>(
    xs: [&[f32]; Q],
    codes: [&[u8]; C],
    scales: [&[u8]; C],
) -> Option<[[f32; C]; Q]> {
    dots_on(Isa::detected(), xs, codes, scales)
}

/// `dots` on `isa`, which this CPU runs (`Isa::runnable`).
fn dots_on<const Q: usize, const C: usize>(
    isa: Isa,
    xs: [&[f32]; Q],
    codes: [&[u8]; C],
    scales: [&[u8]; C],
) -> Option<[[f32; C]; Q]> {
    let blocks = scales[0].len();
    assert!(
        xs.iter().all(|x| x.len() == blocks * BLOCK)
            && codes.iter().all(|c| c.len() == blocks * BLOCK / 2)
            && scales.iter().all(|s| s.len() == blocks),
        "mxfp4 dots: rows of unequal lengths"
    );
    match isa {
        // SAFETY: the CPU runs `isa`, and the lengths are as asserted.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => Some(unsafe { x86::avx512_dots(xs, codes, scales) }),
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => Some(unsafe { x86::avx2_dots(xs, codes, scales) }),
        _ => None,
    }
}

/// `dequantize` on `isa`, which this CPU runs (`Isa::runnable`).
fn dequantize_on(isa: Isa, codes: &[u8], scales: &[u8], out: &mut [f32]) {
    assert!(
        codes.len() == scales.len() * BLOCK / 2 && out.len() == scales.len() * BLOCK,
        "mxfp4 dequantize: {} bytes of codes and {} values for {} blocks",
        codes.len(),
        out.len(),
        scales.len()
    );
    match isa {
        // SAFETY: the CPU runs `isa`, and the lengths are as asserted.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::avx512(codes, scales, out) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::avx2(codes, scales, out) },
        _ => portable(codes, scales, out),
    }
}

fn portable(codes: &[u8], scales: &[u8], out: &mut [f32]) {
    let blocks = codes.chunks_exact(BLOCK / 2).zip(scales);
    for ((block, &e), out) in blocks.zip(out.chunks_exact_mut(BLOCK)) {
        let scale = SCALES[e as usize];
        for (&b, pair) in block.iter().zip(out.chunks_exact_mut(2)) {
            pair[0] = FP4[(b & 0x0f) as usize] * scale;
            pair[1] = FP4[(b >> 4) as usize] * scale;
        }
    }
}

/// A block's 16 bytes become its 32 codes a byte each, in order (low nibble first), as two
/// halves of 16; each code then picks its value from a register table already multiplied by the
/// block's scale (the same products: a table entry times the scale is each value's one multiply).
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{BLOCK, FP4, SCALES};
    use std::arch::x86_64::*;

    /// Codes 0..16 and 16..32 of the block at `p` (SSE2, which every x86-64 has).
    #[inline]
    unsafe fn codes(p: *const u8) -> (__m128i, __m128i) {
        let bytes = _mm_loadu_si128(p.cast());
        let nibble = _mm_set1_epi8(0x0f);
        let lo = _mm_and_si128(bytes, nibble);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(bytes), nibble);
        (_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi))
    }

    /// Eight lanes: a code's low three bits pick its magnitude from a table of eight, and its
    /// high bit is the sign (a product's sign is its factors', the rest its magnitude's).
    #[target_feature(enable = "avx2")]
    pub unsafe fn avx2(codes_in: &[u8], scales: &[u8], out: &mut [f32]) {
        let magnitudes = _mm256_loadu_ps(FP4.as_ptr());
        let sign_bit = _mm256_set1_epi32(8);
        for (b, &e) in scales.iter().enumerate() {
            let table = _mm256_mul_ps(magnitudes, _mm256_set1_ps(SCALES[e as usize]));
            let (first, second) = codes(codes_in.as_ptr().add(b * BLOCK / 2));
            let dst = out.as_mut_ptr().add(b * BLOCK);
            for (i, half) in [first, second].into_iter().enumerate() {
                for (j, eight) in [half, _mm_srli_si128::<8>(half)].into_iter().enumerate() {
                    let code = _mm256_cvtepu8_epi32(eight);
                    let magnitude = _mm256_permutevar8x32_ps(table, code);
                    let sign = _mm256_slli_epi32::<28>(_mm256_and_si256(code, sign_bit));
                    let value = _mm256_or_ps(magnitude, _mm256_castsi256_ps(sign));
                    _mm256_storeu_ps(dst.add(16 * i + 8 * j), value);
                }
            }
        }
    }

    /// `super::dots` on AVX2 and FMA: each accumulator takes its eight-lane blocks' FMAs in
    /// order and the same horizontal sums as `dot::dots` (an MXFP4 row, a multiple of 32 long,
    /// has no scalar tail), so the bits are those of the dequantized rows' dot products.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn avx2_dots<const Q: usize, const C: usize>(
        xs: [&[f32]; Q],
        codes_in: [&[u8]; C],
        scales: [&[u8]; C],
    ) -> [[f32; C]; Q] {
        let magnitudes = _mm256_loadu_ps(FP4.as_ptr());
        let sign_bit = _mm256_set1_epi32(8);
        let mut acc = [[_mm256_setzero_ps(); C]; Q];
        for b in 0..scales[0].len() {
            for c in 0..C {
                let table = _mm256_mul_ps(magnitudes, _mm256_set1_ps(SCALES[scales[c][b] as usize]));
                let (first, second) = codes(codes_in[c].as_ptr().add(b * BLOCK / 2));
                for (i, half) in [first, second].into_iter().enumerate() {
                    for (j, eight) in [half, _mm_srli_si128::<8>(half)].into_iter().enumerate() {
                        let code = _mm256_cvtepu8_epi32(eight);
                        let sign = _mm256_slli_epi32::<28>(_mm256_and_si256(code, sign_bit));
                        let w = _mm256_or_ps(_mm256_permutevar8x32_ps(table, code), _mm256_castsi256_ps(sign));
                        for q in 0..Q {
                            let x = _mm256_loadu_ps(xs[q].as_ptr().add(b * BLOCK + 16 * i + 8 * j));
                            acc[q][c] = _mm256_fmadd_ps(x, w, acc[q][c]);
                        }
                    }
                }
            }
        }
        crate::dot::x86::avx2::hsums(acc)
    }

    /// `super::dots` on AVX-512, with its sixteen-lane blocks, as `avx2_dots` with eight.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn avx512_dots<const Q: usize, const C: usize>(
        xs: [&[f32]; Q],
        codes_in: [&[u8]; C],
        scales: [&[u8]; C],
    ) -> [[f32; C]; Q] {
        let values = _mm512_loadu_ps(FP4.as_ptr());
        let mut acc = [[_mm512_setzero_ps(); C]; Q];
        for b in 0..scales[0].len() {
            for c in 0..C {
                let table = _mm512_mul_ps(values, _mm512_set1_ps(SCALES[scales[c][b] as usize]));
                let (first, second) = codes(codes_in[c].as_ptr().add(b * BLOCK / 2));
                for (i, half) in [first, second].into_iter().enumerate() {
                    let w = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(half), table);
                    for q in 0..Q {
                        let x = _mm512_loadu_ps(xs[q].as_ptr().add(b * BLOCK + 16 * i));
                        acc[q][c] = _mm512_fmadd_ps(x, w, acc[q][c]);
                    }
                }
            }
        }
        crate::dot::x86::avx512::hsums(acc)
    }

    /// Sixteen lanes: a code picks its value from the whole table.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn avx512(codes_in: &[u8], scales: &[u8], out: &mut [f32]) {
        let values = _mm512_loadu_ps(FP4.as_ptr());
        for (b, &e) in scales.iter().enumerate() {
            let table = _mm512_mul_ps(values, _mm512_set1_ps(SCALES[e as usize]));
            let (first, second) = codes(codes_in.as_ptr().add(b * BLOCK / 2));
            let dst = out.as_mut_ptr().add(b * BLOCK);
            for (i, half) in [first, second].into_iter().enumerate() {
                _mm512_storeu_ps(
                    dst.add(16 * i),
                    _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(half), table),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_instruction_set_gives_the_tables_bits_for_every_code_and_scale() {
        // Every byte value in every position of a block, and every scale byte, each over all 16
        // codes: 0 (a subnormal scale) and 255 (infinite: 0 * inf is NaN, -0.0's code too).
        let codes: Vec<u8> = (0..256 * 16).map(|i| ((i * 7 + i / 256) % 256) as u8).collect();
        let scales: Vec<u8> = (0..=255).collect();
        let mut expected = vec![0f32; 256 * BLOCK];
        portable(&codes, &scales, &mut expected);
        assert_eq!(expected[0].to_bits(), 0, "code 0 is +0.0");
        for isa in Isa::runnable() {
            let mut got = vec![f32::NAN; 256 * BLOCK];
            dequantize_on(isa, &codes, &scales, &mut got);
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                assert_eq!(g.to_bits(), e.to_bits(), "{isa:?}: value {i} (block {})", i / BLOCK);
            }
        }
    }

    #[test]
    fn dots_in_registers_give_the_bits_of_dots_over_the_dequantized_rows() {
        let blocks = 5;
        let codes: Vec<Vec<u8>> = (0..4)
            .map(|c| (0..blocks * 16).map(|i| (i * 37 + c * 11) as u8).collect())
            .collect();
        let scales: Vec<Vec<u8>> = (0..4)
            .map(|c| (0..blocks).map(|b| (118 + b * 3 + c) as u8).collect())
            .collect();
        let xs: Vec<Vec<f32>> = (0..2)
            .map(|q| {
                (0..blocks * BLOCK)
                    .map(|i| ((i * 7 + q * 3) % 23) as f32 * 0.37 - 4.1)
                    .collect()
            })
            .collect();
        let dense: Vec<Vec<f32>> = (0..4)
            .map(|c| {
                let mut w = vec![0f32; blocks * BLOCK];
                dequantize(&codes[c], &scales[c], &mut w);
                w
            })
            .collect();
        let (w, x) = (|c: usize| dense[c].as_slice(), |q: usize| xs[q].as_slice());
        let c = [0, 1, 2, 3].map(|c| codes[c].as_slice());
        let s = [0, 1, 2, 3].map(|c| scales[c].as_slice());
        let bits = |v: [[f32; 4]; 2]| v.map(|r| r.map(f32::to_bits));
        let mut vector_paths = 0;
        for isa in Isa::runnable() {
            let expected = crate::dot::dots_on::<f32, 2, 4>(isa, [x(0), x(1)], [w(0), w(1), w(2), w(3)]);
            let Some(pair) = dots_on(isa, [x(0), x(1)], c, s) else {
                assert_eq!(isa, Isa::Portable, "every vector path dots in registers");
                continue;
            };
            assert_eq!(bits(pair), bits(expected), "{isa:?}");
            let one = dots_on(isa, [x(1)], c, s).unwrap();
            assert_eq!(one[0].map(f32::to_bits), expected[1].map(f32::to_bits), "{isa:?}");
            vector_paths += 1;
        }
        #[cfg(target_arch = "x86_64")]
        assert_eq!(vector_paths, Isa::runnable().len() - 1);
    }

    #[test]
    fn codes_come_low_nibble_first() {
        let mut codes = [0u8; 16];
        codes[0] = 0x72; // 1.0 then 6.0
        codes[15] = 0x8f; // -6.0 then -0.0
        for isa in Isa::runnable() {
            let mut out = [f32::NAN; BLOCK];
            dequantize_on(isa, &codes, &[128], &mut out);
            assert_eq!(&out[..2], &[2.0, 12.0], "{isa:?}");
            assert_eq!(out[30], -12.0, "{isa:?}");
            assert_eq!(out[31].to_bits(), (-0f32).to_bits(), "{isa:?}");
            assert!(out[2..30].iter().all(|v| v.to_bits() == 0), "{isa:?}");
        }
    }
}
