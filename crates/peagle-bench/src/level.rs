use crate::error::error_chain;
use crate::metrics::{CounterDeltas, ServerCounters, StepBreakdown};
use crate::request::{run_request, RequestParams};
use crate::{BenchError, RequestRecord, Summary};
use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::time::Instant;

/// Aggregate results of running every prompt at one concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct LevelResult {
    pub concurrency: usize,
    pub completed: usize,
    /// Requests that failed; the figures are over the completed ones.
    pub failed: usize,
    /// The first failed request's error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
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
    /// Draft tokens per verification: K, or less where the server adapts k to the load.
    pub mean_draft_length: Option<f64>,
    /// Where the server's engine spent its steps, when it exports that (peagle does).
    pub engine: Option<StepBreakdown>,
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
            failed: 0,
            first_error: None,
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
            mean_draft_length: None,
            engine: None,
        }
    }
}

/// Runs all prompts with at most `concurrency` in flight. A request that fails is counted and
/// the others go on, as in vLLM's benchmark: a prompt too long for the server, or a moment of
/// a full queue, does not throw away the level. A level in which every request failed is the
/// first one's error.
pub async fn run_level(
    client: &reqwest::Client,
    params: &RequestParams<'_>,
    prompts: &[String],
    concurrency: usize,
) -> Result<LevelResult, BenchError> {
    let before = ServerCounters::scrape(client, params.url).await?;
    let start = Instant::now();
    let mut in_flight = futures_util::stream::iter(prompts)
        .map(|prompt| run_request(client, params, prompt))
        .buffer_unordered(concurrency);
    let mut records = Vec::with_capacity(prompts.len());
    let (mut failed, mut first_error) = (0, None);
    let progress = progress_bar(prompts.len(), concurrency);
    while let Some(outcome) = in_flight.next().await {
        match outcome {
            Ok(record) => records.push(record),
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
        progress.inc(1);
    }
    if records.is_empty() {
        if let Some(e) = first_error {
            progress.abandon();
            return Err(e);
        }
    }
    progress.finish();
    let duration_s = start.elapsed().as_secs_f64();
    let after = ServerCounters::scrape(client, params.url).await?;
    let deltas = CounterDeltas { before, after };
    let mut level = LevelResult::from_records(concurrency, &records, duration_s);
    level.failed = failed;
    level.first_error = first_error.map(|e| error_chain(&e));
    level.spec_decode_drafts = deltas.delta(|c| c.drafts);
    level.spec_decode_accepted_tokens = deltas.delta(|c| c.accepted);
    level.acceptance_length = deltas.acceptance_length();
    level.mean_draft_length = deltas.mean_draft_length();
    level.engine = deltas.step_breakdown(duration_s);
    Ok(level)
}

/// Requests done at this level; drawn only on a terminal.
fn progress_bar(requests: usize, concurrency: usize) -> ProgressBar {
    let bar = ProgressBar::new(requests as u64);
    let style = ProgressStyle::with_template("concurrency {prefix:>3} [{bar:40}] {pos}/{len} requests, {elapsed}")
        .expect("the template is valid")
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(concurrency.to_string());
    bar
}
