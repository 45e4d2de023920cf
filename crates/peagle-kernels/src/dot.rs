//! Dot products of f32 query rows with cached keys, with a reduction order fixed by the vector
//! length alone.
//!
//! Every attention score in the CPU path goes through `dots`, so a value never depends on how
//! many keys or queries were scored alongside it. The instruction set (AVX-512, AVX2/FMA or
//! portable) is chosen by CPU feature detection, the same for every call in a process, so all
//! calls in a process agree. Keys of either cache element type are widened to f32 as they are
//! loaded, so a bf16 key scores exactly as its f32 value does.

use crate::cache_element::CacheElement;
use crate::isa::Isa;

/// `Q` rows against `C` vectors: `out[q][c]` is the dot product of `xs[q]` and `ws[c]`, whose
/// bits depend on those two alone. Scoring the query heads that share a key head together
/// loads and widens each key once for all of them.
pub fn dots<T: CacheElement, const Q: usize, const C: usize>(xs: [&[f32]; Q], ws: [&[T]; C]) -> [[f32; C]; Q] {
    let n = xs.first().map_or(0, |x| x.len());
    assert!(
        xs.iter().all(|x| x.len() == n) && ws.iter().all(|w| w.len() == n),
        "dots length mismatch"
    );
    dots_on(Isa::detected(), xs, ws)
}

/// `dots` on `isa`, which this CPU runs (`Isa::runnable`); the lengths are equal.
pub(crate) fn dots_on<T: CacheElement, const Q: usize, const C: usize>(
    isa: Isa,
    xs: [&[f32]; Q],
    ws: [&[T]; C],
) -> [[f32; C]; Q] {
    match isa {
        // SAFETY: the CPU runs `isa` and the lengths are equal (the callers' contract).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::avx512::dots(xs, ws) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::avx2::dots(xs, ws) },
        _ => xs.map(|x| ws.map(|w| portable::dot(x, w))),
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
pub(crate) mod x86 {
    /// The reduction order every x86 dot product follows, for any number of rows and vectors
    /// and either register width L: per (row, vector) pair one accumulator over L-element
    /// blocks, a fixed horizontal sum (`$hsums` reduces every pair's sum at once, each by the
    /// same tree of lane pairs), then the scalar tail. Each block of a vector is loaded, and
    /// widened to f32 by `$loadw`, once for all rows. One accumulator per pair, not two, so
    /// that 8 pairs and their row blocks fit AVX2's 16 registers.
    macro_rules! dot_block {
        ($xs:expr, $ws:expr, $q:ident, $c:ident,
         lanes: $l:literal, $zero:path, $loadu:path, $loadw:path, $fma:path, $hsums:path) => {{
            let (xs, ws) = ($xs, $ws);
            let n = xs.first().map_or(0, |x: &&[f32]| x.len());
            let mut acc = [[$zero(); $c]; $q];
            let mut i = 0;
            while i + $l <= n {
                let mut x = [$zero(); $q];
                for q in 0..$q {
                    x[q] = $loadu(xs[q].as_ptr().add(i));
                }
                for c in 0..$c {
                    let w = $loadw(ws[c].as_ptr().add(i));
                    for q in 0..$q {
                        acc[q][c] = $fma(x[q], w, acc[q][c]);
                    }
                }
                i += $l;
            }
            let mut out: [[f32; $c]; $q] = $hsums(acc);
            for q in 0..$q {
                for c in 0..$c {
                    for j in i..n {
                        let w: f32 = ws[c][j].into();
                        out[q][c] += xs[q][j] * w;
                    }
                }
            }
            out
        }};
    }

    /// Reduces every pair's accumulator with `$hsum`, or eight at once with `$hsum8`, which adds
    /// the same lane pairs.
    macro_rules! hsums {
        ($v:expr, $hsum:path, $hsum8:path) => {{
            let v = $v;
            let mut out = [[0f32; C]; Q];
            if Q * C == 8 {
                let sums = $hsum8(std::array::from_fn(|i| v[i / C][i % C]));
                for (i, s) in sums.into_iter().enumerate() {
                    out[i / C][i % C] = s;
                }
                return out;
            }
            for q in 0..Q {
                for c in 0..C {
                    out[q][c] = $hsum(v[q][c]);
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
        pub(crate) unsafe fn hsums<const Q: usize, const C: usize>(v: [[__m256; C]; Q]) -> [[f32; C]; Q] {
            hsums!(v, hsum, hsum8)
        }

        #[target_feature(enable = "avx2,fma")]
        pub unsafe fn dots<T: CacheElement, const Q: usize, const C: usize>(
            xs: [&[f32]; Q],
            ws: [&[T]; C],
        ) -> [[f32; C]; Q] {
            dot_block!(xs, ws, Q, C, lanes: 8,
                _mm256_setzero_ps, _mm256_loadu_ps, T::load8, _mm256_fmadd_ps, hsums)
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
        pub(crate) unsafe fn hsums<const Q: usize, const C: usize>(v: [[__m512; C]; Q]) -> [[f32; C]; Q] {
            hsums!(v, hsum, hsum8)
        }

        #[target_feature(enable = "avx512f")]
        pub unsafe fn dots<T: CacheElement, const Q: usize, const C: usize>(
            xs: [&[f32]; Q],
            ws: [&[T]; C],
        ) -> [[f32; C]; Q] {
            dot_block!(xs, ws, Q, C, lanes: 16,
                _mm512_setzero_ps, _mm512_loadu_ps, T::load16, _mm512_fmadd_ps, hsums)
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

    fn rows(count: usize, n: usize, seed: f32) -> Vec<Vec<f32>> {
        (0..count).map(|c| ramp(n, seed + c as f32)).collect()
    }

    fn to_bf16(rows: &[Vec<f32>]) -> Vec<Vec<bf16>> {
        rows.iter()
            .map(|r| r.iter().map(|x| bf16::from_f32(*x)).collect())
            .collect()
    }

    fn widen(rows: &[Vec<bf16>]) -> Vec<Vec<f32>> {
        rows.iter().map(|r| r.iter().map(|x| f32::from(*x)).collect()).collect()
    }

    /// Every pair of `xs[..Q]` and `ws[..C]` scored together, as bits.
    fn block<T: CacheElement, const Q: usize, const C: usize>(
        isa: Isa,
        xs: &[Vec<f32>],
        ws: &[Vec<T>],
    ) -> [[u32; C]; Q] {
        dots_on::<T, Q, C>(
            isa,
            std::array::from_fn(|q| &xs[q][..]),
            std::array::from_fn(|c| &ws[c][..]),
        )
        .map(|row| row.map(f32::to_bits))
    }

    /// Checks every shape attention uses on `isa` against pairs scored one by one.
    fn assert_shapes_agree<T: CacheElement>(isa: Isa, xs: &[Vec<f32>], ws: &[Vec<T>], what: &str) {
        let one = |q: usize, c: usize| block::<T, 1, 1>(isa, &xs[q..], &ws[c..])[0][0];
        fn check<const Q: usize, const C: usize>(got: [[u32; C]; Q], one: &dyn Fn(usize, usize) -> u32, what: &str) {
            for (q, row) in got.iter().enumerate() {
                for (c, bits) in row.iter().enumerate() {
                    assert_eq!(*bits, one(q, c), "{what}: {Q}x{C} block, row {q} vector {c}");
                }
            }
        }
        check(block::<T, 1, 8>(isa, xs, ws), &one, what);
        check(block::<T, 2, 4>(isa, xs, ws), &one, what);
        check(block::<T, 4, 2>(isa, xs, ws), &one, what);
        check(block::<T, 8, 1>(isa, xs, ws), &one, what);
        check(block::<T, 2, 1>(isa, xs, ws), &one, what);
        check(block::<T, 4, 1>(isa, xs, ws), &one, what);
    }

    /// The dispatch picks one instruction set per machine; check every one this CPU runs.
    #[test]
    fn every_path_is_accurate_and_scores_alike_in_every_block_shape() {
        for n in [0, 1, 7, 8, 9, 16, 31, 33, 64, 100, 128, 257] {
            let xs = rows(8, n, 0.4);
            let keys = rows(8, n, 5.0);
            for isa in Isa::runnable() {
                for q in 0..8 {
                    for c in 0..8 {
                        let got = block::<f32, 1, 1>(isa, &xs[q..], &keys[c..])[0][0];
                        let want = naive(&xs[q], &keys[c]);
                        assert!((f32::from_bits(got) as f64 - want).abs() < 1e-4, "{isa:?} n={n}");
                    }
                }
                assert_shapes_agree(isa, &xs, &keys, &format!("{isa:?} n={n}"));
            }
        }
    }

    #[test]
    fn bf16_keys_score_exactly_as_their_f32_values() {
        for n in [1, 7, 16, 33, 64, 100, 128] {
            let xs = rows(8, n, 0.5);
            let keys = to_bf16(&rows(8, n, 3.0));
            let wide = widen(&keys);
            for isa in Isa::runnable() {
                assert_eq!(
                    block::<bf16, 2, 4>(isa, &xs, &keys),
                    block::<f32, 2, 4>(isa, &xs, &wide),
                    "{isa:?} n={n}"
                );
                assert_shapes_agree(isa, &xs, &keys, &format!("{isa:?} bf16 n={n}"));
            }
        }
    }

    #[test]
    fn the_public_entry_takes_the_detected_path() {
        let (xs, keys) = (rows(2, 64, 0.1), rows(4, 64, 2.0));
        let got = dots::<f32, 2, 4>([&xs[0], &xs[1]], std::array::from_fn(|c| &keys[c][..]));
        let want = block::<f32, 2, 4>(Isa::detected(), &xs, &keys);
        assert_eq!(got.map(|row| row.map(f32::to_bits)), want);
    }
}
