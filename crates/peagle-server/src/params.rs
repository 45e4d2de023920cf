//! Request fields shared by completions and chat: read from the wire (defaults filled in,
//! OpenAI's spellings such as top_k -1 turned into the engine's) and turned into one engine
//! request per choice. Their ranges are the engine's to check (`Request::validate`); its
//! refusals become 400s naming the field.

use crate::error::ApiError;
use crate::harmony::Harmony;
use crate::protocol::sampling::SamplingRequest;
use crate::protocol::structured::Asked;
use peagle_engine::{GenerateParams, Penalties, Request, SamplingParams, StructuredOutput, TokenBans};
use peagle_models::SamplingDefaults;

/// Most choices per request.
pub const MAX_N: i64 = 16;
/// Most alternatives per token in logprobs (vLLM's default limit).
pub const MAX_LOGPROBS: i64 = 20;
/// Most stop strings, and most bytes in all of them, per request. Each is looked for after
/// every token; OpenAI takes 4, and no client we know of sends more than a few dozen.
pub const MAX_STOP_STRINGS: usize = 256;
pub const MAX_STOP_BYTES: usize = 16 << 10;
/// Most stop token ids per request.
pub const MAX_STOP_TOKEN_IDS: usize = 1024;
/// Most bad words, and most bytes in all of them, per request: each is checked after every
/// token, as a stop string is.
pub const MAX_BAD_WORDS: usize = 256;
pub const MAX_BAD_WORD_BYTES: usize = 16 << 10;

/// The sampling settings a request's choices share.
#[derive(Debug, Clone)]
pub struct ChoiceTemplate {
    pub n: usize,
    pub text: TextOptions,
    sampling: SamplingParams,
    ignore_eos: bool,
    min_tokens: usize,
    stop_token_ids: Vec<u32>,
    speculate: bool,
    /// The model's `max_new_tokens`: no choice generates more (vLLM's rule).
    max_tokens_cap: Option<usize>,
    truncation: Option<Truncation>,
    cache_salt: Option<String>,
    /// The structured output asked for; the route compiles it (`constrain`).
    pub structured: Option<Asked>,
}

/// vLLM's `truncate_prompt_tokens`: a prompt keeps only its last tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Truncation {
    Last(usize),
    /// The context's length of them (-1), as vLLM reads it: a prompt that long leaves no room
    /// for the answer and is then refused as too long.
    Context,
}

/// How a choice's tokens become its text, and what it reports of its prompt's scores.
#[derive(Debug, Clone)]
pub struct TextOptions {
    pub stop: Vec<String>,
    /// Keep the stop string or the stop token that ended the choice (vLLM's
    /// `include_stop_str_in_output`); by default neither is part of the text.
    pub include_stop: bool,
    /// Leave special tokens out of the text (vLLM's `skip_special_tokens`, default true).
    pub skip_special: bool,
    /// The prompt's tokens lead the choice's logprobs, with this many alternatives (a
    /// completion's `echo` with `logprobs`).
    pub echo_logprobs: Option<usize>,
    /// vLLM's `prompt_logprobs`: the prompt's scores apart, with this many alternatives.
    pub prompt_logprobs: Option<usize>,
    /// vLLM's `return_tokens_as_token_ids`: logprobs name each token `token_id:{id}`.
    pub tokens_as_ids: bool,
}

impl SamplingRequest {
    /// Reads the fields (400 naming one that cannot be read as the engine's). Fields the
    /// request leaves out take the model's `defaults`, then OpenAI's; `encode` is the model's
    /// tokenizer, without special tokens, for `bad_words`.
    pub fn check(
        &self,
        defaults: &SamplingDefaults,
        encode: impl Fn(&str) -> Result<Vec<u32>, ApiError>,
    ) -> Result<ChoiceTemplate, ApiError> {
        self.refused.check()?;
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_N).contains(&n) {
            return Err(ApiError::invalid(
                Some("n"),
                format!("n must be between 1 and {MAX_N}, got {n}"),
            ));
        }
        // OpenAI's default temperature is 1; 0 means greedy.
        let temperature = self.temperature.or(defaults.temperature).unwrap_or(1.0);
        let top_p = self.top_p.or(defaults.top_p).unwrap_or(1.0);
        let top_k = match self.top_k.or(defaults.top_k).unwrap_or(0) {
            -1 | 0 => 0,
            k if k > 0 => k as usize,
            k => {
                return Err(ApiError::invalid(
                    Some("top_k"),
                    format!("top_k must be -1 (off) or at least 1, got {k}"),
                ))
            }
        };
        let min_p = self.min_p.or(defaults.min_p).unwrap_or(0.0);
        let min_tokens = match self.min_tokens.unwrap_or(0) {
            m if m >= 0 => m as usize,
            m => {
                return Err(ApiError::invalid(
                    Some("min_tokens"),
                    format!("min_tokens must be at least 0, got {m}"),
                ))
            }
        };
        let stop_token_ids = self.stop_token_ids.clone().unwrap_or_default();
        if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return Err(ApiError::invalid(
                Some("stop_token_ids"),
                format!(
                    "at most {MAX_STOP_TOKEN_IDS} stop_token_ids, got {}",
                    stop_token_ids.len()
                ),
            ));
        }
        let stop = self.stop.as_ref().map(|s| s.strings()).unwrap_or_default();
        check_strings(&stop, "stop", MAX_STOP_STRINGS, MAX_STOP_BYTES)?;
        let bad_words = self.bad_words.as_deref().unwrap_or_default();
        check_strings(bad_words, "bad_words", MAX_BAD_WORDS, MAX_BAD_WORD_BYTES)?;
        let truncation = match self.truncate_prompt_tokens {
            None => None,
            Some(-1) => Some(Truncation::Context),
            Some(k) if k >= 1 => Some(Truncation::Last(k as usize)),
            Some(k) => {
                return Err(ApiError::invalid(
                    Some("truncate_prompt_tokens"),
                    format!("truncate_prompt_tokens must be -1 or at least 1, got {k}"),
                ))
            }
        };
        Ok(ChoiceTemplate {
            n: n as usize,
            text: TextOptions {
                stop,
                include_stop: self.include_stop_str_in_output.unwrap_or(false),
                skip_special: self.skip_special_tokens.unwrap_or(true),
                echo_logprobs: None,
                prompt_logprobs: self
                    .prompt_logprobs
                    .map(|v| logprobs_count(v, "prompt_logprobs"))
                    .transpose()?,
                tokens_as_ids: self.return_tokens_as_token_ids.unwrap_or(false),
            },
            sampling: SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                // A negative seed is its two's complement bits.
                seed: self.seed.map(|s| s as u64),
                penalties: self.penalties(defaults)?,
                bans: TokenBans::new(self.allowed_token_ids.clone(), bad_word_ids(bad_words, encode)?),
                structured: None,
            },
            ignore_eos: self.ignore_eos.unwrap_or(false),
            min_tokens,
            stop_token_ids,
            speculate: self.speculative.unwrap_or(true),
            max_tokens_cap: defaults.max_new_tokens,
            truncation,
            cache_salt: self.cache_salt.clone(),
            structured: self.structured.asked()?,
        })
    }

    fn penalties(&self, defaults: &SamplingDefaults) -> Result<Penalties, ApiError> {
        let logit_bias = self
            .logit_bias
            .iter()
            .flatten()
            .map(|(key, bias)| {
                let token = key.parse::<u32>().map_err(|_| {
                    ApiError::invalid(Some("logit_bias"), format!("logit_bias key {key:?} is not a token id"))
                })?;
                Ok((token, *bias))
            })
            .collect::<Result<_, ApiError>>()?;
        Ok(Penalties {
            presence: self.presence_penalty.unwrap_or(0.0),
            frequency: self.frequency_penalty.unwrap_or(0.0),
            repetition: self.repetition_penalty.or(defaults.repetition_penalty).unwrap_or(1.0),
            logit_bias,
        })
    }
}

impl ChoiceTemplate {
    /// Every choice's text follows `structured` (the compiled `self.structured`).
    pub fn constrain(&mut self, structured: StructuredOutput) {
        self.sampling.structured = Some(structured);
    }

    /// Choices of a harmony conversation: they end with the assistant's turn (on `<|return|>`
    /// or `<|call|>`), and keep harmony's special tokens in their text for the channel parser.
    pub fn speak_harmony(&mut self, harmony: &Harmony) {
        for id in &harmony.stop_token_ids {
            if !self.stop_token_ids.contains(id) {
                self.stop_token_ids.push(*id);
            }
        }
        self.text.skip_special = false;
    }

    /// The most tokens a prompt's text may make before it is cut (the context's length, or
    /// none when the request truncates its prompt), for `ServedModel::encode`'s check.
    pub fn tokens_before_truncation(&self, max_model_len: usize) -> usize {
        match self.truncation {
            Some(_) => usize::MAX,
            None => max_model_len,
        }
    }

    /// The prompt's last tokens, as many as `truncate_prompt_tokens` keeps (all without it).
    pub fn truncate(&self, mut ids: Vec<u32>, max_model_len: usize) -> Result<Vec<u32>, ApiError> {
        let keep = match self.truncation {
            None => return Ok(ids),
            Some(Truncation::Context) => max_model_len,
            Some(Truncation::Last(k)) if k > max_model_len => {
                return Err(ApiError::invalid(
                    Some("truncate_prompt_tokens"),
                    format!("truncate_prompt_tokens ({k}) must be at most the context length ({max_model_len})"),
                ))
            }
            Some(Truncation::Last(k)) => k,
        };
        ids.drain(..ids.len().saturating_sub(keep));
        Ok(ids)
    }

    /// The engine request for choice `i`. Seeded requests give their choices the seeds
    /// seed, seed + 1, ...: different from each other, the same on every run.
    pub fn request(&self, prompt: &[u32], max_tokens: usize, logprobs: Option<usize>, i: usize) -> Request {
        let mut sampling = self.sampling.clone();
        sampling.seed = sampling.seed.map(|s| s.wrapping_add(i as u64));
        Request {
            prompt: prompt.to_vec(),
            params: GenerateParams {
                max_tokens,
                sampling,
                ignore_eos: self.ignore_eos,
                min_tokens: self.min_tokens,
                stop_token_ids: self.stop_token_ids.clone(),
            },
            speculate: self.speculate,
            logprobs,
            prompt_logprobs: self.text.echo_logprobs.max(self.text.prompt_logprobs),
            cache_salt: self.cache_salt.clone(),
        }
    }

    /// A choice's generation budget: `requested` when given (at least 1, and prompt plus budget
    /// must fit the context), else `default` cut to the room left; then cut to the model's
    /// `max_new_tokens`, and leaving room for `min_tokens`.
    pub fn budget(
        &self,
        requested: Option<i64>,
        param: &str,
        default: usize,
        prompt_len: usize,
        max_model_len: usize,
    ) -> Result<usize, ApiError> {
        let room = max_model_len.saturating_sub(prompt_len);
        let budget = match requested {
            None => Ok(default.min(room)),
            Some(m) if m < 1 => Err(ApiError::invalid(
                Some(param),
                format!("{param} must be at least 1, got {m}"),
            )),
            Some(m) if m as usize > room => Err(ApiError::invalid(
                Some(param),
                format!(
                    "This model's maximum context length is {max_model_len} tokens. However, you requested {} tokens \
                     ({prompt_len} in the input, {m} in the completion). Please reduce the length of the input or \
                     of the completion.",
                    // Wide enough that a max_tokens near i64::MAX cannot overflow the sum.
                    prompt_len as u128 + m as u128
                ),
            )),
            Some(m) => Ok(m as usize),
        }?;
        let budget = self.max_tokens_cap.map_or(budget, |cap| budget.min(cap));
        if self.min_tokens > budget {
            return Err(ApiError::invalid(
                Some("min_tokens"),
                format!("min_tokens ({}) must be at most {param} ({budget})", self.min_tokens),
            ));
        }
        Ok(budget)
    }
}

/// At most `count` strings of `max_bytes` in all in the list field `param`.
fn check_strings(strings: &[String], param: &str, count: usize, max_bytes: usize) -> Result<(), ApiError> {
    let bytes: usize = strings.iter().map(String::len).sum();
    if strings.len() > count || bytes > max_bytes {
        return Err(ApiError::invalid(
            Some(param),
            format!(
                "at most {count} {param} of {max_bytes} bytes in all, got {} of {bytes} bytes",
                strings.len()
            ),
        ));
    }
    Ok(())
}

/// The token sequences `words` ban, as vLLM encodes them: each word without its leading
/// whitespace, then with one space before it where that encodes to as many tokens and begins
/// with another (a word-initial token, which the word has mid-text).
fn bad_word_ids(
    words: &[String],
    encode: impl Fn(&str) -> Result<Vec<u32>, ApiError>,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let mut ids = Vec::new();
    for word in words {
        let bare = encode(word.trim_start())?;
        if bare.is_empty() {
            return Err(ApiError::invalid(
                Some("bad_words"),
                format!("bad word {word:?} encodes to no token"),
            ));
        }
        let spaced = encode(&format!(" {}", word.trim_start()))?;
        let distinct = spaced.len() == bare.len() && spaced.first() != bare.first();
        ids.push(bare);
        if distinct {
            ids.push(spaced);
        }
    }
    Ok(ids)
}

/// Every id in `ids` (the field `param`) must be below `vocab_size`.
pub fn check_token_ids(ids: &[u32], vocab_size: usize, param: &str) -> Result<(), ApiError> {
    match ids.iter().find(|id| **id as usize >= vocab_size) {
        Some(bad) => Err(ApiError::invalid(
            Some(param),
            format!("token id {bad} is outside the vocabulary (size {vocab_size})"),
        )),
        None => Ok(()),
    }
}

/// One request may run at most `limit` sequences (prompts × n, `--max-sequences-per-request`):
/// each holds queue room, KV cache and memory for its text.
pub fn check_sequences(prompts: usize, n: usize, limit: usize) -> Result<(), ApiError> {
    let sequences = prompts.saturating_mul(n);
    if sequences <= limit {
        return Ok(());
    }
    Err(ApiError::invalid(
        Some("n"),
        format!(
            "this request asks for {sequences} sequences ({prompts} prompts × n = {n}); the server runs at most \
             {limit} per request"
        ),
    ))
}

/// A prompt must be non-empty and leave room for at least one generated token.
pub fn check_prompt(len: usize, max_model_len: usize, param: &str) -> Result<(), ApiError> {
    if len == 0 {
        return Err(ApiError::invalid(Some(param), format!("{param} is empty")));
    }
    if len >= max_model_len {
        return Err(prompt_too_long(len, max_model_len, param));
    }
    Ok(())
}

/// vLLM's refusal of a prompt that leaves no room in the context; `tokens` is its length, or a
/// bound on it ("at least 3000").
pub fn prompt_too_long(tokens: impl std::fmt::Display, max_model_len: usize, param: &str) -> ApiError {
    ApiError::invalid(
        Some(param),
        format!(
            "This model's maximum context length is {max_model_len} tokens. However, your request has {tokens} \
             input tokens. Please reduce the length of the input."
        ),
    )
}

/// `prompt_logprobs` come in a response, not a stream (vLLM's rule); with none asked for, a
/// stream is fine.
pub fn check_prompt_logprobs(template: &ChoiceTemplate, streaming: bool) -> Result<(), ApiError> {
    if streaming && template.text.prompt_logprobs.is_some_and(|k| k > 0) {
        return Err(ApiError::invalid(
            Some("prompt_logprobs"),
            "prompt_logprobs are not available when stream is true",
        ));
    }
    Ok(())
}

/// A logprobs count in 0..=MAX_LOGPROBS.
pub fn logprobs_count(value: i64, param: &str) -> Result<usize, ApiError> {
    match value {
        0..=MAX_LOGPROBS => Ok(value as usize),
        _ => Err(ApiError::invalid(
            Some(param),
            format!("{param} must be between 0 and {MAX_LOGPROBS}, got {value}"),
        )),
    }
}

#[cfg(test)]
#[path = "params_tests.rs"]
mod tests;
