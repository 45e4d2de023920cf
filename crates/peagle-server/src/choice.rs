//! One choice of a response, as the route sees it: a stream of text updates, made from the
//! engine's token events by a `ChoiceText` on the text workers. Dropping a `Choice` (client
//! gone) ends its worker, which cancels the engine request and frees its KV blocks.

use crate::choice_text::ChoiceText;
use crate::error::ApiError;
use crate::params::TextOptions;
use crate::protocol::{PromptPosition, StopReason, TokenLogprob};
use crate::state::AppState;
use peagle_engine::{FinishReason, Request};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub reason: FinishReason,
    /// The stop string or stop token id that ended the choice.
    pub stop_reason: Option<StopReason>,
    pub completion_tokens: usize,
    /// Prompt tokens the engine found in the prefix cache.
    pub cached_tokens: usize,
}

/// What one engine event added to a choice.
#[derive(Debug, Default)]
pub struct Update {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    /// Where logprobs are asked for, the bytes of `text` that came out at each of their tokens,
    /// in order: text held back (a possible stop string's start, a character's first bytes)
    /// comes out at the token that ends the wait. The rest of `text`, past theirs, came out
    /// as the choice ended.
    pub released: Vec<usize>,
    /// Positions of the prompt scored (`prompt_logprobs`).
    pub prompt_logprobs: Vec<Option<PromptPosition>>,
    /// Generated tokens this update adds to the choice's count.
    pub tokens: usize,
    /// Set on the last update.
    pub finish: Option<Finish>,
}

/// A finished choice, for non-streaming responses.
#[derive(Debug)]
pub struct Outcome {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    /// As `Update::released`, over the whole text.
    pub released: Vec<usize>,
    pub prompt_logprobs: Vec<Option<PromptPosition>>,
    pub finish: Finish,
}

pub struct Choice {
    updates: UnboundedReceiver<Result<Update, ApiError>>,
}

impl Choice {
    /// Submits a response's choices to the engine, all or none, and starts their text work;
    /// `arrived` is when the HTTP request came in (TTFT).
    pub fn start_all(
        state: &Arc<AppState>,
        requests: Vec<Request>,
        text: &TextOptions,
        arrived: Instant,
    ) -> Result<Vec<Self>, ApiError> {
        let texts = ChoiceText::start_all(state, requests, text, arrived)?;
        let choices = texts.into_iter().map(|worker| {
            let (updates, rx) = unbounded_channel();
            state.text_workers.spawn(run(worker, updates));
            Self { updates: rx }
        });
        Ok(choices.collect())
    }

    /// The next update, or None after the last one. An engine failure is an error and ends
    /// the choice.
    pub async fn next(&mut self) -> Option<Result<Update, ApiError>> {
        self.updates.recv().await
    }

    /// Runs the choice to its end.
    pub async fn collect(mut self) -> Result<Outcome, ApiError> {
        let mut text = String::new();
        let mut logprobs = Vec::new();
        let mut released = Vec::new();
        let mut prompt_logprobs = Vec::new();
        while let Some(update) = self.next().await {
            let update = update?;
            text.push_str(&update.text);
            logprobs.extend(update.logprobs);
            released.extend(update.released);
            prompt_logprobs.extend(update.prompt_logprobs);
            if let Some(finish) = update.finish {
                return Ok(Outcome {
                    text,
                    logprobs,
                    released,
                    prompt_logprobs,
                    finish,
                });
            }
        }
        Err(ApiError::internal("the choice ended without finishing"))
    }
}

/// Feeds a choice's updates to its route until the last one, or until the route drops the
/// choice.
async fn run(mut worker: ChoiceText, updates: UnboundedSender<Result<Update, ApiError>>) {
    loop {
        let update = tokio::select! {
            update = worker.next() => update,
            _ = updates.closed() => return,
        };
        let Some(update) = update else { return };
        if updates.send(update).is_err() {
            return;
        }
    }
}
