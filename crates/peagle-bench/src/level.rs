use crate::metrics::{acceptance_length, SpecCounters};
use crate::request::{run_request, RequestParams};
use crate::{BenchError, RequestRecord, Summary};
use futures_util::StreamExt;
use serde::Serialize;
use std::time::Instant;

/// Aggregate results of running every prompt at one concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct LevelResult {
    pub concurrency: usize,
    pub completed: usize,
    pub duration_s: f64,
    pub total_output_tokens: usize,
    pub request_throughput: f64,
    pub output_throughput: f64,
    pub ttft_ms: Option<Summary>,
    pub tpot_ms: Option<Summary>,
    pub itl_ms: Option<Summary>,
    pub e2e_ms: Option<Summary>,
    /// Deltas of the server's speculative-decoding counters over the level, when it has them.
    pub spec_decode_drafts: Option<f64>,
    pub spec_decode_accepted_tokens: Option<f64>,
    pub acceptance_length: Option<f64>,
}

impl LevelResult {
    /// Aggregates per-request records over a level that took `duration_s` of wall time.
    pub fn from_records(concurrency: usize, records: &[RequestRecord], duration_s: f64) -> Self {
        let total_output_tokens = records.iter().map(|r| r.completion_tokens).sum();
        let ttft: Vec<f64> = records.iter().map(|r| r.ttft_ms).collect();
        let tpot: Vec<f64> = records.iter().filter_map(RequestRecord::tpot_ms).collect();
        let itl: Vec<f64> = records.iter().flat_map(|r| r.itl_ms.iter().copied()).collect();
        let e2e: Vec<f64> = records.iter().map(|r| r.e2e_ms).collect();
        Self {
            concurrency,
            completed: records.len(),
            duration_s,
            total_output_tokens,
            request_throughput: records.len() as f64 / duration_s,
            output_throughput: total_output_tokens as f64 / duration_s,
            ttft_ms: Summary::of(&ttft),
            tpot_ms: Summary::of(&tpot),
            itl_ms: Summary::of(&itl),
            e2e_ms: Summary::of(&e2e),
            spec_decode_drafts: None,
            spec_decode_accepted_tokens: None,
            acceptance_length: None,
        }
    }
}

/// Runs all prompts with at most `concurrency` in flight; the first failed request ends the level.
pub async fn run_level(
    client: &reqwest::Client,
    params: &RequestParams<'_>,
    prompts: &[String],
    concurrency: usize,
) -> Result<LevelResult, BenchError> {
    let before = SpecCounters::scrape(client, params.url).await?;
    let start = Instant::now();
    let mut in_flight = futures_util::stream::iter(prompts)
        .map(|prompt| run_request(client, params, prompt))
        .buffer_unordered(concurrency);
    let mut records = Vec::with_capacity(prompts.len());
    while let Some(record) = in_flight.next().await {
        // Ends the progress line first so an error message starts on its own line.
        let record = record.inspect_err(|_| eprintln!())?;
        records.push(record);
        eprint!(
            "\rconcurrency {concurrency}: {}/{} requests",
            records.len(),
            prompts.len()
        );
    }
    eprintln!();
    let duration_s = start.elapsed().as_secs_f64();
    let after = SpecCounters::scrape(client, params.url).await?;
    let mut level = LevelResult::from_records(concurrency, &records, duration_s);
    level.spec_decode_drafts = after.drafts.zip(before.drafts).map(|(a, b)| a - b);
    level.spec_decode_accepted_tokens = after.accepted.zip(before.accepted).map(|(a, b)| a - b);
    level.acceptance_length = acceptance_length(before, after);
    Ok(level)
}
