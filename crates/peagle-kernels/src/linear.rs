//! `y = x · wᵀ` over a weight packed once into panels of 32 output columns.
//!
//! Decoding multiplies a handful of rows by every weight matrix, so this is the hot path. A
//! panel holds, for each k, its 32 weights in one cache line, so a tile of up to 8 rows streams
//! its panels linearly, broadcasts one input per row and k, and keeps every output in a
//! register: each output is a fused multiply-add chain over k whatever the batch (see
//! `panel_tile`). Work is split across threads by panels, which never changes a chain.

use crate::contiguous::contiguous;
use crate::error::bad_input;
use crate::isa::Isa;
use crate::panel_tile::{self, Bf16Line, F32Line, Tile, PANEL};
use crate::pool::{enough_tasks, for_each_task};
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor};
use half::bf16;

/// Panels a task works through together, each read once per tile of rows while in cache.
const GROUP: usize = 4;

/// A weight [n, k] in panels, for `linear`. Packing reads the whole matrix, so it is done
/// once, when a model is loaded.
pub struct PackedWeight {
    n: usize,
    k: usize,
    lines: Lines,
}

enum Lines {
    Bf16(Vec<Bf16Line>),
    F32(Vec<F32Line>),
}

impl PackedWeight {
    /// Packs a CPU weight [n, k] of f32 or bf16, keeping its dtype.
    pub fn new(w: &Tensor) -> Result<Self> {
        let (n, k) = w.dims2()?;
        if !w.device().is_cpu() {
            return Err(bad_input("PackedWeight", "the weight must be on the CPU"));
        }
        let w = w.contiguous()?;
        let lines = match w.dtype() {
            DType::BF16 => {
                let data = w.flatten_all()?.to_vec1::<bf16>()?;
                Lines::Bf16(pack(&data, n, k, Bf16Line([bf16::ZERO; PANEL]), |line, c, v| {
                    line.0[Bf16Line::slot(c)] = v
                }))
            }
            DType::F32 => {
                let data = w.flatten_all()?.to_vec1::<f32>()?;
                Lines::F32(pack(&data, n, k, F32Line([0.0; PANEL]), |line, c, v| line.0[c] = v))
            }
            other => return Err(bad_input("PackedWeight", format!("unsupported weight dtype {other:?}"))),
        };
        Ok(Self { n, k, lines })
    }

    /// The weight [n, k] as it was packed, on the CPU.
    pub fn unpack(&self) -> Result<Tensor> {
        let (n, k) = (self.n, self.k);
        let device = &candle_core::Device::Cpu;
        match &self.lines {
            Lines::Bf16(lines) => Tensor::from_vec(unpack(lines, n, k, Bf16Line::get), (n, k), device),
            Lines::F32(lines) => Tensor::from_vec(unpack(lines, n, k, F32Line::column), (n, k), device),
        }
    }
}

fn unpack<T, L>(lines: &[L], n: usize, k: usize, get: impl Fn(&L, usize) -> T) -> Vec<T> {
    let mut w = Vec::with_capacity(n * k);
    for j in 0..n {
        let (p, c) = (j / PANEL, j % PANEL);
        w.extend(lines[p * k..][..k].iter().map(|line| get(line, c)));
    }
    w
}

/// Line `p * k + kk` holds row `kk` of panel `p`: weights `w[32p + c][kk]`, zero past `n`.
fn pack<T: Copy, L: Copy>(w: &[T], n: usize, k: usize, empty: L, put: impl Fn(&mut L, usize, T)) -> Vec<L> {
    let mut lines = vec![empty; n.div_ceil(PANEL) * k];
    for (j, row) in w.chunks_exact(k).enumerate() {
        let (p, c) = (j / PANEL, j % PANEL);
        for (kk, v) in row.iter().enumerate() {
            put(&mut lines[p * k + kk], c, *v);
        }
    }
    lines
}

/// `x` [rows, k] f32 times the packed `w` [n, k] transposed, giving [rows, n] f32.
pub fn linear(x: &Tensor, w: &PackedWeight) -> Result<Tensor> {
    x.apply_op1_no_bwd(&Linear(w))
}

struct Linear<'a>(&'a PackedWeight);

impl CustomOp1 for Linear<'_> {
    fn name(&self) -> &'static str {
        "peagle-linear"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout) -> Result<(CpuStorage, Shape)> {
        let w = self.0;
        let (rows, k) = xl.shape().dims2()?;
        if k != w.k {
            return Err(bad_input(
                "linear",
                format!("input has {k} columns but the weight has {}", w.k),
            ));
        }
        let x = contiguous(xs.as_slice::<f32>()?, xl, "input")?;
        let y = match &w.lines {
            Lines::Bf16(lines) => matmul(x, lines, rows, w.n, k),
            Lines::F32(lines) => matmul(x, lines, rows, w.n, k),
        };
        Ok((CpuStorage::F32(y), Shape::from((rows, w.n))))
    }
}

fn matmul<L: Line>(x: &[f32], lines: &[L], rows: usize, n: usize, k: usize) -> Vec<f32> {
    matmul_on(Isa::detected(), x, lines, rows, n, k)
}

/// `matmul` with the tiles of instruction set `isa`, which the CPU must have.
fn matmul_on<L: Line>(isa: Isa, x: &[f32], lines: &[L], rows: usize, n: usize, k: usize) -> Vec<f32> {
    let panels = n.div_ceil(PANEL);
    let width = panels * PANEL;
    let mut y = vec![0f32; rows * width];
    if rows == 0 || n == 0 {
        y.truncate(rows * n);
        return y;
    }
    let per_task = panels.div_ceil(enough_tasks()).next_multiple_of(GROUP);
    let job = Job {
        isa,
        x,
        lines,
        rows,
        k,
        out: y.as_mut_ptr(),
        width,
    };
    for_each_task(panels.div_ceil(per_task), |task| {
        let first = task * per_task;
        // SAFETY: `job` is set up as `Job::panels` requires, and tasks take disjoint panels.
        unsafe { job.panels(first, per_task.min(panels - first)) }
    });
    if width == n {
        return y;
    }
    y.chunks_exact(width).flat_map(|row| &row[..n]).copied().collect()
}

/// One matmul as its tasks share it: all `rows` of `x` times the panels of `lines`, into `out`
/// (`rows` rows of `width` floats, the panels' columns side by side).
struct Job<'a, L> {
    isa: Isa,
    x: &'a [f32],
    lines: &'a [L],
    rows: usize,
    k: usize,
    out: *mut f32,
    width: usize,
}

// SAFETY: tasks write disjoint panels' columns of `out`, which outlives them.
unsafe impl<L: Sync> Sync for Job<'_, L> {}

impl<L: Line> Job<'_, L> {
    /// All rows times panels `first .. first + count`.
    ///
    /// # Safety
    /// The CPU has `isa`; `x` holds `rows * k` floats, `lines` `k` lines per panel up to
    /// `first + count`, and `out` `rows * width` writable floats; no other thread writes these
    /// panels' columns meanwhile.
    unsafe fn panels(&self, first: usize, count: usize) {
        let (x, k, stride) = (self.x, self.k, self.width);
        let out = self.out.add(first * PANEL);
        let lines = &self.lines[first * k..];
        for group in (0..count).step_by(GROUP) {
            let in_group = GROUP.min(count - group);
            let mut r0 = 0;
            while r0 < self.rows {
                let (r, p) = tile_shape(self.isa, self.rows - r0);
                let mut g = 0;
                while g < in_group {
                    // P always divides a whole group; a short last group goes one panel at a time.
                    let p = if in_group - g >= p { p } else { 1 };
                    let tile = Tile {
                        x: x.as_ptr().add(r0 * k),
                        k,
                        panel: lines.as_ptr().add((group + g) * k),
                        out: out.add(r0 * stride + (group + g) * PANEL),
                        out_stride: stride,
                    };
                    L::tile(self.isa, r, p, &tile);
                    g += p;
                }
                r0 += r;
            }
        }
    }
}

/// A line type and the tiles that multiply its panels.
trait Line: Sync + Sized {
    /// # Safety
    /// The CPU has `isa`; `(rows, panels)` comes from `tile_shape` (or has one panel); `t` is
    /// as `Tile` describes.
    unsafe fn tile(isa: Isa, rows: usize, panels: usize, t: &Tile<Self>);
}

/// Tiles keep their accumulators in registers: AVX-512's 32 registers hold 8 rows of a panel
/// (16 vectors), AVX2's 16 hold 2 rows (8), or 6 rows of half a panel (12) taking the halves
/// in turn, which loads each weight once per 6 rows instead of per 2. With fewer rows a tile
/// takes more panels, so that enough independent chains are in flight to hide the
/// multiply-add latency.
fn tile_shape(isa: Isa, rows_left: usize) -> (usize, usize) {
    match isa {
        Isa::Avx512 => match rows_left {
            1..=2 => (rows_left, 4),
            3..=6 => (rows_left, 2),
            7 => (7, 1),
            _ => (8, 1),
        },
        Isa::Avx2 => match rows_left {
            1 => (1, 2),
            2 | 3 => (2, 1),
            _ => (rows_left.min(6), 1),
        },
        Isa::Portable => (1, 1),
    }
}

/// Calls `$tile::<R, P>` for the runtime pair `($r, $p)`, one arm per shape `tile_shape` gives
/// and per one-panel tile.
macro_rules! dispatch {
    ($tile:ident, $r:expr, $p:expr, $t:expr, [$(($rr:literal, $pp:literal)),*]) => {
        match ($r, $p) {
            $(($rr, $pp) => $tile::<$rr, $pp>($t),)*
            other => unreachable!("no tile of shape {other:?}"),
        }
    };
}

macro_rules! line_tiles {
    ($line:ty, $name:ident, $halves:ident) => {
        impl Line for $line {
            unsafe fn tile(isa: Isa, rows: usize, panels: usize, t: &Tile<Self>) {
                match isa {
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512 => {
                        use panel_tile::avx512::$name;
                        dispatch!(
                            $name,
                            rows,
                            panels,
                            t,
                            [
                                (1, 1),
                                (2, 1),
                                (3, 1),
                                (4, 1),
                                (5, 1),
                                (6, 1),
                                (7, 1),
                                (8, 1),
                                (1, 4),
                                (2, 4),
                                (3, 2),
                                (4, 2),
                                (5, 2),
                                (6, 2)
                            ]
                        )
                    }
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 => {
                        use panel_tile::avx2::{$halves, $name};
                        match rows {
                            4 => $halves::<4>(t),
                            5 => $halves::<5>(t),
                            6 => $halves::<6>(t),
                            _ => dispatch!($name, rows, panels, t, [(1, 1), (2, 1), (1, 2)]),
                        }
                    }
                    _ => panel_tile::portable(rows, panels, t, <$line>::column),
                }
            }
        }
    };
}

line_tiles!(Bf16Line, bf16, bf16_halves);
line_tiles!(F32Line, f32, f32_halves);

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn random(rows: usize, cols: usize, seed: u64) -> Tensor {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let data: Vec<f32> = (0..rows * cols)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect();
        Tensor::from_vec(data, (rows, cols), &Device::Cpu).unwrap()
    }

    fn packed(w: &Tensor) -> PackedWeight {
        PackedWeight::new(w).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<Vec<u32>> {
        let rows: Vec<Vec<f32>> = t.to_vec2().unwrap();
        rows.iter().map(|r| r.iter().map(|v| v.to_bits()).collect()).collect()
    }

    #[test]
    fn matches_candle_matmul() {
        // 70 columns: two full panels and a partial one.
        for rows in [1, 5, 16] {
            let x = random(rows, 96, 1);
            let w = random(96, 70, 2).t().unwrap();
            let ours = linear(&x, &packed(&w)).unwrap();
            let reference = x.matmul(&w.t().unwrap()).unwrap();
            let diff = (ours - reference).unwrap().abs().unwrap().max_all().unwrap();
            assert!(diff.to_scalar::<f32>().unwrap() < 1e-5, "rows {rows}");
        }
    }

    #[test]
    fn every_output_is_one_fused_chain_over_k() {
        let (x, w) = (random(3, 37, 7), random(40, 37, 8));
        let ours: Vec<Vec<f32>> = linear(&x, &packed(&w)).unwrap().to_vec2().unwrap();
        let (xv, wv): (Vec<Vec<f32>>, Vec<Vec<f32>>) = (x.to_vec2().unwrap(), w.to_vec2().unwrap());
        for (t, row) in ours.iter().enumerate() {
            for (j, got) in row.iter().enumerate() {
                let chain = xv[t].iter().zip(&wv[j]).fold(0f32, |acc, (a, b)| a.mul_add(*b, acc));
                assert_eq!(got.to_bits(), chain.to_bits(), "row {t} column {j}");
            }
        }
    }

    #[test]
    fn rows_are_bitwise_independent_of_batch_size() {
        // Every tile shape (1 to 8 rows, one to four panels) and a partial last panel group.
        let w = packed(&random(7 * PANEL + 5, 96, 3));
        let x = random(19, 96, 4);
        let all = bits(&linear(&x, &w).unwrap());
        for (t, row) in all.iter().enumerate() {
            let alone = bits(&linear(&x.narrow(0, t, 1).unwrap(), &w).unwrap());
            assert_eq!(&alone[0], row, "row {t}");
        }
        for start in 0..8 {
            let some = bits(&linear(&x.narrow(0, start, 11).unwrap(), &w).unwrap());
            assert_eq!(some[..], all[start..start + 11], "rows {start}..");
        }
    }

    #[test]
    fn bf16_weights_equal_their_f32_upcast() {
        let x = random(9, 40, 5);
        let w16 = random(100, 40, 6).to_dtype(DType::BF16).unwrap();
        let w32 = w16.to_dtype(DType::F32).unwrap();
        assert_eq!(
            bits(&linear(&x, &packed(&w16)).unwrap()),
            bits(&linear(&x, &packed(&w32)).unwrap())
        );
    }

    #[test]
    fn every_instruction_set_computes_the_same_bits() {
        // 11 rows: 8- and 3-row tiles on AVX-512, 6- and 5-row half-panel tiles on AVX2. 3
        // panels: a short group, so two-panel tiles and one-panel ones.
        let (x, w) = (random(11, 48, 9), random(3 * PANEL, 48, 10));
        let x = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let (Lines::Bf16(lines16), Lines::F32(lines32)) =
            (packed(&w.to_dtype(DType::BF16).unwrap()).lines, packed(&w).lines)
        else {
            unreachable!("packing keeps the dtype")
        };
        let run = |isa: Isa| {
            let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
            (
                bits(matmul_on(isa, &x, &lines16, 11, 3 * PANEL, 48)),
                bits(matmul_on(isa, &x, &lines32, 11, 3 * PANEL, 48)),
            )
        };
        let reference = run(Isa::Portable);
        for isa in Isa::runnable() {
            let got = run(isa);
            assert_eq!(got.0, reference.0, "{isa:?} bf16");
            assert_eq!(got.1, reference.1, "{isa:?} f32");
        }
    }

    #[test]
    fn unpacking_gives_back_the_weight() {
        let w = random(70, 40, 11);
        for w in [w.clone(), w.to_dtype(DType::BF16).unwrap()] {
            let back = packed(&w).unpack().unwrap();
            assert_eq!(back.dtype(), w.dtype());
            let diff = (back.to_dtype(DType::F32).unwrap() - w.to_dtype(DType::F32).unwrap()).unwrap();
            assert_eq!(diff.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap(), 0.0);
        }
    }

    #[test]
    fn mismatched_inner_dimension_is_an_error() {
        let err = linear(&random(2, 8, 1), &packed(&random(4, 9, 2))).unwrap_err();
        assert!(err.to_string().contains("8 columns"), "{err}");
    }
}
