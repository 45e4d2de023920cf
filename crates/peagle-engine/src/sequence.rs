//! One generation stream: its tokens, how many of them are in the KV cache, and its blocks.

pub struct Sequence {
    /// Prompt followed by generated tokens.
    pub token_ids: Vec<u32>,
    pub num_prompt_tokens: usize,
    /// Leading tokens whose keys and values are in the cache.
    pub num_cached: usize,
    pub block_table: Vec<u32>,
}

impl Sequence {
    pub fn new(prompt: Vec<u32>) -> Self {
        Self {
            num_prompt_tokens: prompt.len(),
            token_ids: prompt,
            num_cached: 0,
            block_table: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.token_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }

    pub fn generated(&self) -> &[u32] {
        &self.token_ids[self.num_prompt_tokens..]
    }

    /// Tokens not yet in the cache: the rest of the prompt, or the last sampled token.
    pub fn uncached(&self) -> &[u32] {
        &self.token_ids[self.num_cached..]
    }
}
