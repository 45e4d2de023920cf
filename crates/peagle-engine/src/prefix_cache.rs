//! Automatic prefix caching, vLLM's: every full KV block a sequence has computed is kept
//! under a hash of its tokens and its parent block's hash (the model identity seeds the
//! chain), so a later prompt that starts with the same tokens takes those blocks instead of
//! recomputing them; a request's cache salt seeds its chain too, so that only requests with
//! the same salt share blocks. The block manager owns the blocks; this is the index over them.
//!
//! The drafter's KV shares the blocks, and its row at position p pairs token p + 1 with the
//! target's state at p. So a block's drafter rows are valid only once the drafter has read
//! them, and its last row depends on the token after the block: each cached block records
//! that token, and a hit stops at the first block whose next token differs (vLLM instead
//! always recomputes the last hit block when a drafter runs).

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

pub type BlockHash = u64;

/// What a cached block holds.
struct Entry {
    hash: BlockHash,
    tokens: Vec<u32>,
    /// Set once the drafter's rows are valid: the token after the block that its last row
    /// was computed with.
    drafter_next: Option<u32>,
}

pub struct PrefixCache {
    enabled: bool,
    root: BlockHash,
    by_hash: HashMap<BlockHash, u32>,
    /// Per block id.
    entries: Vec<Option<Entry>>,
    /// Cached blocks no sequence holds, by when they were freed: evicted oldest first.
    free: BTreeMap<u64, u32>,
    freed_at: Vec<u64>,
    clock: u64,
}

impl PrefixCache {
    /// `identity` names the model and drafter whose KV the blocks hold.
    pub fn new(num_blocks: usize, enabled: bool, identity: &str) -> Self {
        let mut h = DefaultHasher::new();
        identity.hash(&mut h);
        Self {
            enabled,
            root: h.finish(),
            by_hash: HashMap::new(),
            entries: (0..num_blocks).map(|_| None).collect(),
            free: BTreeMap::new(),
            freed_at: vec![0; num_blocks],
            clock: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Extends `hashes` to every full block of `tokens`, a chain that `salt` seeds when given.
    pub fn extend_hashes(&self, hashes: &mut Vec<BlockHash>, tokens: &[u32], block_size: usize, salt: Option<&str>) {
        let root = || match salt {
            None => self.root,
            Some(salt) => {
                let mut h = DefaultHasher::new();
                (self.root, salt).hash(&mut h);
                h.finish()
            }
        };
        while (hashes.len() + 1) * block_size <= tokens.len() {
            let b = hashes.len();
            let mut h = DefaultHasher::new();
            hashes.last().copied().unwrap_or_else(root).hash(&mut h);
            tokens[b * block_size..(b + 1) * block_size].hash(&mut h);
            hashes.push(h.finish());
        }
    }

    /// The longest run of cached blocks that starts `tokens`, at most `max_blocks` long;
    /// with `drafter`, only blocks whose drafter rows hold for these tokens.
    pub fn lookup(
        &self,
        hashes: &[BlockHash],
        tokens: &[u32],
        max_blocks: usize,
        drafter: bool,
        block_size: usize,
    ) -> Vec<u32> {
        let mut blocks = Vec::new();
        for (b, hash) in hashes.iter().take(max_blocks).enumerate() {
            let Some(&block) = self.by_hash.get(hash) else {
                break;
            };
            let entry = self.entries[block as usize]
                .as_ref()
                .expect("indexed blocks have entries");
            let span = &tokens[b * block_size..(b + 1) * block_size];
            // Every block's, not only the last's: a chain's blocks may come from sequences
            // that went on differently after them (the hash of a block computed again stays
            // with the first that had drafter rows).
            let next = tokens.get((b + 1) * block_size).copied();
            if entry.tokens != span || (drafter && entry.drafter_next != next) {
                break;
            }
            blocks.push(block);
        }
        blocks
    }

    /// Indexes block `block`, full with `tokens`, under `hash`; `drafter_next` when its
    /// drafter rows are valid. A block already indexed gains its drafter rows; a hash already
    /// held by another block moves here only when this one adds drafter rows.
    pub fn register(&mut self, block: u32, hash: BlockHash, tokens: &[u32], drafter_next: Option<u32>) {
        if !self.enabled {
            return;
        }
        if let Some(entry) = self.entries[block as usize].as_mut() {
            if entry.drafter_next.is_none() {
                entry.drafter_next = drafter_next;
            }
            return;
        }
        if let Some(&other) = self.by_hash.get(&hash) {
            let other_has_drafter = self.entries[other as usize]
                .as_ref()
                .is_some_and(|e| e.drafter_next.is_some());
            if other_has_drafter || drafter_next.is_none() {
                return;
            }
            self.entries[other as usize] = None;
        }
        self.by_hash.insert(hash, block);
        self.entries[block as usize] = Some(Entry {
            hash,
            tokens: tokens.to_vec(),
            drafter_next,
        });
    }

    pub fn is_cached(&self, block: u32) -> bool {
        self.entries[block as usize].is_some()
    }

    /// A cached block no sequence holds any more: kept until evicted.
    pub fn park(&mut self, block: u32) {
        self.clock += 1;
        self.freed_at[block as usize] = self.clock;
        self.free.insert(self.clock, block);
    }

    /// A parked block a sequence takes again.
    pub fn unpark(&mut self, block: u32) {
        self.free.remove(&self.freed_at[block as usize]);
    }

    pub fn num_parked(&self) -> usize {
        self.free.len()
    }

    /// Evicts the parked block freed longest ago and returns it, forgotten.
    pub fn evict(&mut self) -> Option<u32> {
        let (_, block) = self.free.pop_first()?;
        self.forget(block);
        Some(block)
    }

    /// Forgets every cached block; returns the parked ones, now plain free blocks.
    pub fn reset(&mut self) -> Vec<u32> {
        let parked: Vec<u32> = std::mem::take(&mut self.free).into_values().collect();
        self.by_hash.clear();
        self.entries.iter_mut().for_each(|e| *e = None);
        parked
    }

    fn forget(&mut self, block: u32) {
        if let Some(entry) = self.entries[block as usize].take() {
            if self.by_hash.get(&entry.hash) == Some(&block) {
                self.by_hash.remove(&entry.hash);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: usize = 4;

    /// A hit with a drafter takes no block whose drafter rows were computed with another next
    /// token, though a later block of the chain was computed with the right ones.
    #[test]
    fn a_drafter_hit_stops_at_the_first_block_that_went_on_differently() {
        let mut cache = PrefixCache::new(8, true, "model");
        let first = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        let then = [1, 2, 3, 4, 7, 7, 7, 7, 9];
        let hashes = |tokens: &[u32]| {
            let mut hashes = Vec::new();
            cache.extend_hashes(&mut hashes, tokens, BS, None);
            hashes
        };
        let (a, c) = (hashes(&first), hashes(&then));
        cache.register(0, a[0], &first[..4], Some(5));
        cache.register(1, a[1], &first[4..8], Some(9));
        // `then` computed its first block again, which stays unindexed, then its own second.
        cache.register(2, c[0], &then[..4], Some(7));
        cache.register(3, c[1], &then[4..8], Some(9));
        assert_eq!(cache.lookup(&a, &first, 2, true, BS), [0, 1]);
        assert_eq!(cache.lookup(&c, &then, 2, true, BS), [] as [u32; 0]);
        assert_eq!(cache.lookup(&c, &then, 2, false, BS), [0, 3]);
        // The last block's next token decides too; without one, the block is left out.
        assert_eq!(cache.lookup(&a, &first[..8], 2, true, BS), [0]);
    }
}
