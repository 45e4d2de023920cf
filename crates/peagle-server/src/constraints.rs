//! The structured outputs requests ask for, compiled against the served model's vocabulary:
//! the vocabulary's token bytes are read once, and the last compiled constraints are kept, so
//! a client that sends the same schema each time compiles it once, and the tokens each
//! parse state allows (what a constraint remembers) are found once for all its requests.

use crate::error::ApiError;
use crate::protocol::structured::Asked;
use peagle_grammar::{Constraint, Vocabulary};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};
use tokenizers::Tokenizer;

/// How many compiled constraints are kept (each remembers up to about 10 MiB of its states'
/// tokens and steps, `peagle_grammar::constraint`).
const KEPT: usize = 16;

#[derive(Default)]
pub struct Constraints {
    vocabulary: OnceLock<Result<Arc<Vocabulary>, String>>,
    /// The most recently used last.
    kept: Mutex<VecDeque<(String, Arc<Constraint>)>>,
}

impl Constraints {
    /// `asked` compiled for the model of `tokenizer` (400 naming the field where it cannot
    /// be). The first parse state's tokens are found here, off the engine's thread.
    pub fn compile(&self, tokenizer: &Tokenizer, asked: &Asked) -> Result<Arc<Constraint>, ApiError> {
        let key = asked.spec.key();
        {
            let mut kept = self.kept.lock().expect("no panic holds the lock");
            if let Some(i) = kept.iter().position(|(k, _)| *k == key) {
                let entry = kept.remove(i).expect("the position is in the list");
                let constraint = entry.1.clone();
                kept.push_back(entry);
                return Ok(constraint);
            }
        }
        let vocabulary = self
            .vocabulary
            .get_or_init(|| {
                Vocabulary::from_tokenizer(tokenizer)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|e| {
                ApiError::invalid(
                    Some(asked.param),
                    format!(
                        "{}: structured output is not supported for this model: {e}",
                        asked.param
                    ),
                )
            })?;
        let grammar = asked
            .spec
            .compile(&vocabulary)
            .map_err(|e| ApiError::invalid(Some(asked.param), format!("{}: {e}", asked.param)))?;
        let constraint = Arc::new(Constraint::new(grammar, vocabulary));
        constraint.allowed(&constraint.start());
        let mut kept = self.kept.lock().expect("no panic holds the lock");
        if kept.len() >= KEPT {
            kept.pop_front();
        }
        kept.push_back((key, constraint.clone()));
        Ok(constraint)
    }
}
