//! A flattened batch's attention metadata whose sequences' blocks interleave in the cache, as a
//! busy block manager leaves them. Shared by the paged-attention example and the GPU tests.

use peagle_kernels::AttentionMetadata;

/// Sequences of `(context length, query rows)`: the last `rows` positions of each are the
/// batch's query rows, and sequence s's logical block b is the cache's block
/// `b * sequences + s`, so the cache holds `sequences` times the longest's blocks.
pub fn interleaved_batch(seqs: &[(usize, usize)], block_size: usize) -> AttentionMetadata {
    let mut meta = AttentionMetadata {
        block_size,
        query_start: vec![0],
        ..Default::default()
    };
    for (s, &(len, rows)) in seqs.iter().enumerate() {
        let table: Vec<u32> = (0..len.div_ceil(block_size))
            .map(|b| (b * seqs.len() + s) as u32)
            .collect();
        for pos in len - rows..len {
            meta.slot_mapping
                .push(table[pos / block_size] * (block_size as u32) + (pos % block_size) as u32);
        }
        meta.query_start.push(meta.query_start.last().unwrap() + rows);
        meta.context_lens.push(len);
        meta.block_tables.push(table);
    }
    meta
}
