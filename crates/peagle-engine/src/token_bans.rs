//! vLLM's token constraints: `allowed_token_ids`, the only tokens a request may generate, and
//! `bad_words`, token sequences it must never generate. A banned token's logit becomes negative
//! infinity, so no way of choosing (greedy, sampled, on either device) can pick it while
//! another token is left.
//!
//! A bad word is the token ids its text encodes to (the server encodes it, with and without a
//! leading space, as vLLM does). Its last token is banned wherever the tokens generated before
//! it end with the rest of it; a one-token word is banned everywhere. Only generated tokens
//! count, not the prompt's (vLLM's rule), and a verification window's row i counts the drafts
//! before it as generated, as the penalties do.
//!
//! Constraints that leave a row no token (with the stop tokens `min_tokens` holds back, say)
//! give token 0 there, as every way of choosing does from a row of negative infinity;
//! `TokenBans::validate` refuses those that leave none whatever came before.

use thiserror::Error;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenBans {
    /// The only tokens that may be chosen, ascending and distinct; None allows every token.
    pub allowed: Option<Vec<u32>>,
    /// Token sequences never generated, each of at least one token.
    pub bad_words: Vec<Vec<u32>>,
}

/// A constraint that could never be met.
#[derive(Debug, Error, PartialEq)]
pub enum InvalidBans {
    #[error("allowed_token_ids must not be empty")]
    NoAllowedTokens,
    #[error("a bad word must encode to at least one token")]
    EmptyBadWord,
    #[error("bad_words ban every token allowed_token_ids allows")]
    EverythingBanned,
}

impl InvalidBans {
    /// The request field at fault.
    pub fn param(&self) -> &'static str {
        match self {
            Self::NoAllowedTokens => "allowed_token_ids",
            Self::EmptyBadWord | Self::EverythingBanned => "bad_words",
        }
    }
}

impl TokenBans {
    /// Only `allowed` (in any order, repeats ignored), and none of `bad_words`.
    pub fn new(allowed: Option<Vec<u32>>, bad_words: Vec<Vec<u32>>) -> Self {
        let allowed = allowed.map(|mut ids| {
            ids.sort_unstable();
            ids.dedup();
            ids
        });
        Self { allowed, bad_words }
    }

    pub fn is_off(&self) -> bool {
        self.allowed.is_none() && self.bad_words.is_empty()
    }

    /// Refuses constraints that leave no token whatever came before, or ban an empty word.
    pub fn validate(&self) -> Result<(), InvalidBans> {
        if self.bad_words.iter().any(Vec::is_empty) {
            return Err(InvalidBans::EmptyBadWord);
        }
        let Some(allowed) = &self.allowed else {
            return Ok(());
        };
        if allowed.is_empty() {
            return Err(InvalidBans::NoAllowedTokens);
        }
        let always_banned = |t: &u32| self.bad_words.iter().any(|w| w[..] == [*t]);
        if allowed.iter().all(always_banned) {
            return Err(InvalidBans::EverythingBanned);
        }
        Ok(())
    }

    /// Every token of a `vocab`-wide row banned after `generated` (the tokens generated so
    /// far, in order), each once or more, in no order.
    pub fn banned<'a>(&'a self, generated: &'a [u32], vocab: usize) -> impl Iterator<Item = u32> + 'a {
        let outside = self.allowed.iter().flat_map(move |allowed| not_in(allowed, vocab));
        let words = self.bad_words.iter().filter_map(move |word| {
            let (last, before) = word.split_last()?;
            generated.ends_with(before).then_some(*last)
        });
        outside.chain(words)
    }
}

/// The tokens below `vocab` missing from `sorted` (ascending, distinct), ascending.
fn not_in(sorted: &[u32], vocab: usize) -> impl Iterator<Item = u32> + '_ {
    let mut next = sorted.iter().peekable();
    (0..vocab as u32).filter(move |&t| {
        while next.next_if(|&&a| a < t).is_some() {}
        next.next_if_eq(&&t).is_none()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn banned(bans: &TokenBans, generated: &[u32], vocab: usize) -> Vec<u32> {
        let mut tokens: Vec<u32> = bans.banned(generated, vocab).collect();
        tokens.sort_unstable();
        tokens.dedup();
        tokens
    }

    #[test]
    fn tokens_outside_the_allowed_ones_are_banned() {
        let bans = TokenBans::new(Some(vec![7, 2, 2, 5]), Vec::new());
        assert_eq!(bans.allowed.as_deref(), Some(&[2, 5, 7][..]));
        assert_eq!(banned(&bans, &[], 9), [0, 1, 3, 4, 6, 8]);
        assert_eq!(banned(&bans, &[], 3), [0, 1], "a row narrower than the ids allowed");
        assert_eq!(banned(&TokenBans::default(), &[1, 2], 9), Vec::<u32>::new());
    }

    #[test]
    fn a_bad_words_last_token_is_banned_after_the_rest_of_it() {
        let bans = TokenBans::new(None, vec![vec![4], vec![1, 2, 3], vec![2, 6]]);
        assert_eq!(banned(&bans, &[], 10), [4], "the rest of a longer word is not out yet");
        assert_eq!(banned(&bans, &[9, 1], 10), [4]);
        assert_eq!(banned(&bans, &[9, 1, 2], 10), [3, 4, 6], "both words ending in 2");
        assert_eq!(banned(&bans, &[1, 2, 5], 10), [4]);
    }

    #[test]
    fn constraints_that_leave_nothing_are_refused() {
        assert_eq!(
            TokenBans::new(Some(vec![]), vec![]).validate(),
            Err(InvalidBans::NoAllowedTokens)
        );
        assert_eq!(
            TokenBans::new(None, vec![vec![]]).validate(),
            Err(InvalidBans::EmptyBadWord)
        );
        let everything = TokenBans::new(Some(vec![3, 1]), vec![vec![1], vec![3], vec![2, 3]]);
        assert_eq!(everything.validate(), Err(InvalidBans::EverythingBanned));
        assert_eq!(everything.validate().unwrap_err().param(), "bad_words");
        let one_left = TokenBans::new(Some(vec![3, 1]), vec![vec![1], vec![2, 3]]);
        assert_eq!(one_left.validate(), Ok(()));
    }
}
