//! The server's Prometheus counters that a level reports as deltas: speculative decoding
//! (vLLM's names under `peagle:`) and peagle's engine step time by phase.

use crate::BenchError;
use serde::Serialize;

const DRAFTS: &str = "peagle:spec_decode_num_drafts_total";
const DRAFT_TOKENS: &str = "peagle:spec_decode_num_draft_tokens_total";
const ACCEPTED: &str = "peagle:spec_decode_num_accepted_tokens_total";
const STEPS: &str = "peagle:engine_steps_total";
const STEP_SECONDS: &str = "peagle:engine_step_seconds_total";
const PHASES: [&str; 4] = ["target", "drafter", "verify", "other"];

/// The counters at one moment; None where the server does not export them.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerCounters {
    pub drafts: Option<f64>,
    pub draft_tokens: Option<f64>,
    pub accepted: Option<f64>,
    pub steps: Option<f64>,
    /// Seconds in each of `PHASES`.
    pub phase_seconds: [Option<f64>; 4],
}

impl ServerCounters {
    /// Reads `/metrics`; a server without that endpoint (any 4xx/5xx) simply has no counters.
    pub async fn scrape(client: &reqwest::Client, base_url: &str) -> Result<Self, BenchError> {
        let url = format!("{base_url}/metrics");
        let unreachable = |source| BenchError::Unreachable {
            url: url.clone(),
            source,
        };
        let response = client.get(&url).send().await.map_err(unreachable)?;
        if !response.status().is_success() {
            return Ok(Self::default());
        }
        let text = response.text().await.map_err(unreachable)?;
        Ok(Self {
            drafts: counter(&text, DRAFTS, ""),
            draft_tokens: counter(&text, DRAFT_TOKENS, ""),
            accepted: counter(&text, ACCEPTED, ""),
            steps: counter(&text, STEPS, ""),
            phase_seconds: PHASES.map(|phase| counter(&text, STEP_SECONDS, &format!("phase=\"{phase}\""))),
        })
    }
}

/// The sum of a counter over its samples (one per served model) in Prometheus text, keeping
/// only samples whose labels contain `label` (all when it is empty).
pub fn counter(exposition: &str, name: &str, label: &str) -> Option<f64> {
    let values: Vec<f64> = exposition
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.split(['{', ' ']).next() == Some(name))
        .filter(|line| line.contains(label))
        .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// What the counters moved by over a level.
#[derive(Debug, Clone, Copy)]
pub struct CounterDeltas {
    pub before: ServerCounters,
    pub after: ServerCounters,
}

/// Engine time per step over a level, in milliseconds, by phase.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepBreakdown {
    pub steps: f64,
    pub target_ms: f64,
    pub drafter_ms: f64,
    pub verify_ms: f64,
    pub other_ms: f64,
    /// Seconds the engine spent in steps over the level's wall time: the rest it waited for
    /// requests (HTTP, tokenization and the client run on other threads).
    pub busy_fraction: f64,
}

impl CounterDeltas {
    /// How much one counter moved; None when the server does not export it.
    pub fn delta(&self, field: impl Fn(&ServerCounters) -> Option<f64>) -> Option<f64> {
        Some(field(&self.after)? - field(&self.before)?)
    }

    /// Mean tokens per verification: 1 + accepted drafts / drafts. None when the server has no
    /// such counters or verified nothing in between.
    pub fn acceptance_length(&self) -> Option<f64> {
        let drafts = self.delta(|c| c.drafts)?;
        let accepted = self.delta(|c| c.accepted)?;
        (drafts > 0.0).then(|| 1.0 + accepted / drafts)
    }

    /// Mean drafts per verification (below K where the server adapts k to the load).
    pub fn mean_draft_length(&self) -> Option<f64> {
        let drafts = self.delta(|c| c.drafts)?;
        let tokens = self.delta(|c| c.draft_tokens)?;
        (drafts > 0.0).then(|| tokens / drafts)
    }

    /// Per-step phase times over a level of `duration_s` seconds.
    pub fn step_breakdown(&self, duration_s: f64) -> Option<StepBreakdown> {
        let steps = self.delta(|c| c.steps).filter(|s| *s > 0.0)?;
        let seconds: Vec<f64> = (0..PHASES.len())
            .map(|i| self.delta(|c| c.phase_seconds[i]))
            .collect::<Option<_>>()?;
        let per_step = |s: f64| 1e3 * s / steps;
        Some(StepBreakdown {
            steps,
            target_ms: per_step(seconds[0]),
            drafter_ms: per_step(seconds[1]),
            verify_ms: per_step(seconds[2]),
            other_ms: per_step(seconds[3]),
            // The engine publishes a step's time just after the step: the scrape before a
            // level can miss the last step before it, which then counts here. On a short level
            // that edge may pass the wall time; the share is at most the whole.
            busy_fraction: (seconds.iter().sum::<f64>() / duration_s).min(1.0),
        })
    }
}
