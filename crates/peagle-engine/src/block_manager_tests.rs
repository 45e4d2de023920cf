use super::*;

#[test]
fn grow_shrink_release_account_for_every_block() {
    let mut m = BlockManager::new(6, 4);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    m.grow(&mut a, 9).unwrap();
    assert_eq!(a, vec![0, 1, 2]);
    m.grow(&mut b, 4).unwrap();
    assert_eq!(b, vec![3]);
    m.grow(&mut a, 12).unwrap();
    assert_eq!(a.len(), 3, "9 -> 12 tokens fits in the same blocks");
    m.shrink(&mut a, 5);
    assert_eq!(a, vec![0, 1]);
    assert_eq!(m.num_free(), 3);
    m.release(&mut b);
    m.release(&mut a);
    assert_eq!(m.num_free(), 6);
    assert_eq!(m.num_used(), 0);
}

#[test]
fn failed_grow_allocates_nothing() {
    let mut m = BlockManager::new(2, 4);
    let mut a = Vec::new();
    assert_eq!(m.grow(&mut a, 12), Err(OutOfBlocks { needed: 3, free: 2 }));
    assert!(a.is_empty());
    assert_eq!(m.num_free(), 2);
}

#[test]
fn freed_blocks_are_reused() {
    let mut m = BlockManager::new(3, 2);
    let mut a = Vec::new();
    m.grow(&mut a, 6).unwrap();
    m.shrink(&mut a, 2);
    let mut b = Vec::new();
    m.grow(&mut b, 4).unwrap();
    let mut all: Vec<u32> = a.iter().chain(&b).copied().collect();
    all.sort();
    assert_eq!(all, vec![0, 1, 2]);
}

const BS: usize = 4;

fn cached(num_blocks: usize) -> BlockManager {
    BlockManager::with_cache(num_blocks, BS, PrefixCache::new(num_blocks, true, "model"))
}

fn hashes(m: &BlockManager, tokens: &[u32]) -> Vec<BlockHash> {
    let mut h = Vec::new();
    m.cache().extend_hashes(&mut h, tokens, BS, None);
    h
}

/// A sequence of `tokens` that computed (and drafted) all of them, then finished.
fn run_and_finish(m: &mut BlockManager, tokens: &[u32], drafted: usize) -> Vec<u32> {
    let mut table = Vec::new();
    m.grow(&mut table, tokens.len()).unwrap();
    m.register(&table, &hashes(m, tokens), tokens, tokens.len(), drafted);
    let blocks = table.clone();
    m.release(&mut table);
    blocks
}

#[test]
fn a_finished_prefix_is_found_by_the_next_sequence_and_shared() {
    let mut m = cached(8);
    let first: Vec<u32> = (1..=10).collect();
    let blocks = run_and_finish(&mut m, &first, 0);
    assert_eq!(
        (m.num_used(), m.num_cached_free()),
        (0, 2),
        "two full blocks stay cached"
    );

    let mut second = first[..8].to_vec();
    second.extend([99, 98, 97]);
    let hit = m.lookup(&hashes(&m, &second), &second, 1, false);
    assert_eq!(hit, blocks[..2]);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    m.share(&mut a, &hit);
    m.share(&mut b, &hit);
    assert_eq!((m.num_used(), m.num_cached_free()), (2, 0));
    m.release(&mut a);
    assert_eq!(m.num_used(), 2, "still held by the other sequence");
    m.release(&mut b);
    assert_eq!((m.num_used(), m.num_cached_free()), (0, 2));
}

#[test]
fn a_hit_leaves_the_last_token_to_compute_and_stops_at_a_difference() {
    let mut m = cached(8);
    let tokens: Vec<u32> = (1..=8).collect();
    run_and_finish(&mut m, &tokens, 0);
    // All 8 tokens cached, but the last one must run to give logits: one block.
    assert_eq!(m.lookup(&hashes(&m, &tokens), &tokens, 1, false).len(), 1);
    let mut other = tokens.clone();
    other[5] = 77;
    other.push(3);
    assert_eq!(m.lookup(&hashes(&m, &other), &other, 1, false).len(), 1);
    other[0] = 77;
    assert!(m.lookup(&hashes(&m, &other), &other, 1, false).is_empty());
}

#[test]
fn drafter_rows_must_be_valid_and_end_before_the_same_token() {
    let mut m = cached(8);
    let tokens: Vec<u32> = (1..=12).collect();
    // The drafter read 9 positions: blocks 0 and 1 have valid drafter rows, block 2 not.
    run_and_finish(&mut m, &tokens, 9);
    let mut same = tokens.clone();
    same.push(50);
    assert_eq!(m.lookup(&hashes(&m, &same), &same, 1, false).len(), 3);
    assert_eq!(m.lookup(&hashes(&m, &same), &same, 1, true).len(), 2);
    // Block 1's last drafter row saw token 9 next; a sequence with another token there
    // keeps only block 0.
    let mut differs = tokens[..8].to_vec();
    differs.extend([60, 61]);
    assert_eq!(m.lookup(&hashes(&m, &differs), &differs, 1, true).len(), 1);
}

#[test]
fn eviction_takes_uncached_blocks_first_then_the_oldest_cached() {
    let mut m = cached(4);
    let old = run_and_finish(&mut m, &[1, 2, 3, 4], 0);
    let new = run_and_finish(&mut m, &[5, 6, 7, 8], 0);
    assert_eq!(m.num_cached_free(), 2);
    let mut table = Vec::new();
    m.grow(&mut table, 8).unwrap();
    assert_eq!(m.num_cached_free(), 2, "the two never-cached blocks went first");
    m.grow(&mut table, 12).unwrap();
    assert_eq!(table[2], old[0], "then the block freed longest ago");
    assert!(m
        .lookup(&hashes(&m, &[1, 2, 3, 4, 0]), &[1, 2, 3, 4, 0], 1, false)
        .is_empty());
    assert_eq!(m.lookup(&hashes(&m, &[5, 6, 7, 8, 0]), &[5, 6, 7, 8, 0], 1, false), new);
    // A block in use is never evicted: one cached free block is left, then none.
    m.grow(&mut table, 16).unwrap();
    assert_eq!(m.grow(&mut table, 20), Err(OutOfBlocks { needed: 1, free: 0 }));
}

#[test]
fn reset_forgets_every_prefix() {
    let mut m = cached(4);
    run_and_finish(&mut m, &[1, 2, 3, 4], 0);
    m.reset_cache();
    assert_eq!((m.num_free(), m.num_cached_free()), (4, 0));
    assert!(m
        .lookup(&hashes(&m, &[1, 2, 3, 4, 0]), &[1, 2, 3, 4, 0], 1, false)
        .is_empty());
}

#[test]
fn caching_off_finds_nothing() {
    let mut m = BlockManager::new(4, BS);
    run_and_finish(&mut m, &[1, 2, 3, 4], 4);
    assert_eq!(m.num_cached_free(), 0);
    assert!(m
        .lookup(&hashes(&m, &[1, 2, 3, 4, 0]), &[1, 2, 3, 4, 0], 1, true)
        .is_empty());
}
