//! The order `kernels/moe.cu` keeps MXFP4 expert weights in on a GPU. Each expert's weight
//! [rows, groups of 32 values] goes in tiles of 16 rows, tile after tile; a tile's blocks in
//! quads of four consecutive blocks of a row, quad after quad; a quad's rows in order. A row's
//! last quad and a weight's last tile may be shorter. A warp of the tensor-core kernels reads a
//! quad of 8 rows, a whole block a lane, so its load is 512 contiguous bytes and its scales' 32,
//! where the checkpoint's row-major order would scatter both over 8 rows.

use crate::kernel_constants::{MOE_LAYOUT_QUAD, MOE_LAYOUT_ROWS};
use crate::mxfp4::{Mxfp4Weight, MXFP4_BLOCK};

/// Bytes of one block's codes.
const BLOCK_BYTES: usize = MXFP4_BLOCK / 2;

/// Where block `group` of row `row` of a weight [rows, groups] lies, in blocks from the
/// weight's first: the kernels' `block_index`, which this must equal.
fn block_index(rows: usize, groups: usize, row: usize, group: usize) -> usize {
    let (tile, in_tile) = (row / MOE_LAYOUT_ROWS, row % MOE_LAYOUT_ROWS);
    let tile_rows = MOE_LAYOUT_ROWS.min(rows - tile * MOE_LAYOUT_ROWS);
    let (quad, in_quad) = (group / MOE_LAYOUT_QUAD, group % MOE_LAYOUT_QUAD);
    let quad_blocks = MOE_LAYOUT_QUAD.min(groups - quad * MOE_LAYOUT_QUAD);
    tile * MOE_LAYOUT_ROWS * groups + quad * MOE_LAYOUT_QUAD * tile_rows + in_tile * quad_blocks + in_quad
}

/// `weights` in the device's order, end to end: all their blocks' codes, and all their scales.
pub(crate) fn device_order<'a>(weights: impl IntoIterator<Item = &'a Mxfp4Weight>) -> (Vec<u8>, Vec<u8>) {
    let (mut codes, mut scales) = (Vec::new(), Vec::new());
    for weight in weights {
        let (rows, inner) = weight.dims();
        let groups = inner / MXFP4_BLOCK;
        let (from_codes, from_scales) = weight.packed();
        let first = scales.len();
        codes.resize(BLOCK_BYTES * (first + rows * groups), 0);
        scales.resize(first + rows * groups, 0);
        for row in 0..rows {
            for group in 0..groups {
                let (from, to) = (row * groups + group, first + block_index(rows, groups, row, group));
                codes[BLOCK_BYTES * to..BLOCK_BYTES * (to + 1)]
                    .copy_from_slice(&from_codes[BLOCK_BYTES * from..BLOCK_BYTES * (from + 1)]);
                scales[to] = from_scales[from];
            }
        }
    }
    (codes, scales)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// Every shape's blocks land on every place once, including short last tiles and quads.
    #[test]
    fn every_block_has_its_own_place() {
        for (rows, groups) in [(1, 1), (16, 4), (17, 5), (37, 90), (5760, 90)] {
            let mut seen = vec![false; rows * groups];
            for row in 0..rows {
                for group in 0..groups {
                    let at = block_index(rows, groups, row, group);
                    assert!(!seen[at], "{rows}x{groups}: row {row}, group {group} shares {at}");
                    seen[at] = true;
                }
            }
        }
    }

    /// A weight of 17 rows of 5 blocks: tile 0's first quad is its 16 rows' blocks 0..4, four
    /// a row; then the 16 rows' block 4 (a quad of one); then tile 1, row 16 alone.
    #[test]
    fn a_weight_is_laid_out_in_tiles_of_quads() {
        let (rows, groups) = (17, 5);
        let codes: Vec<u8> = (0..rows * groups * BLOCK_BYTES)
            .map(|i| (i / BLOCK_BYTES) as u8)
            .collect();
        let scales: Vec<u8> = (0..rows * groups).map(|i| i as u8).collect();
        let weight = Mxfp4Weight::new(
            &Tensor::from_vec(codes, (rows, groups, BLOCK_BYTES), &Device::Cpu).unwrap(),
            &Tensor::from_vec(scales, (rows, groups), &Device::Cpu).unwrap(),
        )
        .unwrap();
        let (codes, scales) = device_order([&weight, &weight]);
        let block = |row: usize, group: usize| (row * groups + group) as u8;
        let mut want: Vec<u8> = (0..16)
            .flat_map(|row| (0..4).map(move |group| block(row, group)))
            .collect();
        want.extend((0..16).map(|row| block(row, 4)));
        want.extend((0..5).map(|group| block(16, group)));
        assert_eq!(scales[..rows * groups], want[..]);
        assert_eq!(scales[rows * groups..], want[..], "the second weight follows the first");
        let code_blocks: Vec<u8> = codes.chunks_exact(BLOCK_BYTES).map(|b| b[0]).collect();
        assert_eq!(code_blocks, scales, "codes move with their scales");
        assert!(codes.chunks_exact(BLOCK_BYTES).all(|b| b.iter().all(|&c| c == b[0])));
    }
}
