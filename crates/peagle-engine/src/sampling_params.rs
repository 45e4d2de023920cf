//! What a request asks of the choice of its tokens, and the checks every way into the engine
//! shares.

use crate::penalties::Penalties;
use crate::structured::StructuredOutput;
use crate::token_bans::{InvalidBans, TokenBans};
use thiserror::Error;

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Below `GREEDY_BELOW` (0 included) means greedy.
    pub temperature: f32,
    /// 0 means no top-k cut.
    pub top_k: usize,
    pub top_p: f32,
    /// Drops tokens less likely than this share of the most likely one (vLLM; 0 is off).
    pub min_p: f32,
    pub seed: Option<u64>,
    /// Applied to the logits before the choice, greedy or not.
    pub penalties: Penalties,
    /// Tokens that may not be chosen, greedy or not.
    pub bans: TokenBans,
    /// The grammar the text must follow (structured output), greedy or not.
    pub structured: Option<StructuredOutput>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            penalties: Penalties::default(),
            bans: TokenBans::default(),
            structured: None,
        }
    }
}

/// Temperatures below this choose greedily, as vLLM's do: dividing logits by a smaller one
/// only overflows them, and the choice would be the argmax, but with ties drawn at random.
pub const GREEDY_BELOW: f32 = 1e-5;
/// The most a presence or frequency penalty may be, either way (OpenAI's range).
pub const MAX_PENALTY: f32 = 2.0;
/// The most a logit bias may be, either way (OpenAI's range).
pub const MAX_BIAS: f32 = 100.0;

/// A sampling field out of its range; `param` names it as the OpenAI API does.
#[derive(Debug, Error, PartialEq)]
pub enum InvalidSampling {
    #[error("temperature must be a finite number >= 0, got {0}")]
    Temperature(f32),
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("min_p must be in [0, 1], got {0}")]
    MinP(f32),
    #[error("repetition_penalty must be a finite number > 0, got {0}")]
    RepetitionPenalty(f32),
    #[error("presence_penalty must be between -2 and 2, got {0}")]
    PresencePenalty(f32),
    #[error("frequency_penalty must be between -2 and 2, got {0}")]
    FrequencyPenalty(f32),
    #[error("logit_bias for token {token} must be between -100 and 100, got {bias}")]
    LogitBias { token: u32, bias: f32 },
    #[error(transparent)]
    Bans(#[from] InvalidBans),
}

impl InvalidSampling {
    /// The request field at fault.
    pub fn param(&self) -> &'static str {
        match self {
            Self::Temperature(_) => "temperature",
            Self::TopP(_) => "top_p",
            Self::MinP(_) => "min_p",
            Self::RepetitionPenalty(_) => "repetition_penalty",
            Self::PresencePenalty(_) => "presence_penalty",
            Self::FrequencyPenalty(_) => "frequency_penalty",
            Self::LogitBias { .. } => "logit_bias",
            Self::Bans(e) => e.param(),
        }
    }
}

impl SamplingParams {
    pub fn validate(&self) -> Result<(), InvalidSampling> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(InvalidSampling::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(InvalidSampling::TopP(self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(InvalidSampling::MinP(self.min_p));
        }
        let p = &self.penalties;
        if !(p.repetition.is_finite() && p.repetition > 0.0) {
            return Err(InvalidSampling::RepetitionPenalty(p.repetition));
        }
        let within = |v: f32, limit: f32| (-limit..=limit).contains(&v);
        if !within(p.presence, MAX_PENALTY) {
            return Err(InvalidSampling::PresencePenalty(p.presence));
        }
        if !within(p.frequency, MAX_PENALTY) {
            return Err(InvalidSampling::FrequencyPenalty(p.frequency));
        }
        if let Some(&(token, bias)) = p.logit_bias.iter().find(|(_, b)| !within(*b, MAX_BIAS)) {
            return Err(InvalidSampling::LogitBias { token, bias });
        }
        Ok(self.bans.validate()?)
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_BELOW
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_parameters_are_rejected() {
        let params = |temperature, top_p| SamplingParams {
            temperature,
            top_p,
            ..SamplingParams::default()
        };
        assert_eq!(params(-0.5, 1.0).validate(), Err(InvalidSampling::Temperature(-0.5)));
        assert_eq!(params(1.0, 0.0).validate(), Err(InvalidSampling::TopP(0.0)));
        assert_eq!(params(1.0, 1.5).validate(), Err(InvalidSampling::TopP(1.5)));
        let with = |penalties: Penalties| SamplingParams {
            penalties,
            ..SamplingParams::default()
        };
        let repetition = with(Penalties {
            repetition: 0.0,
            ..Penalties::default()
        });
        assert_eq!(repetition.validate(), Err(InvalidSampling::RepetitionPenalty(0.0)));
        let bias = with(Penalties {
            logit_bias: vec![(1, f32::INFINITY)],
            ..Penalties::default()
        });
        assert_eq!(
            bias.validate(),
            Err(InvalidSampling::LogitBias {
                token: 1,
                bias: f32::INFINITY
            })
        );
        let presence = with(Penalties {
            presence: 2.5,
            ..Penalties::default()
        });
        assert_eq!(presence.validate().unwrap_err().param(), "presence_penalty");
        let frequency = with(Penalties {
            frequency: f32::NAN,
            ..Penalties::default()
        });
        assert_eq!(frequency.validate().unwrap_err().param(), "frequency_penalty");
        let min_p = SamplingParams {
            min_p: -0.1,
            ..SamplingParams::default()
        };
        assert_eq!(min_p.validate(), Err(InvalidSampling::MinP(-0.1)));
    }

    #[test]
    fn temperatures_below_vllms_epsilon_are_greedy() {
        let at = |temperature| SamplingParams {
            temperature,
            ..SamplingParams::default()
        };
        assert!(at(0.0).is_greedy());
        assert!(at(0.9e-5).is_greedy());
        assert!(!at(1e-5).is_greedy());
        assert!(!at(0.7).is_greedy());
    }
}
