use crate::BenchError;

const DRAFTS: &str = "peagle:spec_decode_num_drafts_total";
const ACCEPTED: &str = "peagle:spec_decode_num_accepted_tokens_total";

/// The speculative-decoding counters at one moment; None where the server does not export them.
#[derive(Debug, Clone, Copy)]
pub struct SpecCounters {
    pub drafts: Option<f64>,
    pub accepted: Option<f64>,
}

impl SpecCounters {
    /// Reads `/metrics`; a server without that endpoint (any 4xx/5xx) simply has no counters.
    pub async fn scrape(client: &reqwest::Client, base_url: &str) -> Result<Self, BenchError> {
        let url = format!("{base_url}/metrics");
        let response = client
            .get(&url)
            .send()
            .await
            .map_err(|source| BenchError::Unreachable {
                url: url.clone(),
                source,
            })?;
        if !response.status().is_success() {
            return Ok(Self {
                drafts: None,
                accepted: None,
            });
        }
        let text = response
            .text()
            .await
            .map_err(|source| BenchError::Unreachable { url, source })?;
        Ok(Self {
            drafts: counter(&text, DRAFTS),
            accepted: counter(&text, ACCEPTED),
        })
    }
}

/// The sum of a counter over all its label sets (one per served model) in Prometheus text.
pub fn counter(exposition: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = exposition
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            let sample_name = line.split(['{', ' ']).next().unwrap_or_default();
            sample_name == name
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Mean tokens per verification over a level: 1 + accepted drafts / drafts, from counter deltas.
/// None when the server has no such counters or verified nothing in between.
pub fn acceptance_length(before: SpecCounters, after: SpecCounters) -> Option<f64> {
    let drafts = after.drafts? - before.drafts?;
    let accepted = after.accepted? - before.accepted?;
    (drafts > 0.0).then(|| 1.0 + accepted / drafts)
}
