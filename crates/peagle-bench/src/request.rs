use crate::sse::SseBuffer;
use crate::{BenchError, Endpoint};
use futures_util::StreamExt;
use serde::Serialize;
use serde_json::Value;
use std::time::Instant;

/// One streamed request's timings, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct RequestRecord {
    /// Send to the first chunk with text.
    pub ttft_ms: f64,
    /// One entry per token after the first (see `per_token_gaps`).
    pub itl_ms: Vec<f64>,
    pub e2e_ms: f64,
    pub completion_tokens: usize,
}

impl RequestRecord {
    /// Time per output token after the first; None for a one-token answer.
    pub fn tpot_ms(&self) -> Option<f64> {
        (self.completion_tokens > 1).then(|| (self.e2e_ms - self.ttft_ms) / (self.completion_tokens - 1) as f64)
    }
}

/// What one request sends, apart from its prompt.
pub struct RequestParams<'a> {
    pub url: &'a str,
    pub model: &'a str,
    pub max_tokens: usize,
    pub temperature: f64,
    pub endpoint: Endpoint,
}

/// Sends one streaming completion of `prompt` and times its chunks until `[DONE]`.
pub async fn run_request(
    client: &reqwest::Client,
    params: &RequestParams<'_>,
    prompt: &str,
) -> Result<RequestRecord, BenchError> {
    let body = match params.endpoint {
        Endpoint::Completions => serde_json::json!({"prompt": prompt}),
        Endpoint::Chat => serde_json::json!({"messages": [{"role": "user", "content": prompt}]}),
    };
    Ok(stream_request(client, params, body, params.endpoint).await?.0)
}

/// Sends one streaming chat completion of a whole conversation (`messages`); returns its
/// timings and the answer's text.
pub async fn run_chat(
    client: &reqwest::Client,
    params: &RequestParams<'_>,
    messages: Value,
) -> Result<(RequestRecord, String), BenchError> {
    stream_request(
        client,
        params,
        serde_json::json!({"messages": messages}),
        Endpoint::Chat,
    )
    .await
}

/// Streams a request whose prompt or messages `body` holds, to `endpoint`.
async fn stream_request(
    client: &reqwest::Client,
    params: &RequestParams<'_>,
    mut body: Value,
    endpoint: Endpoint,
) -> Result<(RequestRecord, String), BenchError> {
    let shared = serde_json::json!({
        "model": params.model,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        // Runs every request to max_tokens so lengths, and so levels and servers, are comparable.
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    for (key, value) in shared.as_object().expect("an object") {
        body[key] = value.clone();
    }
    let route = match endpoint {
        Endpoint::Completions => "completions",
        Endpoint::Chat => "chat/completions",
    };
    let url = format!("{}/v1/{route}", params.url);
    let start = Instant::now();
    let unreachable = |source| BenchError::Unreachable {
        url: url.clone(),
        source,
    };
    let response = client.post(&url).json(&body).send().await.map_err(unreachable)?;
    let status = response.status();
    if !status.is_success() {
        // Trimmed so the error stays one line for the usual one-line JSON body.
        let body = response.text().await.unwrap_or_default().trim().to_string();
        return Err(BenchError::Status {
            url,
            status: status.as_u16(),
            body,
        });
    }
    let bad = |reason: String| BenchError::BadResponse {
        url: url.clone(),
        reason,
    };
    let mut sse = SseBuffer::default();
    let mut chunk_times = Vec::new();
    let mut answer = String::new();
    let mut usage_tokens = None;
    let mut bytes = response.bytes_stream();
    'read: while let Some(piece) = bytes.next().await {
        let piece = piece.map_err(unreachable)?;
        let now = Instant::now();
        for data in sse.push(&piece) {
            if data == "[DONE]" {
                break 'read;
            }
            let event: Value = serde_json::from_str(&data).map_err(|e| bad(format!("{e} in event {data}")))?;
            if let Some(error) = event.get("error") {
                return Err(bad(error.to_string()));
            }
            let choice = &event["choices"][0];
            let text = match endpoint {
                Endpoint::Completions => &choice["text"],
                Endpoint::Chat => &choice["delta"]["content"],
            };
            answer.push_str(text.as_str().unwrap_or_default());
            // Tokens may add no text (special tokens, the bytes of an unfinished character):
            // then the chunk that ends the choice marks their arrival.
            let has_text = text.as_str().is_some_and(|t| !t.is_empty());
            let silent_end = chunk_times.is_empty() && choice["finish_reason"].is_string();
            if has_text || silent_end {
                chunk_times.push(now.duration_since(start).as_secs_f64() * 1e3);
            }
            if let Some(n) = event["usage"]["completion_tokens"].as_u64() {
                usage_tokens = Some(n as usize);
            }
        }
    }
    let e2e_ms = start.elapsed().as_secs_f64() * 1e3;
    let Some(&ttft_ms) = chunk_times.first() else {
        return Err(bad("the stream carried no tokens".into()));
    };
    // A server without include_usage support: each text chunk counts as one token.
    let completion_tokens = usage_tokens.unwrap_or(chunk_times.len());
    let record = RequestRecord {
        ttft_ms,
        itl_ms: per_token_gaps(&chunk_times, completion_tokens),
        e2e_ms,
        completion_tokens,
    };
    Ok((record, answer))
}

/// Inter-token latencies from chunk arrival times. With speculative decoding one chunk carries
/// several tokens, so each gap is split evenly over the tokens it delivered (as vLLM does);
/// the first chunk is taken to carry the first token and the rest share the other `tokens - 1`.
pub fn per_token_gaps(chunk_times: &[f64], tokens: usize) -> Vec<f64> {
    let gaps: Vec<f64> = chunk_times.windows(2).map(|w| w[1] - w[0]).collect();
    let later_tokens = tokens.saturating_sub(1);
    let mut itl = Vec::with_capacity(later_tokens);
    // Time of gaps that delivered no whole token is carried into the next one, so it is not lost.
    let mut carried = 0.0;
    for (i, gap) in gaps.iter().enumerate() {
        let share = (i + 1) * later_tokens / gaps.len() - i * later_tokens / gaps.len();
        carried += gap;
        if share > 0 {
            itl.extend(std::iter::repeat_n(carried / share as f64, share));
            carried = 0.0;
        }
    }
    itl
}
