//! A real server on a loopback port, over the bundled demo model and its trained P-EAGLE
//! drafter.

use axum::Router;
use peagle_engine::{DraftModel, EngineBuilder, GenerationDefaults};
use peagle_server::{start_engine, Parsers, Server, ServerConfig};
use reqwest::{Client, Response, StatusCode};
use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const MODEL: &str = "pystdlib-12l";
/// The demo model's max_position_embeddings.
pub const MAX_MODEL_LEN: usize = 1024;

/// A model directory under `models/`.
pub fn model_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name)
}

/// The demo tokenizer's id of `token`, a whole token's text.
/// The demo model's tokenizer.
pub fn tokenizer() -> tokenizers::Tokenizer {
    tokenizers::Tokenizer::from_file(model_dir(MODEL).join("tokenizer.json")).unwrap()
}

pub fn token_id(token: &str) -> u32 {
    let tokenizer = tokenizer();
    let ids = tokenizer.encode(token, false).unwrap().get_ids().to_vec();
    assert_eq!(ids.len(), 1, "{token:?} is not one token: {ids:?}");
    ids[0]
}

pub struct Options {
    pub speculative: bool,
    pub generation_defaults: GenerationDefaults,
    pub config: ServerConfig,
    pub max_waiting: Option<usize>,
    pub max_num_seqs: Option<usize>,
    /// Draft K every step, as `--fixed-k`: the speculation policy would turn drafting
    /// off under a load it measures as faster without.
    pub fixed_k: bool,
    /// Routes added next to the API's (the panic test's).
    pub extra: Option<Router>,
    /// Another model directory and its drafter, served under the demo's name.
    pub target: Option<(PathBuf, Option<DraftModel>)>,
    /// `--tool-call-parser` and `--reasoning-parser`.
    pub parsers: Parsers,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            speculative: true,
            generation_defaults: GenerationDefaults::Auto,
            config: ServerConfig::default(),
            max_waiting: None,
            max_num_seqs: None,
            fixed_k: false,
            extra: None,
            target: None,
            parsers: Parsers::default(),
        }
    }
}

pub struct TestServer {
    pub url: String,
    pub client: Client,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::with(Options::default()).await
    }

    /// The default server with `config`.
    pub async fn with_config(config: ServerConfig) -> Self {
        Self::with(Options {
            config,
            ..Default::default()
        })
        .await
    }

    pub async fn with(opts: Options) -> Self {
        let mut engine_opts = EngineBuilder::new(model_dir(MODEL));
        if opts.speculative {
            engine_opts.draft = Some(DraftModel {
                dir: model_dir("pystdlib-12l-peagle"),
                k: Some(3),
                parallel: true,
            });
        }
        if let Some((dir, draft)) = opts.target {
            engine_opts.model_dir = dir;
            engine_opts.draft = draft;
        }
        engine_opts.generation_defaults = opts.generation_defaults;
        if let Some(n) = opts.max_waiting {
            engine_opts.scheduler.max_waiting = n;
        }
        if let Some(n) = opts.max_num_seqs {
            engine_opts.scheduler.max_num_seqs = n;
        }
        engine_opts.scheduler.adaptive_k = !opts.fixed_k;
        let (engine, model) = start_engine(MODEL.into(), &engine_opts, None, opts.parsers).unwrap();
        let server = Server::new(engine, model, opts.config).unwrap();
        let routes = match opts.extra {
            Some(extra) => server.routes().merge(extra),
            None => server.routes(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(server.serve_with(routes, listener, shutdown));
        Self {
            url,
            client: Client::new(),
            stop: Some(stop),
            task,
        }
    }

    /// Sends the shutdown signal and waits for the server to end.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("the server did not stop")
            .unwrap()
    }

    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.client.post(format!("{}{path}", self.url))
    }

    pub async fn get(&self, path: &str) -> Response {
        self.client.get(format!("{}{path}", self.url)).send().await.unwrap()
    }

    /// POSTs JSON and returns the status and JSON body.
    pub async fn call(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let response = self.post(path).json(&body).send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        (status, json)
    }

    /// POSTs JSON expecting 200 and returns the body.
    pub async fn ok(&self, path: &str, body: Value) -> Value {
        let (status, json) = self.call(path, body).await;
        assert_eq!(status, StatusCode::OK, "{json}");
        json
    }

    /// POSTs a streaming request; returns its chunks, checking that `data: [DONE]` ends it.
    pub async fn stream(&self, path: &str, body: Value) -> Vec<Value> {
        let response = self.post(path).json(&body).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = response.headers()["content-type"].to_str().unwrap().to_string();
        assert!(content_type.starts_with("text/event-stream"), "{content_type}");
        let text = response.text().await.unwrap();
        let data: Vec<&str> = text
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                e.strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("not an SSE data event: {e:?}"))
            })
            .collect();
        assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
        data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    /// The value of one /metrics sample, e.g. `peagle:kv_blocks_used` or
    /// `peagle:request_success_total{finished_reason="abort"}` (the model_name label is implied).
    pub async fn metric(&self, sample: &str) -> f64 {
        let text = self.get("/metrics").await.text().await.unwrap();
        let (name, labels) = match sample.split_once('{') {
            Some((name, rest)) => (name, format!(",{}", rest.trim_end_matches('}'))),
            None => (sample, String::new()),
        };
        let prefix = format!("{name}{{model_name=\"{MODEL}\"{labels}}} ");
        let line = text
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"));
        line[prefix.len()..].parse().unwrap()
    }

    /// On a server of one sequence at a time: a streamed request that runs (its first chunk
    /// read) and a short one queued behind it. The running one asks for 1000 tokens, so that
    /// it is still running a while later: its server must not cap max_tokens
    /// (`GenerationDefaults::Neutral`; the demo's generation config caps it at 256).
    pub async fn one_running_one_waiting(&self) -> (Response, JoinHandle<reqwest::Result<Response>>) {
        let mut long = greedy("import sys", 1000);
        long["stream"] = serde_json::json!(true);
        let mut running = self.post("/v1/completions").json(&long).send().await.unwrap();
        running.chunk().await.unwrap().expect("a first chunk");
        // The engine publishes its counts after the step that sent the first chunk.
        self.wait_for_metric("peagle:num_requests_waiting", 0.0).await;
        let waiting = tokio::spawn(self.post("/v1/completions").json(&greedy("hi", 4)).send());
        self.wait_for_metric("peagle:num_requests_waiting", 1.0).await;
        (running, waiting)
    }

    /// Polls /metrics until `sample` equals `value` (engine metrics update after each step).
    pub async fn wait_for_metric(&self, sample: &str, value: f64) {
        let start = Instant::now();
        while self.metric(sample).await != value {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{sample} stayed at {} instead of {value}",
                self.metric(sample).await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A greedy completion request that runs to max_tokens.
pub fn greedy(prompt: &str, max_tokens: usize) -> Value {
    serde_json::json!({
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
    })
}

/// The text of each choice of a non-streaming completion.
pub fn texts(response: &Value) -> Vec<String> {
    response["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect()
}

/// The streamed text of choice `index`, and its finish reason.
pub fn streamed(chunks: &[Value], index: u64, field: &str) -> (String, Option<String>) {
    let mut text = String::new();
    let mut finish = None;
    for choice in chunks.iter().flat_map(|c| c["choices"].as_array().unwrap()) {
        if choice["index"] != index {
            continue;
        }
        let piece = match field {
            "text" => &choice["text"],
            _ => &choice["delta"]["content"],
        };
        text.push_str(piece.as_str().unwrap_or_default());
        if let Some(reason) = choice["finish_reason"].as_str() {
            assert!(finish.is_none(), "two finish reasons for choice {index}");
            finish = Some(reason.to_string());
        }
    }
    (text, finish)
}
