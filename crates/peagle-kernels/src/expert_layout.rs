//! The order `kernels/moe.cu` keeps MXFP4 expert weights in on a GPU. Each expert's weight
//! [rows, groups of 32 values] goes in tiles of 16 rows, tile after tile; a tile's blocks in
//! quads of four consecutive blocks of a row, quad after quad; a quad's rows in order. A row's
//! last quad and a weight's last tile may be shorter. A warp of the tensor-core kernels reads a
//! quad of 8 rows, a whole block a lane, so its load is 512 contiguous bytes and its scales' 32,
//! where the checkpoint's row-major order would scatter both over 8 rows.
//!
//! Within each 4-byte word of a block, the eight codes' bits are moved (`CODE_BITS`) so that
//! the kernels' `dequantize8_bf16` finds each pair of codes' bits where a bf16 pair wants them
//! by a rotation and a mask.

use crate::kernel_constants::{MOE_LAYOUT_QUAD, MOE_LAYOUT_ROWS};
use crate::mxfp4::{Mxfp4Weight, MXFP4_BLOCK};

/// Bytes of one block's codes.
const BLOCK_BYTES: usize = MXFP4_BLOCK / 2;

/// Where the bits of code k of a word (nibble k, low nibble first: its bits m, e0, e1 and the
/// sign) lie in the device's word. The kernels read codes 2i and 2i + 1 as the low and high
/// halves of a bf16 pair: each code's magnitude (e1 e0 m) at bits 8..6 of its half and its sign
/// at bit 15, making a bf16 of its value times 2^-126. Pair 0 lies there already, pair 1 is
/// rotated 4 bits right of it, pair 2 10 bits; pair 3 takes the bits left, its magnitudes' top
/// bits 2 above its other bits' places and the rest 6 below them. The kernels' rotations and
/// masks must match (`pairs_by_the_kernels_rotations`, below).
const CODE_BITS: [[u32; 4]; 8] = [
    [6, 7, 8, 15],
    [22, 23, 24, 31],
    [2, 3, 4, 11],
    [18, 19, 20, 27],
    [28, 29, 30, 5],
    [12, 13, 14, 21],
    [0, 1, 10, 9],
    [16, 17, 26, 25],
];

/// Byte j of a word (codes 2j and 2j + 1) by its value, as its bits in the device's word.
const BYTE_BITS: [[u32; 256]; 4] = byte_bits();

const fn byte_bits() -> [[u32; 256]; 4] {
    let mut table = [[0; 256]; 4];
    let mut j = 0;
    while j < 4 {
        let mut value = 0;
        while value < 256 {
            let mut bit = 0;
            while bit < 8 {
                if value >> bit & 1 == 1 {
                    table[j][value] |= 1 << CODE_BITS[2 * j + bit / 4][bit % 4];
                }
                bit += 1;
            }
            value += 1;
        }
        j += 1;
    }
    table
}

/// A block's 16 bytes of codes as the device keeps them: each word's codes' bits moved.
fn device_block(block: &[u8], to: &mut [u8]) {
    for (word, to) in block.chunks_exact(4).zip(to.chunks_exact_mut(4)) {
        let moved = (0..4).fold(0u32, |w, j| w | BYTE_BITS[j][word[j] as usize]);
        to.copy_from_slice(&moved.to_le_bytes());
    }
}

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
                device_block(
                    &from_codes[BLOCK_BYTES * from..BLOCK_BYTES * (from + 1)],
                    &mut codes[BLOCK_BYTES * to..BLOCK_BYTES * (to + 1)],
                );
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

    /// Every bit of a word goes somewhere of its own.
    #[test]
    fn code_bits_move_every_bit_of_a_word_once() {
        let mut places: Vec<u32> = CODE_BITS.iter().flatten().copied().collect();
        places.sort_unstable();
        assert_eq!(places, (0..32).collect::<Vec<_>>());
    }

    /// The kernels' reading of a device word (kernels/moe.cu's `dequantize8_bf16`): pair i by
    /// its rotation and mask gives codes 2i and 2i + 1, each as a bf16 of its magnitude at bits
    /// 8..6 and its sign at 15, for every value of every byte.
    #[test]
    fn pairs_by_the_kernels_rotations() {
        const PAIR: u32 = 0x81C0_81C0;
        let pairs = |w: u32| {
            [
                w & PAIR,
                w.rotate_left(4) & PAIR,
                w.rotate_left(10) & PAIR,
                (w.rotate_left(6) & 0x80C0_80C0) | (w.rotate_left(30) & 0x0100_0100),
            ]
        };
        let as_bf16 = |code: u32| (code & 7) << 6 | (code >> 3) << 15;
        for j in 0..4 {
            for value in 0..=255u32 {
                let word = value << (8 * j);
                let mut device = [0u8; 4];
                device_block(&word.to_le_bytes(), &mut device);
                let got = pairs(u32::from_le_bytes(device));
                let want: [u32; 4] = std::array::from_fn(|i| match i == j {
                    true => as_bf16(value & 15) | as_bf16(value >> 4) << 16,
                    false => 0,
                });
                assert_eq!(got, want, "byte {j} = {value:#04x}");
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
        let moved = |b: u8| {
            let mut block = [0u8; BLOCK_BYTES];
            device_block(&[b; BLOCK_BYTES], &mut block);
            block
        };
        let code_blocks: Vec<[u8; BLOCK_BYTES]> =
            codes.chunks_exact(BLOCK_BYTES).map(|b| b.try_into().unwrap()).collect();
        let want_blocks: Vec<[u8; BLOCK_BYTES]> = scales.iter().map(|&b| moved(b)).collect();
        assert_eq!(code_blocks, want_blocks, "codes move with their scales");
    }
}
