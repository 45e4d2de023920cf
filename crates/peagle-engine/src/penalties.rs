//! Logit adjustments a request asks for before its token is chosen: OpenAI's `logit_bias`,
//! presence and frequency penalties, vLLM's repetition penalty, and `min_tokens`, which holds
//! back the stop tokens until that many tokens are out. They apply to greedy and sampled
//! requests alike, in vLLM's order: bias, stop tokens held back, then the penalties.
//!
//! Each depends on the tokens before the one being chosen. Row i of a verification window
//! follows the sequence and drafts `d1..di`, and it only decides a token when those drafts
//! were accepted, so it counts them as generated: speculation then chooses exactly the tokens
//! plain decoding would.

use std::collections::{HashMap, HashSet};

#[derive(Debug, Clone, PartialEq)]
pub struct Penalties {
    /// Subtracted once from every token already generated (OpenAI, -2 to 2; 0 is off).
    pub presence: f32,
    /// Subtracted per occurrence in the generated tokens (OpenAI, -2 to 2; 0 is off).
    pub frequency: f32,
    /// Divides positive and multiplies negative logits of tokens in the prompt or output
    /// (vLLM; 1 is off, above 1 discourages repeats).
    pub repetition: f32,
    /// Added to the logits of these tokens (OpenAI `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for Penalties {
    fn default() -> Self {
        Self {
            presence: 0.0,
            frequency: 0.0,
            repetition: 1.0,
            logit_bias: Vec::new(),
        }
    }
}

impl Penalties {
    pub fn is_off(&self) -> bool {
        *self == Self::default()
    }

    /// Adjusts `logits` for the token after `history`.
    pub fn apply(&self, logits: &mut (impl LogitsMut + ?Sized), history: &History) {
        for &(token, bias) in &self.logit_bias {
            if let Some(l) = logits.logit_mut(token) {
                *l += bias;
            }
        }
        if self.repetition != 1.0 {
            for &token in history.output.keys().chain(history.prompt_only()) {
                if let Some(l) = logits.logit_mut(token) {
                    *l = if *l > 0.0 {
                        *l / self.repetition
                    } else {
                        *l * self.repetition
                    };
                }
            }
        }
        for (&token, &count) in &history.output {
            if let Some(l) = logits.logit_mut(token) {
                *l -= self.frequency * count as f32 + self.presence;
            }
        }
    }

    /// Every token `apply` may change after `history`, each once or more, in no order.
    pub fn touched<'a>(&'a self, history: &'a History) -> impl Iterator<Item = u32> + 'a {
        let repeats = self.repetition != 1.0;
        let output = repeats || self.frequency != 0.0 || self.presence != 0.0;
        let biased = self.logit_bias.iter().map(|(token, _)| token);
        let output = output.then_some(history.output.keys()).into_iter().flatten();
        let prompt = repeats.then_some(&history.prompt).into_iter().flatten();
        biased.chain(output).chain(prompt).copied()
    }
}

/// Logits an adjustment writes to, by token: a whole row, or the few values of one that an
/// adjustment touches.
pub trait LogitsMut {
    /// The token's logit; None for a token outside the row.
    fn logit_mut(&mut self, token: u32) -> Option<&mut f32>;

    /// The tokens of the whole row: 0 to this.
    fn vocab(&self) -> usize;
}

impl LogitsMut for [f32] {
    fn logit_mut(&mut self, token: u32) -> Option<&mut f32> {
        self.get_mut(token as usize)
    }

    fn vocab(&self) -> usize {
        self.len()
    }
}

/// The tokens before the one being chosen, as the penalties read them.
pub struct History {
    /// Occurrences of each generated token.
    output: HashMap<u32, u32>,
    /// The prompt's distinct tokens.
    prompt: HashSet<u32>,
    /// The generated tokens, in order.
    generated: Vec<u32>,
}

impl History {
    pub fn new(prompt: &[u32], generated: &[u32]) -> Self {
        let mut history = Self {
            output: HashMap::new(),
            prompt: prompt.iter().copied().collect(),
            generated: Vec::with_capacity(generated.len()),
        };
        for &token in generated {
            history.push(token);
        }
        history
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.generated.len()
    }

    /// The tokens generated so far, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.generated
    }

    pub fn push(&mut self, token: u32) {
        *self.output.entry(token).or_default() += 1;
        self.generated.push(token);
    }

    /// Undoes the last `push`, which was of `token`.
    pub fn pop(&mut self, token: u32) {
        match self.output.get_mut(&token) {
            Some(1) => {
                self.output.remove(&token);
            }
            Some(count) => *count -= 1,
            None => panic!("popped token {token}, which was never pushed"),
        }
        assert_eq!(
            self.generated.pop(),
            Some(token),
            "popped a token that was not the last pushed"
        );
    }

    /// Prompt tokens that were not generated: the repetition penalty applies once per token.
    fn prompt_only(&self) -> impl Iterator<Item = &u32> {
        self.prompt.iter().filter(|t| !self.output.contains_key(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn penalties_follow_the_openai_and_vllm_formulas() {
        let history = History::new(&[0, 1], &[2, 2, 3, 1]);
        let penalties = Penalties {
            presence: 0.5,
            frequency: 0.25,
            repetition: 2.0,
            logit_bias: vec![(4, 3.0), (0, -1.0)],
        };
        let mut logits = vec![1.0, -1.0, 4.0, 2.0, 0.5, 1.0];
        penalties.apply(&mut logits[..], &history);
        // 0: bias then prompt repeat: (1 - 1) = 0, not positive, so * 2 = 0.
        // 1: prompt and output once: -1 * 2 - 0.25 - 0.5.
        // 2: output twice: 4 / 2 - 0.5 - 0.5. 3: output once: 2 / 2 - 0.25 - 0.5.
        // 4: bias only. 5: untouched.
        assert_eq!(logits, vec![0.0, -2.75, 1.0, 0.25, 3.5, 1.0]);
    }

    #[test]
    fn defaults_are_off_and_leave_logits_alone() {
        let penalties = Penalties::default();
        assert!(penalties.is_off());
        let mut logits = vec![1.0, -2.0, 3.0];
        penalties.apply(&mut logits[..], &History::new(&[0, 1], &[2, 2]));
        assert_eq!(logits, vec![1.0, -2.0, 3.0]);
    }

    #[test]
    fn a_token_out_of_the_vocabulary_is_ignored() {
        let penalties = Penalties {
            logit_bias: vec![(7, 5.0)],
            frequency: 1.0,
            ..Penalties::default()
        };
        let mut logits = vec![0.0, 0.0];
        penalties.apply(&mut logits[..], &History::new(&[], &[9]));
        assert_eq!(logits, vec![0.0, 0.0]);
    }
}
