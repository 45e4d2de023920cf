//! `peagle-bench prefix`: what automatic prefix caching buys, side by side in one run. The
//! same `peagle-serve` runs twice, with `--no-enable-prefix-caching` and without, and each
//! serves two workloads:
//! - **shared prefix**: requests one at a time, each a long system prompt (about
//!   `prefix_tokens`) plus its own question, after one warm-up request; the median TTFT is
//!   what caching cuts;
//! - **multi-turn chat**: `conversations` chats at once, each `turns` turns under a shorter
//!   system prompt, every turn sending the whole conversation so far; tokens per second over
//!   the phase must not drop with caching.

use crate::bench::first_model;
use crate::error::error_chain;
use crate::request::{run_chat, RequestParams, RequestRecord};
use crate::server_process::ServerProcess;
use crate::{counter, load_prompts, BenchError, Endpoint, Summary};
use serde::Serialize;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const START_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Serialize)]
pub struct PrefixConfig {
    pub serve_bin: PathBuf,
    pub model: String,
    pub server_args: Vec<String>,
    /// JSONL of {"prompt": ...}: the system prompts are built from its lines, the questions
    /// are its lines' first lines.
    pub dataset: PathBuf,
    pub prefix_tokens: usize,
    pub requests: usize,
    pub chat_prefix_tokens: usize,
    pub conversations: usize,
    pub turns: usize,
    pub max_tokens: usize,
}

/// One server's measurements.
#[derive(Debug, Clone, Serialize)]
pub struct PrefixRun {
    pub caching: bool,
    /// Shared-prefix requests' TTFT, warm-up left out.
    pub shared_ttft_ms: Summary,
    /// The system prompt's length in tokens, as the server counts it.
    pub shared_prefix_tokens: usize,
    pub chat_ttft_ms: Summary,
    /// Completion tokens per second over the multi-turn phase.
    pub chat_tokens_per_s: f64,
    /// Prompt tokens found cached over the whole run, per prompt token looked up.
    pub hit_rate: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PrefixReport {
    pub config: PrefixConfig,
    pub without: PrefixRun,
    pub with: PrefixRun,
}

impl PrefixReport {
    /// Median shared-prefix TTFT without caching over with it.
    pub fn ttft_speedup(&self) -> f64 {
        self.without.shared_ttft_ms.p50 / self.with.shared_ttft_ms.p50
    }

    /// Multi-turn throughput with caching over without.
    pub fn chat_throughput_ratio(&self) -> f64 {
        self.with.chat_tokens_per_s / self.without.chat_tokens_per_s
    }

    pub fn table(&self) -> String {
        let (a, b) = (&self.without, &self.with);
        let mut t = String::from("| | no prefix caching | prefix caching | ratio |\n|---|---:|---:|---:|\n");
        t += &format!(
            "| shared {}-token prefix: median TTFT (ms) | {:.1} | {:.1} | {:.2}x lower |\n",
            b.shared_prefix_tokens,
            a.shared_ttft_ms.p50,
            b.shared_ttft_ms.p50,
            self.ttft_speedup()
        );
        t += &format!(
            "| multi-turn chat: median TTFT (ms) | {:.1} | {:.1} | {:.2}x lower |\n",
            a.chat_ttft_ms.p50,
            b.chat_ttft_ms.p50,
            a.chat_ttft_ms.p50 / b.chat_ttft_ms.p50
        );
        t += &format!(
            "| multi-turn chat: completion tokens/s | {:.1} | {:.1} | {:.2}x |\n",
            a.chat_tokens_per_s,
            b.chat_tokens_per_s,
            self.chat_throughput_ratio()
        );
        t += &format!(
            "| prompt tokens found cached | {:.1}% | {:.1}% | |\n",
            100.0 * a.hit_rate,
            100.0 * b.hit_rate
        );
        t
    }
}

/// Runs the two servers in turn (without caching first) and returns their measurements.
pub async fn run_prefix(config: &PrefixConfig) -> Result<PrefixReport, BenchError> {
    let without = run_server(config, false).await?;
    let with = run_server(config, true).await?;
    Ok(PrefixReport {
        config: config.clone(),
        without,
        with,
    })
}

/// Writes `prefix.json` and `prefix.md` into `out`.
pub fn write_prefix_report(report: &PrefixReport, out: &Path) -> Result<(), BenchError> {
    let io = |path: PathBuf| move |source| BenchError::Write { path, source };
    std::fs::create_dir_all(out).map_err(io(out.to_path_buf()))?;
    let json = serde_json::to_string_pretty(report).expect("a report serializes");
    std::fs::write(out.join("prefix.json"), json + "\n").map_err(io(out.join("prefix.json")))?;
    let c = &report.config;
    let md = format!(
        "# Prefix caching\n\n`{}` on `{}`: {} shared-prefix requests one at a time after a warm-up, \
         then {} chats at once of {} turns each; {} tokens an answer.\n\n{}",
        config_line(c),
        c.model,
        c.requests,
        c.conversations,
        c.turns,
        c.max_tokens,
        report.table()
    );
    std::fs::write(out.join("prefix.md"), md).map_err(io(out.join("prefix.md")))
}

fn config_line(c: &PrefixConfig) -> String {
    format!("peagle-serve --model {} {}", c.model, c.server_args.join(" "))
        .trim_end()
        .to_string()
}

async fn run_server(config: &PrefixConfig, caching: bool) -> Result<PrefixRun, BenchError> {
    let mut args = vec!["--model".to_string(), config.model.clone()];
    args.extend(config.server_args.iter().cloned());
    if !caching {
        args.push("--no-enable-prefix-caching".into());
    }
    let (bin, what) = (config.serve_bin.clone(), format!("prefix caching {caching}"));
    eprintln!("peagle-bench prefix: {what}");
    let server = tokio::task::spawn_blocking(move || ServerProcess::start(&bin, &args, &what, START_TIMEOUT, None))
        .await
        .map_err(|e| BenchError::Server {
            what: "peagle-serve".into(),
            reason: error_chain(&e),
        })??;
    let client = reqwest::Client::new();
    let model = first_model(&client, &server.url).await?;
    let params = RequestParams {
        url: &server.url,
        model: &model,
        max_tokens: config.max_tokens,
        temperature: 0.0,
        endpoint: Endpoint::Chat,
    };
    let lines = load_prompts(&config.dataset, 1000)?;
    let questions: Vec<String> = lines.iter().map(|l| first_line(l)).collect();

    let (system, shared_prefix_tokens) = system_prompt(&client, &params, &lines, config.prefix_tokens).await?;
    let mut shared = Vec::new();
    for (i, question) in questions.iter().take(config.requests + 1).enumerate() {
        let messages = json!([{"role": "system", "content": system}, {"role": "user", "content": question}]);
        let (record, _) = run_chat(&client, &params, messages).await?;
        if i > 0 {
            shared.push(record);
        }
    }

    let (chat_system, _) =
        system_prompt(&client, &params, &lines[lines.len() / 2..], config.chat_prefix_tokens).await?;
    let started = Instant::now();
    let chats = (0..config.conversations).map(|c| {
        let asked: Vec<&String> = questions.iter().skip(c * config.turns).take(config.turns).collect();
        chat(&client, &params, &chat_system, asked)
    });
    let chats = futures_util::future::try_join_all(chats).await?;
    let seconds = started.elapsed().as_secs_f64();
    let chat_records: Vec<RequestRecord> = chats.into_iter().flatten().collect();
    let tokens: usize = chat_records.iter().map(|r| r.completion_tokens).sum();

    let text = client
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .map_err(|source| BenchError::Unreachable {
            url: server.url.clone(),
            source,
        })?
        .text()
        .await
        .unwrap_or_default();
    let queries = counter(&text, "peagle:prefix_cache_queries_total", "").unwrap_or(0.0);
    let hits = counter(&text, "peagle:prefix_cache_hits_total", "").unwrap_or(0.0);
    let ttft = |records: &[RequestRecord]| {
        Summary::of(&records.iter().map(|r| r.ttft_ms).collect::<Vec<_>>()).expect("requests ran")
    };
    Ok(PrefixRun {
        caching,
        shared_ttft_ms: ttft(&shared),
        shared_prefix_tokens,
        chat_ttft_ms: ttft(&chat_records),
        chat_tokens_per_s: tokens as f64 / seconds,
        hit_rate: hits / queries.max(1.0),
    })
}

/// One conversation: each turn sends everything so far and appends the answer.
async fn chat(
    client: &reqwest::Client,
    params: &RequestParams<'_>,
    system: &str,
    questions: Vec<&String>,
) -> Result<Vec<RequestRecord>, BenchError> {
    let mut messages = vec![json!({"role": "system", "content": system})];
    let mut records = Vec::new();
    for question in questions {
        messages.push(json!({"role": "user", "content": question}));
        let (record, answer) = run_chat(client, params, Value::Array(messages.clone())).await?;
        messages.push(json!({"role": "assistant", "content": answer}));
        records.push(record);
    }
    Ok(records)
}

/// Dataset lines joined until the system message is at least `tokens` long, with its length.
async fn system_prompt(
    client: &reqwest::Client,
    params: &RequestParams<'_>,
    lines: &[String],
    tokens: usize,
) -> Result<(String, usize), BenchError> {
    let mut system = String::new();
    for line in lines {
        system = match system.is_empty() {
            true => line.clone(),
            false => format!("{system}\n\n{line}"),
        };
        let count = count_tokens(client, params, &system).await?;
        if count >= tokens {
            return Ok((system, count));
        }
    }
    Err(BenchError::BadResponse {
        url: params.url.to_string(),
        reason: format!("the dataset's lines make fewer than {tokens} tokens"),
    })
}

async fn count_tokens(client: &reqwest::Client, params: &RequestParams<'_>, system: &str) -> Result<usize, BenchError> {
    let url = format!("{}/tokenize", params.url);
    let body = json!({"model": params.model, "messages": [{"role": "system", "content": system}], "add_generation_prompt": false});
    let response: Value = client
        .post(&url)
        .json(&body)
        .send()
        .await
        .map_err(|source| BenchError::Unreachable {
            url: url.clone(),
            source,
        })?
        .json()
        .await
        .map_err(|e| BenchError::BadResponse {
            url: url.clone(),
            reason: e.to_string(),
        })?;
    response["count"]
        .as_u64()
        .map(|c| c as usize)
        .ok_or_else(|| BenchError::BadResponse {
            url,
            reason: format!("no count in {response}"),
        })
}

/// A question from a dataset line: its first non-empty line.
fn first_line(text: &str) -> String {
    text.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(text)
        .trim()
        .to_string()
}
