use crate::level::run_level;
use crate::request::RequestParams;
use crate::{load_prompts, BenchConfig, BenchError, LevelResult};
use serde::Serialize;
use serde_json::Value;

/// Everything `result.json` holds.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    pub config: BenchConfig,
    /// The model the requests named (the configured one or the server's first).
    pub model: String,
    pub levels: Vec<LevelResult>,
    /// The level that failed and why, when one did after others finished: those are kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

impl BenchResult {
    /// One line for each level with failed requests, and for the level that stopped the run.
    pub fn failures(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .levels
            .iter()
            .filter(|l| l.failed > 0)
            .map(|l| {
                format!(
                    "concurrency {}: {} of {} requests failed, the first with: {}",
                    l.concurrency,
                    l.failed,
                    l.failed + l.completed,
                    l.first_error.as_deref().unwrap_or("no error recorded")
                )
            })
            .collect();
        lines.extend(self.failed.iter().map(|f| format!("{f}; the run stopped there")));
        lines
    }
}

/// Runs every concurrency level of `config`, in order, over the same prompts. A level that
/// fails after others finished ends the run with `failed` set; a first level that fails is
/// the error.
pub async fn run(config: &BenchConfig) -> Result<BenchResult, BenchError> {
    let w = &config.workload;
    let prompts = load_prompts(&w.dataset, w.num_prompts)?;
    let client = reqwest::Client::new();
    let url = config.url.trim_end_matches('/');
    let model = match &config.model {
        Some(model) => model.clone(),
        None => first_model(&client, url).await?,
    };
    let params = RequestParams {
        url,
        model: &model,
        max_tokens: w.max_tokens,
        temperature: w.temperature,
        endpoint: w.endpoint,
    };
    let mut levels = Vec::with_capacity(w.concurrency.len());
    let mut failed = None;
    for &concurrency in &w.concurrency {
        // A level's start and end on stderr, so that a run cut off part-way shows where it was.
        eprintln!("peagle-bench: concurrency {concurrency}: {} requests", prompts.len());
        match run_level(&client, &params, &prompts, concurrency).await {
            Ok(level) => {
                eprintln!(
                    "peagle-bench: concurrency {concurrency}: {} completed, {} failed in {:.1} s ({:.1} output tokens/s)",
                    level.completed, level.failed, level.duration_s, level.output_throughput
                );
                levels.push(level)
            }
            Err(e) if levels.is_empty() => return Err(e),
            Err(e) => {
                failed = Some(format!("concurrency {concurrency}: {e}"));
                break;
            }
        }
    }
    Ok(BenchResult {
        config: config.clone(),
        model,
        levels,
        failed,
    })
}

/// The first id `GET /v1/models` lists.
pub(crate) async fn first_model(client: &reqwest::Client, base_url: &str) -> Result<String, BenchError> {
    let url = format!("{base_url}/v1/models");
    let unreachable = |source| BenchError::Unreachable {
        url: url.clone(),
        source,
    };
    let response = client.get(&url).send().await.map_err(unreachable)?;
    let status = response.status();
    let body = response.text().await.map_err(unreachable)?;
    if !status.is_success() {
        return Err(BenchError::Status {
            url,
            status: status.as_u16(),
            body,
        });
    }
    let models: Value = serde_json::from_str(&body).map_err(|e| BenchError::BadResponse {
        url: url.clone(),
        reason: e.to_string(),
    })?;
    match models["data"][0]["id"].as_str() {
        Some(id) => Ok(id.to_string()),
        None => Err(BenchError::BadResponse {
            url,
            reason: format!("no model listed in {body}"),
        }),
    }
}
