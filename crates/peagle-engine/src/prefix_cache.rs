//! Automatic prefix caching, vLLM's: every full KV block a sequence has computed is kept
//! under a hash of its tokens and its parent block's hash (the model identity seeds the
//! chain), so a later prompt that starts with the same tokens takes those blocks instead of
//! recomputing them. The block manager owns the blocks; this is the index over them.
//!
//! The drafter's KV shares the blocks, and its row at position p pairs token p + 1 with the
//! target's state at p. So a block's drafter rows are valid only once the drafter has read
//! them, and its last row depends on the token after the block: each cached block records
//! that token, and a hit whose next token differs stops one block earlier (vLLM instead
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

    /// Extends `hashes` to every full block of `tokens`.
    pub fn extend_hashes(&self, hashes: &mut Vec<BlockHash>, tokens: &[u32], block_size: usize) {
        while (hashes.len() + 1) * block_size <= tokens.len() {
            let b = hashes.len();
            let mut h = DefaultHasher::new();
            hashes.last().copied().unwrap_or(self.root).hash(&mut h);
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
            if entry.tokens != span || (drafter && entry.drafter_next.is_none()) {
                break;
            }
            blocks.push(block);
        }
        if drafter {
            let end = blocks.len() * block_size;
            let last = blocks.last().and_then(|b| self.entries[*b as usize].as_ref());
            if last.is_some_and(|e| e.drafter_next != tokens.get(end).copied()) {
                blocks.pop();
            }
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
