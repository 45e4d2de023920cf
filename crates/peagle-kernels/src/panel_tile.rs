//! The inner loop of the packed matmul: `R` input rows times `P` weight panels of 32 output
//! columns, over the whole inner dimension.
//!
//! Every output is one fused multiply-add chain over k = 0, 1, 2, ... from zero. That order
//! depends on nothing but the inner dimension, so an output is bit-identical whatever `R` and
//! `P` (how many rows and panels share its tile) and whatever the instruction set: the AVX-512,
//! AVX2 and portable tiles all compute the same chain.
//!
//! A panel stores, for each k, its 32 weights in one 64-byte line. bf16 lines are permuted so
//! that interleaving them with zeros (`unpacklo`/`unpackhi` of 16-bit lanes, which work within
//! 128-bit lanes) yields the f32 upcasts of columns in order: 0-15 and 16-31 from a 512-bit
//! line, 0-7, 16-23 and 8-15, 24-31 from its two 256-bit halves.

use half::bf16;

/// Output columns per panel.
pub const PANEL: usize = 32;

/// One k of one panel of bf16 weights, in the unpack order.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct Bf16Line(pub [bf16; PANEL]);

/// One k of one panel of f32 weights, in column order.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct F32Line(pub [f32; PANEL]);

impl Bf16Line {
    /// Column `c`'s place in the line: column 4q + j (q < 4, j < 4) sits in 128-bit lane q, in
    /// the low half for columns below 16 and the high half above.
    pub fn slot(c: usize) -> usize {
        let (half, c) = (c / 16, c % 16);
        (c / 4) * 8 + half * 4 + c % 4
    }

    pub fn get(&self, c: usize) -> bf16 {
        self.0[Self::slot(c)]
    }

    pub fn column(&self, c: usize) -> f32 {
        self.get(c).to_f32()
    }
}

impl F32Line {
    pub fn column(&self, c: usize) -> f32 {
        self.0[c]
    }
}

/// A tile's operands: rows of `x` (row stride `k`), consecutive panels of `k` lines from
/// `panel`, and the tile's top-left output (row stride `out_stride`).
pub struct Tile<L> {
    pub x: *const f32,
    pub k: usize,
    pub panel: *const L,
    pub out: *mut f32,
    pub out_stride: usize,
}

/// The portable tile, for CPUs without AVX2: the same chains, one output at a time.
///
/// # Safety
/// `x` holds `rows` rows of `k`, `panel` `panels * k` lines, and `out` `rows` rows of
/// `32 * panels` writable floats at `out_stride`.
pub unsafe fn portable<L>(rows: usize, panels: usize, t: &Tile<L>, column: fn(&L, usize) -> f32) {
    for r in 0..rows {
        for p in 0..panels {
            for c in 0..PANEL {
                let mut acc = 0f32;
                for kk in 0..t.k {
                    acc = (*t.x.add(r * t.k + kk)).mul_add(column(&*t.panel.add(p * t.k + kk), c), acc);
                }
                *t.out.add(r * t.out_stride + p * PANEL + c) = acc;
            }
        }
    }
}

/// The tile loop for one vector width: `$load` gives `$h` vectors of a line, holding the
/// panel's columns from `$columns[h]` on. Loads are function paths, not closures, so they
/// inline with the caller's target features.
#[cfg(target_arch = "x86_64")]
macro_rules! tile_loop {
    ($t:expr, $r:tt, $p:tt, $h:literal, $columns:expr, $load:path,
     $zero:path, $set1:path, $fma:path, $store:path) => {{
        let columns: [usize; $h] = $columns;
        let t = $t;
        let mut acc = [[[$zero(); $h]; $p]; $r];
        for kk in 0..t.k {
            let mut w = [[$zero(); $h]; $p];
            for p in 0..$p {
                w[p] = $load(t.panel.add(p * t.k + kk));
            }
            for r in 0..$r {
                let xb = $set1(*t.x.add(r * t.k + kk));
                for p in 0..$p {
                    for h in 0..$h {
                        acc[r][p][h] = $fma(xb, w[p][h], acc[r][p][h]);
                    }
                }
            }
        }
        for r in 0..$r {
            for p in 0..$p {
                for h in 0..$h {
                    $store(t.out.add(r * t.out_stride + p * PANEL + columns[h]), acc[r][p][h]);
                }
            }
        }
    }};
}

#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    use super::{Bf16Line, F32Line, Tile, PANEL};
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn load_bf16(line: *const Bf16Line) -> [__m512; 2] {
        let raw = _mm512_load_si512(line as *const __m512i);
        let zero = _mm512_setzero_si512();
        [
            _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, raw)),
            _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, raw)),
        ]
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_f32(line: *const F32Line) -> [__m512; 2] {
        let p = line as *const f32;
        [_mm512_load_ps(p), _mm512_load_ps(p.add(16))]
    }

    /// # Safety
    /// The CPU has AVX-512F and BW; the operands are as `Tile` describes.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn bf16<const R: usize, const P: usize>(t: &Tile<Bf16Line>) {
        tile_loop!(
            t,
            R,
            P,
            2,
            [0, 16],
            load_bf16,
            _mm512_setzero_ps,
            _mm512_set1_ps,
            _mm512_fmadd_ps,
            _mm512_storeu_ps
        )
    }

    /// # Safety
    /// As `bf16`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn f32<const R: usize, const P: usize>(t: &Tile<F32Line>) {
        tile_loop!(
            t,
            R,
            P,
            2,
            [0, 16],
            load_f32,
            _mm512_setzero_ps,
            _mm512_set1_ps,
            _mm512_fmadd_ps,
            _mm512_storeu_ps
        )
    }
}

#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use super::{Bf16Line, F32Line, Tile, PANEL};
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_bf16(line: *const Bf16Line) -> [__m256; 4] {
        let p = line as *const __m256i;
        let (a, b) = (_mm256_load_si256(p), _mm256_load_si256(p.add(1)));
        let zero = _mm256_setzero_si256();
        [
            _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, a)),
            _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, b)),
            _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, a)),
            _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, b)),
        ]
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_f32(line: *const F32Line) -> [__m256; 4] {
        let p = line as *const f32;
        [0, 8, 16, 24].map(|o| _mm256_load_ps(p.add(o)))
    }

    /// The 256-bit half `H` of a bf16 line: columns 8H.. and 16 + 8H.. (see the module doc).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_bf16_half<const H: usize>(line: *const Bf16Line) -> [__m256; 2] {
        let raw = _mm256_load_si256((line as *const __m256i).add(H));
        let zero = _mm256_setzero_si256();
        [
            _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, raw)),
            _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, raw)),
        ]
    }

    /// The half `H` of an f32 line: columns 16H.. and 16H + 8...
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_f32_half<const H: usize>(line: *const F32Line) -> [__m256; 2] {
        let p = (line as *const f32).add(16 * H);
        [_mm256_load_ps(p), _mm256_load_ps(p.add(8))]
    }

    /// # Safety
    /// The CPU has AVX2 and FMA; the operands are as `Tile` describes.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn bf16<const R: usize, const P: usize>(t: &Tile<Bf16Line>) {
        tile_loop!(
            t,
            R,
            P,
            4,
            [0, 8, 16, 24],
            load_bf16,
            _mm256_setzero_ps,
            _mm256_set1_ps,
            _mm256_fmadd_ps,
            _mm256_storeu_ps
        )
    }

    /// # Safety
    /// As `bf16`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn f32<const R: usize, const P: usize>(t: &Tile<F32Line>) {
        tile_loop!(
            t,
            R,
            P,
            4,
            [0, 8, 16, 24],
            load_f32,
            _mm256_setzero_ps,
            _mm256_set1_ps,
            _mm256_fmadd_ps,
            _mm256_storeu_ps
        )
    }

    /// `R` rows times one panel, half a line at a time. Two accumulators per row instead of
    /// four leave the registers for up to 6 rows, so more rows share each weight load; the
    /// second half's lines come back from cache.
    ///
    /// # Safety
    /// As `bf16`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn bf16_halves<const R: usize>(t: &Tile<Bf16Line>) {
        bf16_half::<R, 0>(t);
        bf16_half::<R, 1>(t);
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn bf16_half<const R: usize, const H: usize>(t: &Tile<Bf16Line>) {
        tile_loop!(
            t,
            R,
            1,
            2,
            [8 * H, 16 + 8 * H],
            load_bf16_half::<H>,
            _mm256_setzero_ps,
            _mm256_set1_ps,
            _mm256_fmadd_ps,
            _mm256_storeu_ps
        )
    }

    /// # Safety
    /// As `bf16`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn f32_halves<const R: usize>(t: &Tile<F32Line>) {
        f32_half::<R, 0>(t);
        f32_half::<R, 1>(t);
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn f32_half<const R: usize, const H: usize>(t: &Tile<F32Line>) {
        tile_loop!(
            t,
            R,
            1,
            2,
            [16 * H, 16 * H + 8],
            load_f32_half::<H>,
            _mm256_setzero_ps,
            _mm256_set1_ps,
            _mm256_fmadd_ps,
            _mm256_storeu_ps
        )
    }
}
