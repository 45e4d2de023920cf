//! Fixed-size KV blocks: free blocks, per-sequence block tables, and the prefix cache over
//! them.
//!
//! Growing a sequence takes blocks from the free ones; shortening it (rolling back rejected
//! speculative tokens) returns only the blocks past the new end. Stale rows inside a kept
//! block need no clearing: the next write to those positions overwrites them.
//!
//! A block may be held by several sequences (a shared cached prefix): it is free when none
//! holds it. A free block that is cached stays cached until a new block is needed and it is
//! the one freed longest ago; free blocks that hold nothing cached are handed out first.

use crate::prefix_cache::{BlockHash, PrefixCache};
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("KV cache full: {needed} more blocks needed, {free} free")]
pub struct OutOfBlocks {
    pub needed: usize,
    pub free: usize,
}

pub struct BlockManager {
    block_size: usize,
    num_blocks: usize,
    /// Free blocks holding nothing cached; the lowest ids are handed out first.
    free: Vec<u32>,
    /// How many block tables hold each block.
    holders: Vec<u32>,
    cache: PrefixCache,
}

impl BlockManager {
    /// A manager without prefix caching.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        Self::with_cache(num_blocks, block_size, PrefixCache::new(num_blocks, false, ""))
    }

    pub fn with_cache(num_blocks: usize, block_size: usize, cache: PrefixCache) -> Self {
        assert!(block_size > 0, "block size must be positive");
        Self {
            block_size,
            num_blocks,
            free: (0..num_blocks as u32).rev().collect(),
            holders: vec![0; num_blocks],
            cache,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Blocks no sequence holds, cached ones included.
    pub fn num_free(&self) -> usize {
        self.free.len() + self.cache.num_parked()
    }

    pub fn num_used(&self) -> usize {
        self.num_blocks - self.num_free()
    }

    /// Free blocks that still hold a cached prefix.
    pub fn num_cached_free(&self) -> usize {
        self.cache.num_parked()
    }

    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    pub fn cache(&self) -> &PrefixCache {
        &self.cache
    }

    /// Makes `table` hold at least `tokens` tokens; on failure nothing is allocated.
    pub fn grow(&mut self, table: &mut Vec<u32>, tokens: usize) -> Result<(), OutOfBlocks> {
        let needed = self.blocks_for(tokens).saturating_sub(table.len());
        if needed > self.num_free() {
            return Err(OutOfBlocks {
                needed,
                free: self.num_free(),
            });
        }
        for _ in 0..needed {
            let block = match self.free.pop() {
                Some(block) => block,
                None => self.cache.evict().expect("counted as free"),
            };
            self.holders[block as usize] = 1;
            table.push(block);
        }
        Ok(())
    }

    /// Adds cached `blocks` (a prefix hit) to an empty `table`.
    pub fn share(&mut self, table: &mut Vec<u32>, blocks: &[u32]) {
        debug_assert!(table.is_empty());
        for &block in blocks {
            if self.holders[block as usize] == 0 {
                self.cache.unpark(block);
            }
            self.holders[block as usize] += 1;
            table.push(block);
        }
    }

    /// Keeps only the blocks `tokens` tokens need and lets go of the rest, last first (so a
    /// prefix's tail is evicted before its head).
    pub fn shrink(&mut self, table: &mut Vec<u32>, tokens: usize) {
        let keep = self.blocks_for(tokens).min(table.len());
        for block in table.drain(keep..).rev() {
            let holders = &mut self.holders[block as usize];
            *holders -= 1;
            if *holders > 0 {
                continue;
            }
            match self.cache.is_cached(block) {
                true => self.cache.park(block),
                false => self.free.push(block),
            }
        }
    }

    pub fn release(&mut self, table: &mut Vec<u32>) {
        self.shrink(table, 0);
    }

    /// The cached blocks that start a sequence of `tokens` (whose block hashes are
    /// `hashes`), leaving at least its last `keep_out` tokens to compute; with `drafter`,
    /// only blocks whose drafter rows hold too.
    pub fn lookup(&self, hashes: &[BlockHash], tokens: &[u32], keep_out: usize, drafter: bool) -> Vec<u32> {
        if !self.cache.enabled() {
            return Vec::new();
        }
        let max_blocks = tokens.len().saturating_sub(keep_out) / self.block_size;
        self.cache.lookup(hashes, tokens, max_blocks, drafter, self.block_size)
    }

    /// Indexes the full blocks of `table` that hold the first `computed` tokens of `tokens`,
    /// the first `drafted` of them with valid drafter rows.
    pub fn register(&mut self, table: &[u32], hashes: &[BlockHash], tokens: &[u32], computed: usize, drafted: usize) {
        let bs = self.block_size;
        for (b, (&block, &hash)) in table.iter().zip(hashes).take(computed / bs).enumerate() {
            let end = (b + 1) * bs;
            let drafter_next = match end <= drafted {
                true => tokens.get(end).copied(),
                false => None,
            };
            self.cache.register(block, hash, &tokens[b * bs..end], drafter_next);
        }
    }

    /// Forgets every cached prefix (`POST /reset_prefix_cache`).
    pub fn reset_cache(&mut self) {
        let parked = self.cache.reset();
        self.free.extend(parked);
        self.free.sort_unstable_by(|a, b| b.cmp(a));
    }
}

#[cfg(test)]
#[path = "block_manager_tests.rs"]
mod tests;
