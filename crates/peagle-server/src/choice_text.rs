//! A choice's text work: its engine events turned into text updates. Tokens are detokenized
//! incrementally, stop strings end the choice (dropping the engine receiver, which cancels
//! the request and frees its KV blocks at once), and latencies are recorded for /metrics.
//! Dropping it (client gone) cancels its request the same way. It runs on the text workers
//! (see `text_workers`), never on the I/O threads.

use crate::choice::{Finish, Update};
use crate::error::ApiError;
use crate::metrics::ChoiceEnd;
use crate::params::TextOptions;
use crate::protocol::{PromptLogprob, PromptPosition, StopReason, TokenLogprob};
use crate::state::AppState;
use crate::stop::StopChecker;
use peagle_engine::{Event, FinishReason, IncrementalDecoder, Request, TokenOutput};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

pub struct ChoiceText {
    state: Arc<AppState>,
    /// None once the engine request is over or cancelled.
    events: Option<UnboundedReceiver<Event>>,
    decoder: IncrementalDecoder,
    stop: StopChecker,
    /// The stop token that ends the choice stays in its text.
    include_stop: bool,
    skip_special: bool,
    /// Stop strings are looked for only in the text after this many tokens (vLLM's rule).
    min_tokens: usize,
    logprobs: bool,
    /// The prompt's scores lead the logprobs (echo), with this many alternatives.
    echo_logprobs: Option<usize>,
    /// The prompt's scores as `prompt_logprobs`, with this many alternatives.
    prompt_logprobs: Option<usize>,
    /// Logprobs name tokens by id (`token_id:{id}`), not by text.
    tokens_as_ids: bool,
    arrived: Instant,
    /// When the engine first scheduled it.
    scheduled: Option<Instant>,
    first_token: Option<Instant>,
    last_event: Option<Instant>,
    prompt_tokens: usize,
    completion_tokens: usize,
    cached_tokens: usize,
    text_offset: usize,
    finished: bool,
}

enum Next {
    Event(Option<Event>),
    Abort,
}

impl ChoiceText {
    /// Submits a response's choices to the engine, all or none; `arrived` is when the HTTP
    /// request came in (TTFT).
    pub fn start_all(
        state: &Arc<AppState>,
        requests: Vec<Request>,
        text: &TextOptions,
        arrived: Instant,
    ) -> Result<Vec<Self>, ApiError> {
        let tokenizer = state.model.tokenizer();
        let settings = requests
            .iter()
            .map(|r| {
                let decoder = IncrementalDecoder::after(tokenizer, &r.prompt)
                    .map_err(|e| ApiError::internal(format!("detokenizing the prompt: {e}")))?;
                Ok((decoder, r.logprobs.is_some(), r.params.min_tokens, r.prompt.len()))
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        let receivers = state.engine.submit_all(requests)?;
        let choices =
            receivers
                .into_iter()
                .zip(settings)
                .map(|(events, (decoder, logprobs, min_tokens, prompt_tokens))| Self {
                    state: state.clone(),
                    events: Some(events),
                    decoder,
                    stop: StopChecker::new(text.stop.clone(), text.include_stop),
                    include_stop: text.include_stop,
                    skip_special: text.skip_special,
                    min_tokens,
                    logprobs,
                    echo_logprobs: text.echo_logprobs,
                    prompt_logprobs: text.prompt_logprobs,
                    tokens_as_ids: text.tokens_as_ids,
                    arrived,
                    scheduled: None,
                    first_token: None,
                    last_event: None,
                    prompt_tokens,
                    completion_tokens: 0,
                    cached_tokens: 0,
                    text_offset: 0,
                    finished: false,
                });
        Ok(choices.collect())
    }

    /// The next update, or None after the last one. An engine failure is an error and ends
    /// the choice.
    pub async fn next(&mut self) -> Option<Result<Update, ApiError>> {
        let result = loop {
            let events = self.events.as_mut().filter(|_| !self.finished)?;
            let mut abort = self.state.abort.clone();
            let next = tokio::select! {
                event = events.recv() => Next::Event(event),
                Ok(_) = abort.wait_for(|abort| *abort) => Next::Abort,
            };
            break match next {
                Next::Event(Some(Event::Scheduled(at))) => {
                    self.scheduled(at);
                    continue;
                }
                Next::Event(Some(Event::PromptLogprobs(tokens))) => self.prompt(tokens),
                Next::Event(Some(Event::Tokens(tokens))) => self.tokens(tokens),
                Next::Event(Some(Event::Finished {
                    reason, cached_tokens, ..
                })) => {
                    self.cached_tokens = cached_tokens;
                    self.end(reason, None)
                }
                Next::Abort => self.end(FinishReason::Abort, None),
                Next::Event(Some(Event::Failed(message))) => Err(ApiError::internal(message)),
                Next::Event(None) => Err(ApiError::internal("the engine stopped before the request finished")),
            };
        };
        if result.is_err() {
            self.finish(FinishReason::Abort, None);
        }
        Some(result)
    }

    /// The prompt's tokens with their log-probabilities: leading the logprobs where echoed
    /// (entries only, the echoed text is the route's), and as `prompt_logprobs` where asked
    /// for, each with as many alternatives as its field asked for (the engine scored the
    /// larger count).
    fn prompt(&mut self, tokens: Vec<TokenOutput>) -> Result<Update, ApiError> {
        let mut update = Update::default();
        if let Some(top) = self.echo_logprobs {
            for t in &tokens {
                let alternatives = t.top_logprobs[..top.min(t.top_logprobs.len())].to_vec();
                let entry = self.logprob(&TokenOutput {
                    top_logprobs: alternatives,
                    ..t.clone()
                })?;
                update.logprobs.push(entry);
            }
        }
        if let Some(top) = self.prompt_logprobs {
            update.prompt_logprobs = tokens
                .iter()
                .map(|t| self.prompt_position(t, top))
                .collect::<Result<_, _>>()?;
        }
        Ok(update)
    }

    /// A prompt token's `prompt_logprobs` entry: the token, then its `top` alternatives (rank
    /// 1 first), each once, a token among them taking its place's rank (as vLLM's entries do);
    /// None for the first, which nothing predicts.
    fn prompt_position(&self, t: &TokenOutput, top: usize) -> Result<Option<PromptPosition>, ApiError> {
        let (Some(logprob), Some(rank)) = (t.logprob, t.rank) else {
            return Ok(None);
        };
        let model = &self.state.model;
        let entry = |id: u32, logprob: f32, rank: u32| {
            model.decode(&[id]).map(|decoded_token| {
                let entry = PromptLogprob {
                    logprob,
                    rank,
                    decoded_token,
                };
                (id, entry)
            })
        };
        let mut entries = vec![entry(t.id, logprob, rank)?];
        for (i, &(id, lp)) in t.top_logprobs.iter().take(top).enumerate() {
            match id == t.id {
                true => entries[0].1.rank = i as u32 + 1,
                false => entries.push(entry(id, lp, i as u32 + 1)?),
            }
        }
        Ok(Some(PromptPosition(entries)))
    }

    fn scheduled(&mut self, at: Instant) {
        self.scheduled = Some(at);
        self.state
            .metrics
            .queued(at.saturating_duration_since(self.arrived).as_secs_f64());
    }

    fn tokens(&mut self, tokens: Vec<TokenOutput>) -> Result<Update, ApiError> {
        let now = Instant::now();
        match self.last_event {
            None => {
                self.first_token = Some(now);
                self.state.metrics.first_token((now - self.arrived).as_secs_f64());
            }
            Some(last) => self.state.metrics.next_token((now - last).as_secs_f64()),
        }
        self.last_event = Some(now);
        let mut update = Update::default();
        for token in tokens {
            self.completion_tokens += 1;
            update.tokens += 1;
            if self.logprobs {
                update.logprobs.push(self.logprob(&token)?);
            }
            let silent =
                (token.stops && !self.include_stop) || self.skip_special && self.state.model.is_special(token.id);
            let piece = match silent {
                true => String::new(),
                false => self
                    .decoder
                    .push(self.state.model.tokenizer(), token.id)
                    .map_err(|e| ApiError::internal(format!("detokenizing: {e}")))?,
            };
            let (text, stop) = if self.completion_tokens <= self.min_tokens {
                (piece, None)
            } else {
                self.stop.push(&piece)
            };
            update.text.push_str(&text);
            if self.logprobs {
                update.released.push(text.len());
            }
            if let Some(stop) = stop {
                // Tokens after the stop string (same event) are not part of the answer.
                update.finish = Some(self.finish(FinishReason::Stop, Some(StopReason::Text(stop))));
                return Ok(update);
            }
        }
        Ok(update)
    }

    /// The engine is done (or the server gives up): release held-back text.
    fn end(&mut self, reason: FinishReason, stop_reason: Option<StopReason>) -> Result<Update, ApiError> {
        let piece = self
            .decoder
            .flush(self.state.model.tokenizer())
            .map_err(|e| ApiError::internal(format!("detokenizing: {e}")))?;
        let (mut text, stop) = self.stop.push(&piece);
        let finish = match stop {
            Some(stop) => self.finish(FinishReason::Stop, Some(StopReason::Text(stop))),
            None => {
                text.push_str(&self.stop.flush());
                self.finish(reason, stop_reason)
            }
        };
        Ok(Update {
            text,
            finish: Some(finish),
            ..Update::default()
        })
    }

    /// `stop_reason` is the stop string that ended the choice; a stop token names itself.
    fn finish(&mut self, reason: FinishReason, stop_reason: Option<StopReason>) -> Finish {
        self.finished = true;
        // Cancels the engine request if it is still running (stop string, abort).
        self.events = None;
        self.record_end(reason);
        let stop_token = match reason {
            FinishReason::StopToken(id) => Some(StopReason::Token(id)),
            _ => None,
        };
        Finish {
            reason,
            stop_reason: stop_reason.or(stop_token),
            completion_tokens: self.completion_tokens,
            cached_tokens: self.cached_tokens,
        }
    }

    fn record_end(&self, reason: FinishReason) {
        self.state.metrics.finished(ChoiceEnd {
            reason,
            seconds: self.arrived.elapsed().as_secs_f64(),
            inference_seconds: self.scheduled.map(|t| t.elapsed().as_secs_f64()),
            prefill_seconds: self
                .scheduled
                .zip(self.first_token)
                .map(|(s, f)| f.saturating_duration_since(s).as_secs_f64()),
            decode_seconds: self.first_token.map(|t| t.elapsed().as_secs_f64()),
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
        });
    }

    fn logprob(&mut self, t: &TokenOutput) -> Result<TokenLogprob, ApiError> {
        let model = &self.state.model;
        let text = model.decode(&[t.id])?;
        let top = t
            .top_logprobs
            .iter()
            .map(|(id, lp)| self.shown(*id).map(|s| (s, *lp)))
            .collect::<Result<_, _>>()?;
        let entry = TokenLogprob {
            logprob: t.logprob,
            top,
            text_offset: self.text_offset,
            token: match self.tokens_as_ids {
                true => token_id_name(t.id),
                false => text.clone(),
            },
        };
        // Special tokens keep their name in the entry but add no text (BOS, an ignored EOS).
        if !(self.skip_special && model.is_special(t.id)) {
            self.text_offset += text.chars().count();
        }
        Ok(entry)
    }

    /// How a logprobs entry names token `id`: its text, or vLLM's `token_id:{id}`
    /// (`return_tokens_as_token_ids`).
    fn shown(&self, id: u32) -> Result<String, ApiError> {
        match self.tokens_as_ids {
            true => Ok(token_id_name(id)),
            false => self.state.model.decode(&[id]),
        }
    }
}

/// vLLM's name of a token in logprobs under `return_tokens_as_token_ids`.
fn token_id_name(id: u32) -> String {
    format!("token_id:{id}")
}

impl Drop for ChoiceText {
    /// A choice dropped before its end was abandoned by its client.
    fn drop(&mut self) {
        if !self.finished {
            self.record_end(FinishReason::Abort);
        }
    }
}
