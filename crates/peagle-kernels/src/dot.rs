//! Dot products with a reduction order fixed by the vector length alone.
//!
//! Every matmul and attention score in the CPU path goes through these functions, so a value
//! never depends on how many rows were computed alongside it. The instruction set (AVX-512,
//! AVX2/FMA or portable) is chosen by CPU feature detection, the same for every call in a
//! process, so all calls in a process agree.

use half::bf16;

pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32 length mismatch");
    #[cfg(target_arch = "x86_64")]
    if x86::avx512() {
        // SAFETY: the CPU supports AVX-512F (checked above); lengths are equal.
        return unsafe { x86::avx512::dot_f32(a, b) };
    }
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above); lengths are equal.
        return unsafe { x86::avx2::dot_f32(a, b) };
    }
    portable::dot(a, b, |x| x)
}

/// `a · b` with `b` stored as bf16; the upcast to f32 is exact, so this equals `dot_f32` on the
/// upcast weights bit for bit.
pub fn dot_bf16(a: &[f32], b: &[bf16]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_bf16 length mismatch");
    #[cfg(target_arch = "x86_64")]
    if x86::avx512() {
        // SAFETY: the CPU supports AVX-512F (checked above); lengths are equal.
        return unsafe { x86::avx512::dot_bf16(a, b) };
    }
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above); lengths are equal.
        return unsafe { x86::avx2::dot_bf16(a, b) };
    }
    portable::dot(a, b, bf16::to_f32)
}

/// Four rows against one weight vector, each result bit-identical to `dot_f32(xs[r], w)`: the
/// weight vector is loaded once for all four, which is what makes small-row matmuls cheap.
pub fn dot_f32_x4(xs: [&[f32]; 4], w: &[f32]) -> [f32; 4] {
    assert!(xs.iter().all(|x| x.len() == w.len()), "dot_f32_x4 length mismatch");
    #[cfg(target_arch = "x86_64")]
    if x86::avx512() {
        // SAFETY: the CPU supports AVX-512F (checked above); lengths are equal.
        return unsafe { x86::avx512::dot_f32_x4(xs, w) };
    }
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above); lengths are equal.
        return unsafe { x86::avx2::dot_f32_x4(xs, w) };
    }
    xs.map(|x| portable::dot(x, w, |v| v))
}

/// `dot_f32_x4` with bf16 weights.
pub fn dot_bf16_x4(xs: [&[f32]; 4], w: &[bf16]) -> [f32; 4] {
    assert!(xs.iter().all(|x| x.len() == w.len()), "dot_bf16_x4 length mismatch");
    #[cfg(target_arch = "x86_64")]
    if x86::avx512() {
        // SAFETY: the CPU supports AVX-512F (checked above); lengths are equal.
        return unsafe { x86::avx512::dot_bf16_x4(xs, w) };
    }
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        // SAFETY: the CPU supports AVX2 and FMA (checked above); lengths are equal.
        return unsafe { x86::avx2::dot_bf16_x4(xs, w) };
    }
    xs.map(|x| portable::dot(x, w, bf16::to_f32))
}

/// Four rows against two weight vectors, `[row][weight]`, each result bit-identical to
/// `dot_f32(xs[r], ws[c])`: the tile reuses every loaded input block for both weights.
pub fn dot_f32_x4x2(xs: [&[f32]; 4], ws: [&[f32]; 2]) -> [[f32; 2]; 4] {
    assert!(ws[0].len() == ws[1].len(), "dot_f32_x4x2 length mismatch");
    assert!(
        xs.iter().all(|x| x.len() == ws[0].len()),
        "dot_f32_x4x2 length mismatch"
    );
    #[cfg(target_arch = "x86_64")]
    if x86::avx512() {
        // SAFETY: the CPU supports AVX-512F (checked above); lengths are equal.
        return unsafe { x86::avx512::dot_f32_x4x2(xs, ws) };
    }
    columns(dot_f32_x4(xs, ws[0]), dot_f32_x4(xs, ws[1]))
}

/// `dot_f32_x4x2` with bf16 weights.
pub fn dot_bf16_x4x2(xs: [&[f32]; 4], ws: [&[bf16]; 2]) -> [[f32; 2]; 4] {
    assert!(ws[0].len() == ws[1].len(), "dot_bf16_x4x2 length mismatch");
    assert!(
        xs.iter().all(|x| x.len() == ws[0].len()),
        "dot_bf16_x4x2 length mismatch"
    );
    #[cfg(target_arch = "x86_64")]
    if x86::avx512() {
        // SAFETY: the CPU supports AVX-512F (checked above); lengths are equal.
        return unsafe { x86::avx512::dot_bf16_x4x2(xs, ws) };
    }
    columns(dot_bf16_x4(xs, ws[0]), dot_bf16_x4(xs, ws[1]))
}

/// One row against eight vectors (attention scores of eight keys), each result bit-identical
/// to `dot_f32(x, ws[c])`: the eight sums share one horizontal reduction.
pub fn dot_f32_x1x8(x: &[f32], ws: [&[f32]; 8]) -> [f32; 8] {
    assert!(ws.iter().all(|w| w.len() == x.len()), "dot_f32_x1x8 length mismatch");
    #[cfg(target_arch = "x86_64")]
    if x86::avx512() {
        // SAFETY: the CPU supports AVX-512F (checked above); lengths are equal.
        return unsafe { x86::avx512::dot_f32_x1x8(x, ws) };
    }
    ws.map(|w| dot_f32(x, w))
}

fn columns(a: [f32; 4], b: [f32; 4]) -> [[f32; 2]; 4] {
    [0, 1, 2, 3].map(|r| [a[r], b[r]])
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
    pub fn available() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    pub fn avx512() -> bool {
        is_x86_feature_detected!("avx512f")
    }

    /// The reduction order every x86 dot product follows, for any number of rows and weight
    /// vectors at once and either register width L: per (row, weight) pair, two accumulators
    /// over 2L-element blocks, one L-wide step into the first, their sum, a fixed horizontal
    /// sum (`$hsums` reduces every pair's vector at once, each by the same tree of lane
    /// pairs), then the scalar tail. Each weight block is loaded (and widened from bf16) once and
    /// used by all rows, each input block once and used by all weights. Loads are passed as
    /// function paths, not closures: a closure does not carry the enclosing function's target
    /// features, so its intrinsics would not inline.
    macro_rules! dot_rows {
        ($xs:expr, $ws:expr, $rows:literal, $cols:literal, $load:path, $scalar:path,
         lanes: $l:literal, $zero:path, $loadu:path, $fma:path, $add:path, $hsums:path) => {{
            let xs: [&[f32]; $rows] = $xs;
            let ws = $ws;
            let n = ws[0].len();
            let mut acc = [[[$zero(); 2]; $cols]; $rows];
            let mut i = 0;
            while i + 2 * $l <= n {
                let mut wv = [[$zero(); 2]; $cols];
                for c in 0..$cols {
                    wv[c] = [$load(ws[c].as_ptr().add(i)), $load(ws[c].as_ptr().add(i + $l))];
                }
                for r in 0..$rows {
                    let px = xs[r].as_ptr().add(i);
                    let (xa, xb) = ($loadu(px), $loadu(px.add($l)));
                    for c in 0..$cols {
                        acc[r][c][0] = $fma(xa, wv[c][0], acc[r][c][0]);
                        acc[r][c][1] = $fma(xb, wv[c][1], acc[r][c][1]);
                    }
                }
                i += 2 * $l;
            }
            if i + $l <= n {
                let mut wv = [$zero(); $cols];
                for c in 0..$cols {
                    wv[c] = $load(ws[c].as_ptr().add(i));
                }
                for r in 0..$rows {
                    let xa = $loadu(xs[r].as_ptr().add(i));
                    for c in 0..$cols {
                        acc[r][c][0] = $fma(xa, wv[c], acc[r][c][0]);
                    }
                }
                i += $l;
            }
            let mut sums = [[$zero(); $cols]; $rows];
            for r in 0..$rows {
                for c in 0..$cols {
                    sums[r][c] = $add(acc[r][c][0], acc[r][c][1]);
                }
            }
            let mut out: [[f32; $cols]; $rows] = $hsums(sums);
            for r in 0..$rows {
                for c in 0..$cols {
                    for j in i..n {
                        out[r][c] += xs[r][j] * $scalar(ws[c][j]);
                    }
                }
            }
            out
        }};
    }

    /// Eight lanes (AVX2 with FMA).
    pub mod avx2 {
        use half::bf16;
        use std::arch::x86_64::*;

        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn load_bf16(p: *const bf16) -> __m256 {
            let raw = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)))
        }

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

        #[inline]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn hsums<const R: usize, const C: usize>(v: [[__m256; C]; R]) -> [[f32; C]; R] {
            let mut out = [[0f32; C]; R];
            for r in 0..R {
                for c in 0..C {
                    out[r][c] = hsum(v[r][c]);
                }
            }
            out
        }

        macro_rules! dot8 {
            ($xs:expr, $ws:expr, $rows:literal, $cols:literal, $load:path, $scalar:path) => {
                dot_rows!($xs, $ws, $rows, $cols, $load, $scalar, lanes: 8,
                    _mm256_setzero_ps, _mm256_loadu_ps, _mm256_fmadd_ps, _mm256_add_ps, hsums)
            };
        }

        #[target_feature(enable = "avx2,fma")]
        pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
            dot8!([a], [b], 1, 1, _mm256_loadu_ps, f32::from)[0][0]
        }

        #[target_feature(enable = "avx2,fma")]
        pub unsafe fn dot_bf16(a: &[f32], b: &[bf16]) -> f32 {
            dot8!([a], [b], 1, 1, load_bf16, bf16::to_f32)[0][0]
        }

        // Sixteen 256-bit registers hold only four rows' accumulators for one weight vector.
        #[target_feature(enable = "avx2,fma")]
        pub unsafe fn dot_f32_x4(xs: [&[f32]; 4], w: &[f32]) -> [f32; 4] {
            dot8!(xs, [w], 4, 1, _mm256_loadu_ps, f32::from).map(|r| r[0])
        }

        #[target_feature(enable = "avx2,fma")]
        pub unsafe fn dot_bf16_x4(xs: [&[f32]; 4], w: &[bf16]) -> [f32; 4] {
            dot8!(xs, [w], 4, 1, load_bf16, bf16::to_f32).map(|r| r[0])
        }
    }

    /// Sixteen lanes (AVX-512F).
    pub mod avx512 {
        use half::bf16;
        use std::arch::x86_64::*;

        #[inline]
        #[target_feature(enable = "avx512f")]
        unsafe fn load_bf16(p: *const bf16) -> __m512 {
            let raw = _mm256_loadu_si256(p as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(raw)))
        }

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
        unsafe fn hsums<const R: usize, const C: usize>(v: [[__m512; C]; R]) -> [[f32; C]; R] {
            let mut out = [[0f32; C]; R];
            if R * C == 8 {
                let mut flat = [_mm512_setzero_ps(); 8];
                for (i, x) in v.iter().flatten().enumerate() {
                    flat[i] = *x;
                }
                let sums = hsum8(flat);
                for (i, o) in out.iter_mut().flatten().enumerate() {
                    *o = sums[i];
                }
                return out;
            }
            for r in 0..R {
                for c in 0..C {
                    out[r][c] = hsum(v[r][c]);
                }
            }
            out
        }

        macro_rules! dot16 {
            ($xs:expr, $ws:expr, $rows:literal, $cols:literal, $load:path, $scalar:path) => {
                dot_rows!($xs, $ws, $rows, $cols, $load, $scalar, lanes: 16,
                    _mm512_setzero_ps, _mm512_loadu_ps, _mm512_fmadd_ps, _mm512_add_ps, hsums)
            };
        }

        #[target_feature(enable = "avx512f")]
        pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
            dot16!([a], [b], 1, 1, _mm512_loadu_ps, f32::from)[0][0]
        }

        #[target_feature(enable = "avx512f")]
        pub unsafe fn dot_bf16(a: &[f32], b: &[bf16]) -> f32 {
            dot16!([a], [b], 1, 1, load_bf16, bf16::to_f32)[0][0]
        }

        #[target_feature(enable = "avx512f")]
        pub unsafe fn dot_f32_x4(xs: [&[f32]; 4], w: &[f32]) -> [f32; 4] {
            dot16!(xs, [w], 4, 1, _mm512_loadu_ps, f32::from).map(|r| r[0])
        }

        #[target_feature(enable = "avx512f")]
        pub unsafe fn dot_bf16_x4(xs: [&[f32]; 4], w: &[bf16]) -> [f32; 4] {
            dot16!(xs, [w], 4, 1, load_bf16, bf16::to_f32).map(|r| r[0])
        }

        /// Four rows against two weight vectors: 16 accumulators of the 32 registers, and
        /// sixteen FMAs per twelve loads where one weight vector gets eight per ten.
        #[target_feature(enable = "avx512f")]
        pub unsafe fn dot_f32_x4x2(xs: [&[f32]; 4], ws: [&[f32]; 2]) -> [[f32; 2]; 4] {
            dot16!(xs, ws, 4, 2, _mm512_loadu_ps, f32::from)
        }

        #[target_feature(enable = "avx512f")]
        pub unsafe fn dot_bf16_x4x2(xs: [&[f32]; 4], ws: [&[bf16]; 2]) -> [[f32; 2]; 4] {
            dot16!(xs, ws, 4, 2, load_bf16, bf16::to_f32)
        }

        #[target_feature(enable = "avx512f")]
        pub unsafe fn dot_f32_x1x8(x: &[f32], ws: [&[f32]; 8]) -> [f32; 8] {
            dot16!([x], ws, 1, 8, _mm512_loadu_ps, f32::from)[0]
        }
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
    fn four_row_kernels_equal_single_rows_bitwise() {
        for n in [5, 8, 16, 23, 64, 100] {
            let rows: Vec<Vec<f32>> = (0..4).map(|r| ramp(n, r as f32)).collect();
            let xs = [&rows[0][..], &rows[1][..], &rows[2][..], &rows[3][..]];
            let w = ramp(n, 9.0);
            let w16: Vec<bf16> = w.iter().map(|x| bf16::from_f32(*x)).collect();
            let (four, four16) = (dot_f32_x4(xs, &w), dot_bf16_x4(xs, &w16));
            for r in 0..4 {
                assert_eq!(four[r].to_bits(), dot_f32(xs[r], &w).to_bits(), "n={n} row {r}");
                assert_eq!(four16[r].to_bits(), dot_bf16(xs[r], &w16).to_bits(), "n={n} row {r}");
            }
        }
    }

    #[test]
    fn two_weight_tiles_equal_single_dots_bitwise() {
        for n in [5, 16, 33, 64, 256] {
            let rows: Vec<Vec<f32>> = (0..4).map(|r| ramp(n, r as f32)).collect();
            let xs = [&rows[0][..], &rows[1][..], &rows[2][..], &rows[3][..]];
            let ws = [ramp(n, 9.0), ramp(n, 4.0)];
            let ws16: Vec<Vec<bf16>> = ws
                .iter()
                .map(|w| w.iter().map(|x| bf16::from_f32(*x)).collect())
                .collect();
            let tile = dot_f32_x4x2(xs, [&ws[0], &ws[1]]);
            let tile16 = dot_bf16_x4x2(xs, [&ws16[0], &ws16[1]]);
            for r in 0..4 {
                for c in 0..2 {
                    assert_eq!(tile[r][c].to_bits(), dot_f32(xs[r], &ws[c]).to_bits(), "n={n} {r},{c}");
                    assert_eq!(
                        tile16[r][c].to_bits(),
                        dot_bf16(xs[r], &ws16[c]).to_bits(),
                        "n={n} {r},{c}"
                    );
                }
            }
        }
    }

    #[test]
    fn eight_key_scores_equal_single_dots_bitwise() {
        for n in [5, 16, 33, 64, 128] {
            let x = ramp(n, 0.5);
            let keys: Vec<Vec<f32>> = (0..8).map(|c| ramp(n, 3.0 + c as f32)).collect();
            let ws: [&[f32]; 8] = std::array::from_fn(|c| &keys[c][..]);
            let scores = dot_f32_x1x8(&x, ws);
            for c in 0..8 {
                assert_eq!(scores[c].to_bits(), dot_f32(&x, ws[c]).to_bits(), "n={n} key {c}");
            }
        }
    }

    /// The dispatch picks one instruction set per machine; check the others it could pick.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_x86_path_keeps_rows_independent_and_accurate() {
        for n in [7, 16, 33, 100, 256] {
            let rows: Vec<Vec<f32>> = (0..4).map(|r| ramp(n, r as f32)).collect();
            let xs = [&rows[0][..], &rows[1][..], &rows[2][..], &rows[3][..]];
            let w = ramp(n, 5.0);
            // SAFETY: each path runs only where the CPU supports it.
            let paths: Vec<(&str, [f32; 4], Vec<f32>)> = unsafe {
                let mut p = Vec::new();
                if x86::available() {
                    p.push((
                        "avx2",
                        x86::avx2::dot_f32_x4(xs, &w),
                        xs.iter().map(|x| x86::avx2::dot_f32(x, &w)).collect(),
                    ));
                }
                if x86::avx512() {
                    let one = xs.iter().map(|x| x86::avx512::dot_f32(x, &w)).collect();
                    p.push(("avx512", x86::avx512::dot_f32_x4(xs, &w), one));
                }
                p
            };
            for (name, four, one) in paths {
                for r in 0..4 {
                    assert_eq!(four[r].to_bits(), one[r].to_bits(), "{name} n={n} row {r}");
                    assert!((four[r] as f64 - naive(xs[r], &w)).abs() < 1e-4, "{name} n={n}");
                }
            }
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
