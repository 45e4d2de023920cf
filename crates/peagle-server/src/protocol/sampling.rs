//! The request fields completions and chat share: how tokens are chosen and when a choice
//! stops. Read from the same body as the route's own fields.

use super::refused::Refused;
use super::structured::StructuredRequest;
use super::Stop;
use serde::Deserialize;
use std::collections::BTreeMap;
use utoipa::ToSchema;

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct SamplingRequest {
    #[schema(minimum = 0)]
    pub temperature: Option<f32>,
    #[schema(exclusive_minimum = 0, maximum = 1)]
    pub top_p: Option<f32>,
    /// vLLM extension; -1 or 0 disables the cut.
    #[schema(minimum = -1)]
    pub top_k: Option<i64>,
    /// vLLM extension; 0 disables the cut.
    #[schema(minimum = 0, maximum = 1)]
    pub min_p: Option<f32>,
    /// vLLM's range: a signed 64-bit integer.
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    #[schema(minimum = 1, maximum = 16)]
    pub n: Option<i64>,
    #[schema(minimum = -2, maximum = 2)]
    pub presence_penalty: Option<f32>,
    #[schema(minimum = -2, maximum = 2)]
    pub frequency_penalty: Option<f32>,
    /// vLLM extension; 1 is off.
    #[schema(exclusive_minimum = 0)]
    pub repetition_penalty: Option<f32>,
    /// Token id (as a string, OpenAI's spelling) to a bias added to its logit.
    pub logit_bias: Option<BTreeMap<String, f32>>,
    /// vLLM extension: no end-of-sequence or stop token before this many tokens.
    #[schema(minimum = 0)]
    pub min_tokens: Option<i64>,
    /// vLLM extension: token ids that end the choice.
    #[schema(max_items = 1024)]
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM extension: the prompt tokens' log-probabilities with this many alternatives
    /// (`prompt_logprobs` in the response); above 0, not with a stream.
    #[schema(minimum = 0, maximum = 20)]
    pub prompt_logprobs: Option<i64>,
    /// vLLM extension: logprobs name tokens `token_id:{id}` rather than by their text, which
    /// may not be valid UTF-8 alone.
    pub return_tokens_as_token_ids: Option<bool>,
    /// vLLM extension: the only token ids the choice may generate.
    #[schema(min_items = 1)]
    pub allowed_token_ids: Option<Vec<u32>>,
    /// vLLM extension: words whose tokens the choice never generates in that order (the last
    /// token of each, encoded with and without a leading space, is banned where the tokens
    /// generated before it end with the rest of it).
    #[schema(max_items = 256)]
    pub bad_words: Option<Vec<String>>,
    /// vLLM extension: keep the stop string or stop token that ended the choice in its text.
    pub include_stop_str_in_output: Option<bool>,
    /// vLLM extension: false puts special tokens' text in the output.
    pub skip_special_tokens: Option<bool>,
    /// vLLM extension: keep generating past end-of-sequence tokens.
    pub ignore_eos: Option<bool>,
    /// peagle extension: `false` turns speculative decoding off for this request.
    pub speculative: Option<bool>,
    /// vLLM extension: keep only the prompt's last this many tokens; -1 keeps the context's
    /// length of them (max_model_len), as vLLM does.
    #[schema(minimum = -1)]
    pub truncate_prompt_tokens: Option<i64>,
    /// vLLM extension: only requests with the same salt share cached prefixes.
    pub cache_salt: Option<String>,
    /// Raw JSON only, so flattening it costs no field its error path.
    #[serde(flatten)]
    pub refused: Refused,
    #[serde(flatten)]
    pub structured: StructuredRequest,
}
