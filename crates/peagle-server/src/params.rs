//! Request fields shared by completions and chat: checked (400 naming the field) and turned
//! into one engine request per choice.

use crate::error::ApiError;
use crate::protocol::Stop;
use peagle_engine::{GenerateParams, Request, SamplingParams};

/// Most choices per request.
pub const MAX_N: i64 = 16;
/// Most alternatives per token in logprobs (vLLM's default limit).
pub const MAX_LOGPROBS: i64 = 20;

pub struct SamplingFields<'a> {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub seed: Option<u64>,
    pub stop: Option<&'a Stop>,
    pub n: Option<i64>,
    pub ignore_eos: Option<bool>,
    pub speculative: Option<bool>,
}

/// Checked sampling settings, shared by a request's choices.
#[derive(Debug, Clone)]
pub struct Plan {
    pub n: usize,
    pub stop: Vec<String>,
    sampling: SamplingParams,
    ignore_eos: bool,
    speculate: bool,
}

impl SamplingFields<'_> {
    pub fn check(&self) -> Result<Plan, ApiError> {
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_N).contains(&n) {
            return Err(ApiError::invalid(
                Some("n"),
                format!("n must be between 1 and {MAX_N}, got {n}"),
            ));
        }
        // OpenAI's default temperature is 1; 0 means greedy.
        let temperature = self.temperature.unwrap_or(1.0);
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(ApiError::invalid(
                Some("temperature"),
                format!("temperature must be a number >= 0, got {temperature}"),
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(
                Some("top_p"),
                format!("top_p must be in (0, 1], got {top_p}"),
            ));
        }
        let top_k = match self.top_k.unwrap_or(0) {
            -1 | 0 => 0,
            k if k > 0 => k as usize,
            k => {
                return Err(ApiError::invalid(
                    Some("top_k"),
                    format!("top_k must be -1 (off) or at least 1, got {k}"),
                ))
            }
        };
        Ok(Plan {
            n: n as usize,
            stop: self.stop.map(Stop::strings).unwrap_or_default(),
            sampling: SamplingParams {
                temperature,
                top_k,
                top_p,
                seed: self.seed,
            },
            ignore_eos: self.ignore_eos.unwrap_or(false),
            speculate: self.speculative.unwrap_or(true),
        })
    }
}

impl Plan {
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
            },
            speculate: self.speculate,
            logprobs,
            prompt_logprobs: None,
        }
    }
}

/// A prompt must be non-empty and leave room for at least one generated token.
pub fn check_prompt(len: usize, max_model_len: usize, param: &str) -> Result<(), ApiError> {
    if len == 0 {
        return Err(ApiError::invalid(Some(param), format!("{param} is empty")));
    }
    if len >= max_model_len {
        return Err(ApiError::invalid(
            Some(param),
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, your request has {len} \
                 input tokens. Please reduce the length of the input."
            ),
        ));
    }
    Ok(())
}

/// The generation budget: `requested` when given (at least 1, and prompt plus budget must fit
/// the context), else `default` cut to the room left.
pub fn max_tokens(
    requested: Option<i64>,
    param: &str,
    default: usize,
    prompt_len: usize,
    max_model_len: usize,
) -> Result<usize, ApiError> {
    let room = max_model_len.saturating_sub(prompt_len);
    match requested {
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
                prompt_len as i64 + m
            ),
        )),
        Some(m) => Ok(m as usize),
    }
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
mod tests {
    use super::*;

    fn fields() -> SamplingFields<'static> {
        SamplingFields {
            temperature: None,
            top_p: None,
            top_k: None,
            seed: Some(7),
            stop: None,
            n: Some(3),
            ignore_eos: None,
            speculative: None,
        }
    }

    #[test]
    fn choices_get_consecutive_seeds() {
        let plan = fields().check().unwrap();
        let seeds: Vec<_> = (0..plan.n)
            .map(|i| plan.request(&[1], 4, None, i).params.sampling.seed)
            .collect();
        assert_eq!(seeds, vec![Some(7), Some(8), Some(9)]);
        let r = plan.request(&[1], 4, None, 0);
        assert_eq!((r.params.sampling.temperature, r.speculate), (1.0, true));
    }

    #[test]
    fn out_of_range_fields_name_the_param() {
        let bad = |f: SamplingFields| f.check().unwrap_err().param;
        assert_eq!(
            bad(SamplingFields {
                n: Some(17),
                ..fields()
            })
            .as_deref(),
            Some("n")
        );
        assert_eq!(bad(SamplingFields { n: Some(0), ..fields() }).as_deref(), Some("n"));
        let cold = SamplingFields {
            temperature: Some(-0.5),
            ..fields()
        };
        assert_eq!(bad(cold).as_deref(), Some("temperature"));
        assert_eq!(
            bad(SamplingFields {
                top_p: Some(0.0),
                ..fields()
            })
            .as_deref(),
            Some("top_p")
        );
        assert_eq!(
            bad(SamplingFields {
                top_k: Some(-2),
                ..fields()
            })
            .as_deref(),
            Some("top_k")
        );
    }

    #[test]
    fn budgets_fit_the_context() {
        assert_eq!(max_tokens(None, "max_tokens", 16, 10, 100).unwrap(), 16);
        assert_eq!(max_tokens(None, "max_tokens", 16, 95, 100).unwrap(), 5);
        assert_eq!(max_tokens(Some(90), "max_tokens", 16, 10, 100).unwrap(), 90);
        assert!(max_tokens(Some(91), "max_tokens", 16, 10, 100).is_err());
        assert!(max_tokens(Some(0), "max_tokens", 16, 10, 100).is_err());
        assert!(check_prompt(0, 100, "prompt").is_err());
        assert!(check_prompt(100, 100, "prompt").is_err());
        assert!(check_prompt(99, 100, "prompt").is_ok());
    }
}
