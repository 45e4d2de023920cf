//! How `kernels/paged_attention.cu`'s blocks cover a launch: which rows or heads share a
//! block, and how many blocks share each row's parts of the keys.
//!
//! A row's parts are fixed by its position (the kernel's `parts_of`); how many blocks walk them
//! only changes how soon. A launch of few rows gives each row's parts to several blocks, so
//! that a long context is read by many SMs at once; a launch of many rows already fills the
//! GPU, and gives each row one block, which folds its parts as it walks them.

use crate::attention_metadata::AttentionMetadata;
use crate::kernel_constants::{ATTN_GROUP, ATTN_HEAD_GROUPS_MAX_DIM, ATTN_MAX_SPLITS, ATTN_SPLIT_MIN};
use crate::paged_attention::{AttentionBlocks, AttentionParams};

/// The most parts a row has and the most rows a block serves.
pub(crate) const MAX_SPLITS: usize = ATTN_MAX_SPLITS;
const GROUP: usize = ATTN_GROUP;
/// The fewest positions a part of a row's keys holds.
pub(crate) const SPLIT_MIN: usize = ATTN_SPLIT_MIN;

/// The blocks of a head that serve rows: one a row under a window, and under full attention one
/// a group of up to GROUP consecutive positions of a sequence in an aligned group (the kernel's
/// `joins_previous`).
fn serving_blocks(rows: &[(usize, usize)], windowed: bool) -> usize {
    if windowed {
        return rows.len();
    }
    let joins = |w: &[(usize, usize)]| w[1].0 == w[0].0 && w[1].1 == w[0].1 + 1 && !w[1].1.is_multiple_of(GROUP);
    rows.len() - rows.windows(2).filter(|w| joins(w)).count()
}

/// The parts of the keys of the rows at `rows`' positions (the kernel's `parts_of`), each
/// serving its own block, summed: the blocks of one head that could walk them at once.
fn parts(rows: &[(usize, usize)], window: Option<usize>) -> usize {
    let span = |pos: usize| window.map_or(pos + 1, |w| w.min(pos + 1));
    rows.iter()
        .map(|&(_, pos)| span(pos).div_ceil(SPLIT_MIN).clamp(1, MAX_SPLITS))
        .sum()
}

/// How a launch's blocks cover its rows and heads, worked out once a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cover {
    /// The blocks of a head (or group of heads) that serve rows (`serving_blocks`).
    pub serving: usize,
    /// The query heads a block serves at one row (the kernel's `head_group`).
    pub head_group: usize,
    /// The blocks that share each row's parts: 1 where one block a row walks them.
    pub split: usize,
}

impl Cover {
    /// Covers a launch as `blocks` says, on a GPU that holds `resident` of the kernel's blocks at
    /// once.
    ///
    /// Heads: where no rows share a block and the head is small enough for the kernel of groups
    /// of heads, a block may serve the most heads of one KV head, up to GROUP, that divide its
    /// heads evenly, so that they read its keys once rather than once each. That leaves a
    /// launch a group's fraction of the blocks, each with the group's work. `ByBatch` groups
    /// them only where one head a block would have more blocks than the GPU holds, every part
    /// of every row a block (many rows, or rows long enough for many parts): there the launch
    /// waits on its reads, and the reads saved are time saved. A few short rows keep a block a
    /// head, every part in flight at once. `HeadGroups` groups wherever the kernel can; `OneARow`
    /// never.
    ///
    /// Parts: `OneARow` gives each row one block; else a launch whose serving blocks leave
    /// the GPU room gives each row's parts several (`blocks_each`).
    pub(crate) fn of(
        meta: &AttentionMetadata,
        params: &AttentionParams,
        blocks: AttentionBlocks,
        resident: usize,
    ) -> Self {
        let rows = meta.rows();
        let serving = serving_blocks(&rows, params.sliding_window.is_some());
        let per_kv_head = params.num_heads / params.num_kv_heads.max(1);
        let groupable = blocks != AttentionBlocks::OneARow
            && params.head_dim <= ATTN_HEAD_GROUPS_MAX_DIM
            && serving == rows.len()
            && (blocks == AttentionBlocks::HeadGroups
                || parts(&rows, params.sliding_window) * params.num_heads > resident);
        let head_group = match groupable {
            true => (1..=GROUP).rev().find(|g| per_kv_head.is_multiple_of(*g)).unwrap_or(1),
            false => 1,
        };
        let split = match blocks {
            AttentionBlocks::OneARow => 1,
            _ => blocks_each(resident, serving, params.num_heads / head_group),
        };
        Self {
            serving,
            head_group,
            split,
        }
    }
}

/// The blocks each row's parts get so that a launch's serving blocks about fill `resident`, the
/// blocks the GPU holds at once, given `serving` blocks of a column over `columns` columns (the
/// heads, or the groups of heads a block serves).
fn blocks_each(resident: usize, serving: usize, columns: usize) -> usize {
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
        assert_eq!(serving_blocks(&m.rows(), false), 4);
        assert_eq!(serving_blocks(&m.rows(), true), 9);
        // Two sequences at the same positions never share a block.
        assert_eq!(serving_blocks(&meta(&[(8, 4), (8, 4)]).rows(), false), 2);
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

    fn windowed(params: AttentionParams, window: usize) -> AttentionParams {
        AttentionParams {
            sliding_window: Some(window),
            ..params
        }
    }

    /// An H100's or H200's 132 SMs, two blocks each.
    const RESIDENT: usize = 264;

    fn head_group(meta: &AttentionMetadata, params: AttentionParams, blocks: AttentionBlocks) -> usize {
        Cover::of(meta, &params, blocks, RESIDENT).head_group
    }

    #[test]
    fn heads_of_a_kv_head_share_blocks_where_rows_do_not() {
        let grouped = |meta: &AttentionMetadata, params| head_group(meta, params, AttentionBlocks::HeadGroups);
        // Decode rows: gpt-oss's 8 heads a KV head in groups of 4, Llama's 4, 6 in 3, none for
        // MHA or a head past the kernel's largest.
        let decode = meta(&[(300, 1), (20, 1)]);
        assert_eq!(grouped(&decode, heads(64, 8, 64)), 4);
        assert_eq!(grouped(&decode, heads(32, 8, 128)), 4);
        assert_eq!(grouped(&decode, heads(12, 2, 64)), 3);
        assert_eq!(grouped(&decode, heads(8, 8, 64)), 1);
        assert_eq!(grouped(&decode, heads(8, 2, 256)), 1);
        // One block a row serves one head.
        assert_eq!(head_group(&decode, heads(64, 8, 64), AttentionBlocks::OneARow), 1);
        // A verification window's rows share blocks under full attention, not under a window.
        let window = meta(&[(18, 8)]);
        assert_eq!(grouped(&window, heads(64, 8, 64)), 1);
        let cover = Cover::of(
            &window,
            &windowed(heads(64, 8, 64), 128),
            AttentionBlocks::HeadGroups,
            RESIDENT,
        );
        assert_eq!((cover.serving, cover.head_group), (8, 4));
    }

    #[test]
    fn by_batch_groups_heads_only_where_a_block_a_head_would_overfill_the_gpu() {
        let by_batch = |seqs: &[(usize, usize)], params| head_group(&meta(seqs), params, AttentionBlocks::ByBatch);
        let (gpt_oss, llama) = (heads(64, 8, 64), heads(32, 8, 128));
        // A short decode row keeps a block a head: 64 blocks, every part in flight.
        assert_eq!(by_batch(&[(1024, 1)], gpt_oss), 1);
        // One of 8192 positions has 8 parts a head: 512 blocks.
        assert_eq!(by_batch(&[(8192, 1)], gpt_oss), 4);
        // Llama's 32 heads reach 264 only past 8192 positions (16 parts).
        assert_eq!(by_batch(&[(8192, 1)], llama), 1);
        assert_eq!(by_batch(&[(16384, 1)], llama), 4);
        // Sixteen short decode rows: 1024 blocks.
        assert_eq!(by_batch(&[(1024, 1); 16], gpt_oss), 4);
        // Under a window of 128, a row is one part however long its context.
        assert_eq!(by_batch(&[(8192, 1)], windowed(gpt_oss, 128)), 1);
        assert_eq!(by_batch(&[(2048, 2048)], windowed(gpt_oss, 128)), 4);
    }

    #[test]
    fn few_rows_share_parts_and_many_do_not() {
        // A decode row of 64 heads gets 4 blocks; grouped by 4, 16.
        assert_eq!(blocks_each(RESIDENT, 1, 64), 4);
        assert_eq!(blocks_each(RESIDENT, 1, 16), 16);
        assert_eq!(blocks_each(RESIDENT, 2, 64), 2);
        assert_eq!(blocks_each(RESIDENT, 1, 1), MAX_SPLITS);
        assert_eq!(blocks_each(RESIDENT, 16, 64), 1);
        let split = |blocks| Cover::of(&meta(&[(8192, 1)]), &heads(64, 8, 64), blocks, RESIDENT).split;
        assert_eq!(split(AttentionBlocks::OneARow), 1);
        assert_eq!(split(AttentionBlocks::ByBatch), 16);
    }
}
