//! Fixed-size KV blocks: a free list and per-sequence block tables.
//!
//! Growing a sequence takes blocks from the free list; shortening it (rolling back rejected
//! speculative tokens) returns only the blocks past the new end. Stale rows inside a kept
//! block need no clearing: the next write to those positions overwrites them.

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
    /// Free block ids; the lowest ids are handed out first.
    free: Vec<u32>,
}

impl BlockManager {
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0, "block size must be positive");
        Self {
            block_size,
            num_blocks,
            free: (0..num_blocks as u32).rev().collect(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    pub fn num_used(&self) -> usize {
        self.num_blocks - self.free.len()
    }

    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Makes `table` hold at least `tokens` tokens; on failure nothing is allocated.
    pub fn grow(&mut self, table: &mut Vec<u32>, tokens: usize) -> Result<(), OutOfBlocks> {
        let needed = self.blocks_for(tokens).saturating_sub(table.len());
        if needed > self.free.len() {
            return Err(OutOfBlocks {
                needed,
                free: self.free.len(),
            });
        }
        let at = self.free.len() - needed;
        table.extend(self.free.drain(at..).rev());
        Ok(())
    }

    /// Keeps only the blocks `tokens` tokens need and frees the rest.
    pub fn shrink(&mut self, table: &mut Vec<u32>, tokens: usize) {
        let keep = self.blocks_for(tokens).min(table.len());
        self.free.extend(table.drain(keep..).rev());
    }

    pub fn release(&mut self, table: &mut Vec<u32>) {
        self.shrink(table, 0);
    }
}

#[cfg(test)]
mod tests {
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
}
