//! How `kernels/paged_attention.cu`'s blocks cover a launch: which rows share a block, and how
//! many blocks share each row's parts of the keys.
//!
//! A row's parts are fixed by its position (the kernel's `parts_of`); how many blocks walk them
//! only changes how soon. A launch of few rows gives each row's parts to several blocks, so
//! that a long context is read by many SMs at once; a launch of many rows already fills the
//! GPU, and gives each row one block, which folds its parts as it walks them.

use crate::attention_metadata::AttentionMetadata;
use crate::kernel_constants::{ATTN_GROUP, ATTN_HEAD_GROUPS_MAX_DIM, ATTN_MAX_SPLITS};
use crate::paged_attention::AttentionParams;

/// The most parts a row has and the most rows a block serves.
pub(crate) const MAX_SPLITS: usize = ATTN_MAX_SPLITS;
const GROUP: usize = ATTN_GROUP;

/// The blocks of a head that serve rows: one a row under a window, and under full attention one
/// a group of up to GROUP consecutive positions of a sequence in an aligned group (the kernel's
/// `joins_previous`).
fn serving_blocks(meta: &AttentionMetadata, windowed: bool) -> usize {
    let rows = meta.rows();
    if windowed {
        return rows.len();
    }
    let joins = |w: &[(usize, usize)]| w[1].0 == w[0].0 && w[1].1 == w[0].1 + 1 && !w[1].1.is_multiple_of(GROUP);
    rows.len() - rows.windows(2).filter(|w| joins(w)).count()
}

/// How a launch's blocks cover its rows and heads, worked out once a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cover {
    /// The blocks of a head (or group of heads) that serve rows (`serving_blocks`).
    pub serving: usize,
    /// The query heads a block serves at one row (the kernel's `head_group`).
    pub head_group: usize,
    /// One block for each row (or group of rows) and head, walking the row's parts alone
    /// (`AttentionBlocks::OneARow`).
    pub one_a_row: bool,
}

impl Cover {
    /// Where no rows share a block, the head is small enough for the kernel of groups of heads
    /// and `one_a_row` is not asked for, a block serves the most heads of one KV head, up to
    /// GROUP, that divide its heads evenly, so that they read its keys once rather than once
    /// each; else one head.
    pub(crate) fn of(meta: &AttentionMetadata, params: &AttentionParams, one_a_row: bool) -> Self {
        let serving = serving_blocks(meta, params.sliding_window.is_some());
        let per_kv_head = params.num_heads / params.num_kv_heads.max(1);
        let head_group = match one_a_row || params.head_dim > ATTN_HEAD_GROUPS_MAX_DIM || serving != meta.num_rows() {
            true => 1,
            false => (1..=GROUP).rev().find(|g| per_kv_head.is_multiple_of(*g)).unwrap_or(1),
        };
        Self {
            serving,
            head_group,
            one_a_row,
        }
    }
}

/// The blocks each row's parts get so that a launch's serving blocks about fill `resident`, the
/// blocks the GPU holds at once, given `serving` blocks of a column over `columns` columns (the
/// heads, or the groups of heads a block serves).
pub(crate) fn blocks_each(resident: usize, serving: usize, columns: usize) -> usize {
    (resident / (serving * columns).max(1)).clamp(1, MAX_SPLITS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(seqs: &[(usize, usize)]) -> AttentionMetadata {
        let mut query_start = vec![0];
        for (_, rows) in seqs {
            query_start.push(query_start.last().unwrap() + rows);
        }
        AttentionMetadata {
            block_size: 16,
            query_start,
            context_lens: seqs.iter().map(|(len, _)| *len).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn rows_of_a_sequence_share_blocks_by_aligned_positions_under_full_attention() {
        // Positions 10 to 17: blocks for 10-11, 12-15 and 16-17; then a decode row alone.
        let m = meta(&[(18, 8), (300, 1)]);
        assert_eq!(serving_blocks(&m, false), 4);
        assert_eq!(serving_blocks(&m, true), 9);
        // Two sequences at the same positions never share a block.
        assert_eq!(serving_blocks(&meta(&[(8, 4), (8, 4)]), false), 2);
    }

    fn heads(num_heads: usize, num_kv_heads: usize, head_dim: usize) -> AttentionParams {
        AttentionParams {
            num_heads,
            num_kv_heads,
            head_dim,
            scale: 1.0,
            sliding_window: None,
            kv_scale: crate::KvScale::ONE,
        }
    }

    #[test]
    fn heads_of_a_kv_head_share_blocks_where_rows_do_not() {
        let head_group = |meta: &AttentionMetadata, params: AttentionParams| Cover::of(meta, &params, false).head_group;
        // Decode rows: gpt-oss's 8 heads a KV head in groups of 4, Llama's 4, 6 in 3, none for
        // MHA or a head past the kernel's largest.
        let decode = meta(&[(300, 1), (20, 1)]);
        assert_eq!(head_group(&decode, heads(64, 8, 64)), 4);
        assert_eq!(head_group(&decode, heads(32, 8, 128)), 4);
        assert_eq!(head_group(&decode, heads(12, 2, 64)), 3);
        assert_eq!(head_group(&decode, heads(8, 8, 64)), 1);
        assert_eq!(head_group(&decode, heads(8, 2, 256)), 1);
        // One block a row serves one head.
        assert_eq!(Cover::of(&decode, &heads(64, 8, 64), true).head_group, 1);
        // A verification window's rows share blocks under full attention, not under a window.
        let window = meta(&[(18, 8)]);
        assert_eq!(head_group(&window, heads(64, 8, 64)), 1);
        let windowed = AttentionParams {
            sliding_window: Some(128),
            ..heads(64, 8, 64)
        };
        assert_eq!(
            Cover::of(&window, &windowed, false),
            Cover {
                serving: 8,
                head_group: 4,
                one_a_row: false
            }
        );
    }

    #[test]
    fn few_rows_share_parts_and_many_do_not() {
        // An H100's 132 SMs, two blocks each: a decode row of 64 heads gets 4 blocks.
        assert_eq!(blocks_each(264, 1, 64), 4);
        assert_eq!(blocks_each(264, 2, 64), 2);
        assert_eq!(blocks_each(264, 1, 1), MAX_SPLITS);
        assert_eq!(blocks_each(264, 16, 64), 1);
    }
}
