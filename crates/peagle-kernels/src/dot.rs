//! Dot products of an f32 row with cached keys, with a reduction order fixed by the vector
//! length alone.
//!
//! Every attention score in the CPU path goes through these functions, so a value never
//! depends on how many keys were scored alongside it. The instruction set (AVX-512,
//! AVX2/FMA or portable) is chosen by CPU feature detection, the same for every call in a
//! process, so all calls in a process agree. Keys of either cache element type are widened to
//! f32 as they are loaded, so a bf16 key scores exactly as its f32 value does.

use crate::cache_element::CacheElement;
use crate::isa::Isa;

pub fn dot<T: CacheElement>(a: &[f32], b: &[T]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot length mismatch");
    dot_on(Isa::detected(), a, b)
}

/// One row against eight vectors (attention scores of eight keys), each result bit-identical
/// to `dot(x, ws[c])`: the eight sums share one horizontal reduction.
pub fn dot_x1x8<T: CacheElement>(x: &[f32], ws: [&[T]; 8]) -> [f32; 8] {
    assert!(ws.iter().all(|w| w.len() == x.len()), "dot_x1x8 length mismatch");
    dot_x1x8_on(Isa::detected(), x, ws)
}

/// `dot` on `isa`, which this CPU runs (`Isa::runnable`); the lengths are equal.
fn dot_on<T: CacheElement>(isa: Isa, a: &[f32], b: &[T]) -> f32 {
    match isa {
        // SAFETY: the CPU runs `isa` and the lengths are equal (the callers' contract).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::avx512::dot(a, b) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::avx2::dot(a, b) },
        _ => portable::dot(a, b),
    }
}

/// `dot_x1x8` on `isa`, as `dot_on`.
fn dot_x1x8_on<T: CacheElement>(isa: Isa, x: &[f32], ws: [&[T]; 8]) -> [f32; 8] {
    match isa {
        // SAFETY: the CPU runs `isa` and the lengths are equal (the callers' contract).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::avx512::dot_x1x8(x, ws) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::avx2::dot_x1x8(x, ws) },
        _ => ws.map(|w| portable::dot(x, w)),
    }
}

mod portable {
    use crate::cache_element::CacheElement;

    const LANES: usize = 8;

    pub fn dot<T: CacheElement>(a: &[f32], b: &[T]) -> f32 {
        let mut acc = [0f32; LANES];
        let body = a.len() / LANES * LANES;
        for (ca, cb) in a[..body].chunks_exact(LANES).zip(b[..body].chunks_exact(LANES)) {
            for l in 0..LANES {
                acc[l] += ca[l] * cb[l].into();
            }
        }
        let mut sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        for i in body..a.len() {
            sum += a[i] * b[i].into();
        }
        sum
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    /// The reduction order every x86 dot product follows, for any number of vectors against
    /// one row and either register width L: per vector, two accumulators over 2L-element
    /// blocks, one L-wide step into the first, their sum, a fixed horizontal sum (`$hsums`
    /// reduces every vector's sum at once, each by the same tree of lane pairs), then the scalar
    /// tail. Each input block is loaded once and used by all vectors. `$loadw` widens the
    /// vectors' elements to f32.
    macro_rules! dot_row {
        ($x:expr, $ws:expr, $cols:literal,
         lanes: $l:literal, $zero:path, $loadu:path, $loadw:path, $fma:path, $add:path, $hsums:path) => {{
            let x: &[f32] = $x;
            let ws = $ws;
            let n = x.len();
            let mut acc = [[$zero(); 2]; $cols];
            let mut i = 0;
            while i + 2 * $l <= n {
                let px = x.as_ptr().add(i);
                let (xa, xb) = ($loadu(px), $loadu(px.add($l)));
                for c in 0..$cols {
                    let pw = ws[c].as_ptr().add(i);
                    acc[c][0] = $fma(xa, $loadw(pw), acc[c][0]);
                    acc[c][1] = $fma(xb, $loadw(pw.add($l)), acc[c][1]);
                }
                i += 2 * $l;
            }
            if i + $l <= n {
                let xa = $loadu(x.as_ptr().add(i));
                for c in 0..$cols {
                    acc[c][0] = $fma(xa, $loadw(ws[c].as_ptr().add(i)), acc[c][0]);
                }
                i += $l;
            }
            let mut sums = [$zero(); $cols];
            for c in 0..$cols {
                sums[c] = $add(acc[c][0], acc[c][1]);
            }
            let mut out: [f32; $cols] = $hsums(sums);
            for c in 0..$cols {
                for j in i..n {
                    let w: f32 = ws[c][j].into();
                    out[c] += x[j] * w;
                }
            }
            out
        }};
    }

    /// Eight lanes (AVX2 with FMA).
    pub mod avx2 {
        use crate::cache_element::CacheElement;
        use std::arch::x86_64::*;

        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn hsum(v: __m256) -> f32 {
            let lo = _mm256_castps256_ps128(v);
            let hi = _mm256_extractf128_ps::<1>(v);
            let s = _mm_add_ps(lo, hi);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
            _mm_cvtss_f32(s)
        }

        /// `hsum` of eight vectors at once, adding the same lane pairs as `hsum` (float addition
        /// commutes, so the results are identical) with each instruction serving two to eight
        /// vectors.
        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn hsum8(v: [__m256; 8]) -> [f32; 8] {
            // Halves: [a.lo + a.hi, b.lo + b.hi], a's 4 partial lanes and then b's.
            let halves = |a, b| {
                _mm256_add_ps(
                    _mm256_permute2f128_ps::<0x20>(a, b),
                    _mm256_permute2f128_ps::<0x31>(a, b),
                )
            };
            let h = [
                halves(v[0], v[1]),
                halves(v[2], v[3]),
                halves(v[4], v[5]),
                halves(v[6], v[7]),
            ];
            // Pairs: in 128-bit lane q, [v(q) 0+2, v(q) 1+3, v(q+2) 0+2, v(q+2) 1+3] (v4 on).
            let pairs = |a, b| _mm256_add_ps(_mm256_shuffle_ps::<0x44>(a, b), _mm256_shuffle_ps::<0xEE>(a, b));
            let (lo, hi) = (pairs(h[0], h[1]), pairs(h[2], h[3]));
            // Totals: [v0, v2, v4, v6 | v1, v3, v5, v7].
            let total = _mm256_add_ps(_mm256_shuffle_ps::<0x88>(lo, hi), _mm256_shuffle_ps::<0xDD>(lo, hi));
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), total);
            [0, 4, 1, 5, 2, 6, 3, 7].map(|i| lanes[i])
        }

        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn hsums<const C: usize>(v: [__m256; C]) -> [f32; C] {
            let mut out = [0f32; C];
            if C == 8 {
                let sums = hsum8(std::array::from_fn(|c| v[c]));
                out.copy_from_slice(&sums);
                return out;
            }
            for c in 0..C {
                out[c] = hsum(v[c]);
            }
            out
        }

        macro_rules! dot8 {
            ($x:expr, $ws:expr, $cols:literal, $t:ident) => {
                dot_row!($x, $ws, $cols, lanes: 8,
                    _mm256_setzero_ps, _mm256_loadu_ps, $t::load8, _mm256_fmadd_ps, _mm256_add_ps, hsums)
            };
        }

        #[target_feature(enable = "avx2,fma")]
        pub unsafe fn dot<T: CacheElement>(a: &[f32], b: &[T]) -> f32 {
            dot8!(a, [b], 1, T)[0]
        }

        #[target_feature(enable = "avx2,fma")]
        pub unsafe fn dot_x1x8<T: CacheElement>(x: &[f32], ws: [&[T]; 8]) -> [f32; 8] {
            dot8!(x, ws, 8, T)
        }
    }

    /// Sixteen lanes (AVX-512F).
    pub mod avx512 {
        use crate::cache_element::CacheElement;
        use std::arch::x86_64::*;

        /// Lane i plus lane i + 8, then i + 4, i + 2 and i + 1: the one tree every AVX-512 dot
        /// product sums its lanes by.
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn hsum(v: __m512) -> f32 {
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            let s = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
            let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
            _mm_cvtss_f32(s)
        }

        /// `hsum` of eight vectors at once: each level adds the same lane pairs as `hsum` (float
        /// addition commutes, so the results are identical) but serves two to eight vectors
        /// per instruction.
        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn hsum8(v: [__m512; 8]) -> [f32; 8] {
            // Halves: [a.lo, b.lo] + [a.hi, b.hi] holds a's 8 partial lanes, then b's.
            let h = [
                halves(v[0], v[1]),
                halves(v[2], v[3]),
                halves(v[4], v[5]),
                halves(v[6], v[7]),
            ];
            // Quarters: each 128-bit lane now holds one vector's 4 partial lanes, v0 to v3.
            let (lo, hi) = (quarters(h[0], h[1]), quarters(h[2], h[3]));
            // Pairs: in 128-bit lane q, [v(q) 0+2, v(q) 1+3, v(q+4) 0+2, v(q+4) 1+3].
            let pairs = _mm512_add_ps(_mm512_shuffle_ps::<0x44>(lo, hi), _mm512_shuffle_ps::<0xEE>(lo, hi));
            let total = _mm512_add_ps(pairs, _mm512_shuffle_ps::<0xB1>(pairs, pairs));
            let mut lanes = [0f32; 16];
            _mm512_storeu_ps(lanes.as_mut_ptr(), total);
            [0, 4, 8, 12, 2, 6, 10, 14].map(|i| lanes[i])
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn halves(a: __m512, b: __m512) -> __m512 {
            _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a, b), _mm512_shuffle_f32x4::<0xEE>(a, b))
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn quarters(a: __m512, b: __m512) -> __m512 {
            _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(a, b), _mm512_shuffle_f32x4::<0xDD>(a, b))
        }

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn hsums<const C: usize>(v: [__m512; C]) -> [f32; C] {
            let mut out = [0f32; C];
            if C == 8 {
                let sums = hsum8(std::array::from_fn(|c| v[c]));
                out.copy_from_slice(&sums);
                return out;
            }
            for c in 0..C {
                out[c] = hsum(v[c]);
            }
            out
        }

        macro_rules! dot16 {
            ($x:expr, $ws:expr, $cols:literal, $t:ident) => {
                dot_row!($x, $ws, $cols, lanes: 16,
                    _mm512_setzero_ps, _mm512_loadu_ps, $t::load16, _mm512_fmadd_ps, _mm512_add_ps, hsums)
            };
        }

        #[target_feature(enable = "avx512f")]
        pub unsafe fn dot<T: CacheElement>(a: &[f32], b: &[T]) -> f32 {
            dot16!(a, [b], 1, T)[0]
        }

        #[target_feature(enable = "avx512f")]
        pub unsafe fn dot_x1x8<T: CacheElement>(x: &[f32], ws: [&[T]; 8]) -> [f32; 8] {
            dot16!(x, ws, 8, T)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn naive(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
    }

    fn ramp(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37 + seed).sin()).collect()
    }

    fn to_bf16(xs: &[f32]) -> Vec<bf16> {
        xs.iter().map(|x| bf16::from_f32(*x)).collect()
    }

    fn widen(xs: &[bf16]) -> Vec<f32> {
        xs.iter().map(|x| f32::from(*x)).collect()
    }

    #[test]
    fn matches_f64_reference_for_all_tail_lengths() {
        for n in [0, 1, 7, 8, 9, 31, 32, 33, 64, 100, 257] {
            let (a, b) = (ramp(n, 0.1), ramp(n, 2.0));
            let got = dot(&a, &b) as f64;
            assert!((got - naive(&a, &b)).abs() < 1e-4, "n={n}");
        }
    }

    #[test]
    fn eight_key_scores_equal_single_dots_bitwise() {
        for n in [5, 16, 33, 64, 128] {
            let x = ramp(n, 0.5);
            let keys: Vec<Vec<f32>> = (0..8).map(|c| ramp(n, 3.0 + c as f32)).collect();
            let ws: [&[f32]; 8] = std::array::from_fn(|c| &keys[c][..]);
            let scores = dot_x1x8(&x, ws);
            for c in 0..8 {
                assert_eq!(scores[c].to_bits(), dot(&x, ws[c]).to_bits(), "n={n} key {c}");
            }
        }
    }

    #[test]
    fn bf16_keys_score_exactly_as_their_f32_values() {
        for n in [1, 7, 16, 33, 64, 100, 128] {
            let x = ramp(n, 0.5);
            let keys: Vec<Vec<bf16>> = (0..8).map(|c| to_bf16(&ramp(n, 3.0 + c as f32))).collect();
            let wide: Vec<Vec<f32>> = keys.iter().map(|k| widen(k)).collect();
            let eight = dot_x1x8(&x, std::array::from_fn(|c| &keys[c][..]));
            let eight_wide = dot_x1x8(&x, std::array::from_fn(|c| &wide[c][..]));
            assert_eq!(eight.map(f32::to_bits), eight_wide.map(f32::to_bits), "n={n}");
            for c in 0..8 {
                assert_eq!(
                    dot(&x, &keys[c]).to_bits(),
                    dot(&x, &wide[c]).to_bits(),
                    "n={n} key {c}"
                );
            }
        }
    }

    /// The dispatch picks one instruction set per machine; check every one this CPU runs.
    #[test]
    fn every_path_is_accurate_widens_bf16_exactly_and_scores_eight_keys_as_one() {
        for n in [7, 16, 33, 100, 256] {
            let a = ramp(n, 0.4);
            let keys16: Vec<Vec<bf16>> = (0..8).map(|c| to_bf16(&ramp(n, 5.0 + c as f32))).collect();
            let keys: Vec<Vec<f32>> = keys16.iter().map(|k| widen(k)).collect();
            for isa in Isa::runnable() {
                let got = dot_on(isa, &a, &keys[0]);
                assert!((got as f64 - naive(&a, &keys[0])).abs() < 1e-4, "{isa:?} n={n}");
                assert_eq!(got.to_bits(), dot_on(isa, &a, &keys16[0]).to_bits(), "{isa:?} n={n}");
                let eight = dot_x1x8_on(isa, &a, std::array::from_fn(|c| &keys16[c][..]));
                for c in 0..8 {
                    let one = dot_on(isa, &a, &keys[c]);
                    assert_eq!(eight[c].to_bits(), one.to_bits(), "{isa:?} n={n} key {c}");
                }
            }
        }
    }
}
