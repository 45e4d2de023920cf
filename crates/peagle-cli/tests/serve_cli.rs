//! peagle-serve as a user runs it: flags, the listening line, the API key, speculative config,
//! SIGTERM/SIGINT shutdown, one-line startup errors, and the headline command
//! (`--model gpt-oss-20b`) fetching its preset from a stand-in hub.

mod common;

use common::fake_hub::FakeHub;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn fixture(name: &str) -> String {
    format!("{}/../../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn serve_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_peagle-serve"));
    cmd.args(args).env("RUST_LOG", "warn");
    cmd
}

/// A running server on a free port; killed if a test fails before stopping it.
struct Serve {
    child: Child,
    addr: String,
}

impl Serve {
    fn start(args: &[&str]) -> Self {
        Self::spawn(serve_command(args))
    }

    fn spawn(mut command: Command) -> Self {
        let child = command.args(["--port", "0"]).stderr(Stdio::piped()).spawn().unwrap();
        // Owned from here, so a failing test still kills it.
        let mut serve = Self {
            child,
            addr: String::new(),
        };
        let stderr = serve.child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("no listening line from peagle-serve");
            if let Some(addr) = line.strip_prefix("peagle-serve: listening on http://") {
                serve.addr = addr.to_string();
                return serve;
            }
        }
    }

    /// One HTTP/1.1 request; returns the status code and body.
    fn http(&self, method: &str, path: &str, key: Option<&str>, body: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n{auth}Content-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response[9..12].parse().unwrap();
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    }

    /// Sends a signal and waits for a clean exit.
    fn stop(mut self, signal: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args([signal, &pid]).status().unwrap().success());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "peagle-serve exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "peagle-serve did not stop on {signal}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the first Prometheus sample whose line starts with `name`.
fn counter(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
}

/// The server drafted, and always `k` tokens at a time.
fn assert_every_draft_has(server: &Serve, k: usize) {
    let (_, metrics) = server.http("GET", "/metrics", None, "");
    let drafts = counter(&metrics, "peagle:spec_decode_num_drafts_total{");
    assert!(drafts > 0.0, "{metrics}");
    assert_eq!(
        counter(&metrics, "peagle:spec_decode_num_draft_tokens_total{"),
        k as f64 * drafts
    );
}

const COMPLETION: &str = r#"{"prompt": "def f(x):", "max_tokens": 12, "temperature": 0, "ignore_eos": true}"#;

#[test]
fn serves_behind_an_api_key_and_stops_on_sigterm() {
    let model = fixture("tiny-llama");
    let server = Serve::start(&["--model", &model, "--served-model-name", "tiny", "--api-key", "sk-1"]);
    assert_eq!(server.http("GET", "/v1/models", None, "").0, 401);
    assert_eq!(server.http("GET", "/v1/models", Some("sk-2"), "").0, 401);
    let (status, body) = server.http("GET", "/v1/models", Some("sk-1"), "");
    assert_eq!(status, 200);
    assert!(body.contains(r#""id":"tiny""#), "{body}");
    let (status, body) = server.http("POST", "/v1/completions", Some("sk-1"), COMPLETION);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""completion_tokens":12"#), "{body}");
    assert_eq!(server.http("GET", "/health", None, "").0, 200);
    server.stop("-TERM");
}

/// At the open-file limit, connections idle the longest are closed to make room: half-open
/// connections beyond what the limit holds cannot lock out a new client. Their timeouts are
/// long here, so only shedding can close them.
#[test]
fn at_the_open_file_limit_idle_connections_make_room_for_new_clients() {
    let model = fixture("tiny-llama");
    let mut command = Command::new("sh");
    command
        .args([
            "-c",
            r#"ulimit -n 160 && exec "$0" "$@""#,
            env!("CARGO_BIN_EXE_peagle-serve"),
        ])
        .args([
            "--model",
            &model,
            "--header-timeout",
            "600",
            "--timeout-keep-alive",
            "600",
        ])
        .env("RUST_LOG", "warn");
    let server = Serve::spawn(command);
    let half_open: Vec<TcpStream> = (0..300)
        .map(|_| {
            let mut stream = TcpStream::connect(&server.addr).unwrap();
            stream
                .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            stream
        })
        .collect();
    let (tx, rx) = mpsc::channel();
    let addr = server.addr.clone();
    std::thread::spawn(move || {
        let mut stream = TcpStream::connect(&addr).unwrap();
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut response = String::new();
        let _ = stream.read_to_string(&mut response);
        let _ = tx.send(response);
    });
    let response = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("a new client got no answer at the open-file limit");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    drop(half_open);
    server.stop("-TERM");
}

/// `--fixed-k` keeps every draft at the full K that `--speculative-config` asks for.
#[test]
fn speculative_config_turns_on_drafting() {
    let (model, drafter) = (fixture("tiny-llama"), fixture("tiny-llama-peagle"));
    let spec =
        format!(r#"{{"method":"eagle3","model":"{drafter}","num_speculative_tokens":3,"parallel_drafting":true}}"#);
    let server = Serve::start(&["--model", &model, "--speculative-config", &spec, "--fixed-k"]);
    let (status, body) = server.http("POST", "/v1/completions", None, COMPLETION);
    assert_eq!(status, 200, "{body}");
    assert_every_draft_has(&server, 3);
    server.stop("-INT");
}

/// With no arguments: the bundled demo model, drafting with its bundled P-EAGLE drafter.
#[test]
fn no_arguments_serve_the_demo_model_with_its_drafter() {
    let server = Serve::start(&[]);
    let (_, models) = server.http("GET", "/v1/models", None, "");
    assert!(models.contains(r#""id":"pystdlib-12l""#), "{models}");
    // Long enough for the demo drafter (acceptance length about 1.6) to get drafts accepted.
    let request = r#"{"prompt": "def add(a, b):", "max_tokens": 32, "temperature": 0, "ignore_eos": true}"#;
    let (status, body) = server.http("POST", "/v1/completions", None, request);
    assert_eq!(status, 200, "{body}");
    let (_, metrics) = server.http("GET", "/metrics", None, "");
    let drafts = counter(&metrics, "peagle:spec_decode_num_drafts_total{");
    assert!(drafts > 0.0, "{metrics}");
    assert!(counter(&metrics, "peagle:spec_decode_num_accepted_tokens_total{") > 0.0);
    // The adaptive policy drafts at most the demo's K = 3.
    assert!(counter(&metrics, "peagle:spec_decode_num_draft_tokens_total{") <= 3.0 * drafts);
    server.stop("-INT");
}

fn fails(args: &[&str], message: &str) {
    fails_with(args, &[], message);
}

/// `fails`, with `env` set for the server.
fn fails_with(args: &[&str], env: &[(&str, &str)], message: &str) {
    let hf_home = tempfile::tempdir().unwrap();
    // The port is bound first: a free one, so that runs at once do not take each other's.
    let port: &[&str] = match args.contains(&"--port") {
        true => &[],
        false => &["--port", "0"],
    };
    let out: Output = serve_command(&[args, port].concat())
        .env("HF_HOME", hf_home.path())
        .env("HF_HUB_OFFLINE", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("peagle-serve: ") && stderr.contains(message),
        "{stderr}"
    );
}

#[test]
fn startup_errors_are_one_line_with_non_zero_exit() {
    let model = fixture("tiny-llama");
    fails(
        &["--model", &model, "--device", "cpu", "--dtype", "bf16"],
        "compute in f32",
    );
    // A GPU build may find a GPU, and serve.
    #[cfg(not(feature = "cuda"))]
    fails(&["--model", &model, "--device", "cuda"], "cannot open cuda:0");
    fails_with(
        &["--model", &model, "--device", "cuda"],
        &[("PEAGLE_CUDA_MATMUL", "cublas")],
        "PEAGLE_CUDA_MATMUL must be mma or fma, not \"cublas\"",
    );
    fails(
        &["--model", &model, "--device", "cpu", "--cuda-graphs"],
        "CUDA graphs need a GPU, and this engine runs on the CPU",
    );
    fails(
        &["--model", "acme/not-cached"],
        "acme/not-cached is not in the local Hugging Face cache (",
    );
    fails(&["--model", "/no/such/model"], "not a directory, a preset (gpt-oss-20b");
    fails(&["--model", &model, "--k", "3"], "need a drafter");
    fails(
        &["--model", &model, "--draft-model", "/no/drafter"],
        "/no/drafter: no such directory",
    );
    fails(
        &[
            "--model",
            &model,
            "--speculative-config",
            r#"{"method":"ngram","model":"x"}"#,
        ],
        "method \"ngram\" is not supported",
    );
    fails(
        &["--model", &model, "--max-model-len", "100000"],
        "max_position_embeddings",
    );
    fails(
        &["--model", &model, "--generation-config", "/no/such/dir"],
        "/no/such/dir: no generation_config.json there",
    );
    fails(
        &["--model", &model, "--allowed-origins", "*"],
        "expected a JSON list of origins",
    );
    fails(
        &["--model", &model, "--tool-call-parser", "openai"],
        "--tool-call-parser openai: this model does not speak harmony",
    );
    fails(
        &["--model", &model, "--enable-auto-tool-choice"],
        "--enable-auto-tool-choice needs --tool-call-parser",
    );
    fails(
        &["--model", &model, "--reasoning-parser", "openai_gptoss"],
        "--reasoning-parser openai_gptoss: this model does not speak harmony",
    );
    // Checked before any model is looked for.
    fails(
        &[
            "--model",
            "/no/such/model",
            "--allowed-origins",
            r#"["https://a.example\nb"]"#,
        ],
        "is not a valid header value",
    );
    // The port is taken before the model loads: a directory that is no model is not read.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let not_a_model = tempfile::tempdir().unwrap();
    let dir = not_a_model.path().to_str().unwrap();
    fails(
        &["--model", dir, "--host", "127.0.0.1", "--port", &port],
        &format!("cannot listen on 127.0.0.1:{port}"),
    );
    fails(
        &["--model", &model, "--chat-template", "/no/such/template.jinja"],
        "--chat-template /no/such/template.jinja: no such file",
    );
    fails(
        &["--model", &model, "--chat-template", "{% for %}"],
        "invalid chat template",
    );
    for flag in [
        "--block-size",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--max-waiting-requests",
        "--max-body-bytes",
    ] {
        fails(&["--model", &model, flag, "0"], &format!("{flag} must be at least 1"));
    }
    for flag in ["--header-timeout", "--body-timeout", "--timeout-keep-alive"] {
        for seconds in ["0", "18446744073709551615"] {
            fails(
                &["--model", &model, flag, seconds],
                &format!("{flag} must be 1 to 86400 seconds, not {seconds}"),
            );
        }
    }
    fails(
        &["--model", &model, "--shutdown-timeout", "18446744073709551615"],
        "--shutdown-timeout must be at most 86400 seconds",
    );
    fails(
        &[
            "--model",
            &model,
            "--draft-model",
            &fixture("tiny-llama-peagle"),
            "--k",
            "100000",
        ],
        "a draft model drafts 1 to 64 tokens a step, not 100000",
    );
    fails(
        &["--model", &model, "--kv-cache-blocks", "8"],
        "cannot hold one sequence of the maximum length",
    );
    for share in ["0", "1.5"] {
        fails(
            &["--model", &model, "--gpu-memory-utilization", share],
            &format!("the GPU memory utilization must be above 0 and at most 1, not {share}"),
        );
    }
}

/// The text of a completion response's first choice.
fn completion_text(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// `peagle-serve --model gpt-oss-20b --parallel-drafting --k 7` from an empty HF_HOME: the
/// preset's target and P-EAGLE head (tiny ones, under the published repository names) come
/// from the hub, then serve again from the cache with downloads off.
#[test]
fn the_gpt_oss_preset_downloads_its_models_then_serves_offline() {
    let hub = FakeHub::start(
        &[
            ("openai/gpt-oss-20b", fixture("tiny-gpt-oss-mxfp4").into()),
            ("amazon/GPT-OSS-20B-P-EAGLE", fixture("tiny-gpt-oss-peagle").into()),
        ],
        None,
    );
    let hf_home = tempfile::tempdir().unwrap();
    let headline = ["--model", "gpt-oss-20b", "--parallel-drafting", "--k", "7", "--fixed-k"];
    let command = |online: bool| {
        let mut command = serve_command(&headline);
        command.env("HF_HOME", hf_home.path()).env_remove("HF_TOKEN");
        match online {
            true => command.env("HF_ENDPOINT", &hub.url).env_remove("HF_HUB_OFFLINE"),
            false => command
                .env("HF_ENDPOINT", "http://127.0.0.1:9")
                .env("HF_HUB_OFFLINE", "1"),
        };
        command
    };
    let mut texts = Vec::new();
    for online in [true, false] {
        let server = Serve::spawn(command(online));
        let (_, models) = server.http("GET", "/v1/models", None, "");
        assert!(models.contains(r#""id":"gpt-oss-20b""#), "{models}");
        let (status, body) = server.http("POST", "/v1/completions", None, COMPLETION);
        assert_eq!(status, 200, "{body}");
        texts.push(completion_text(&body));
        assert_every_draft_has(&server, 7);
        server.stop("-TERM");
        if online {
            let fetched = hub.requests().len();
            assert!(fetched >= 8, "both repositories were downloaded: {:?}", hub.requests());
        }
    }
    assert_eq!(texts[0], texts[1]);
}

/// Prefix caching is on unless `--no-enable-prefix-caching` (vLLM's flags) turns it off.
#[test]
fn prefix_caching_is_on_by_default_and_can_be_turned_off() {
    let model = fixture("tiny-llama");
    let long =
        r#"{"prompt": "def f(x):\n    return [y * 2 for y in range(x) if y % 3 == 0 and y > 10]\n", "max_tokens": 2}"#;
    for (flag, hits) in [("--enable-prefix-caching", true), ("--no-enable-prefix-caching", false)] {
        let server = Serve::start(&["--model", &model, flag]);
        for _ in 0..2 {
            let (status, body) = server.http("POST", "/v1/completions", None, long);
            assert_eq!(status, 200, "{body}");
        }
        let (_, metrics) = server.http("GET", "/metrics", None, "");
        let found = counter(&metrics, "peagle:prefix_cache_hits_total{");
        assert_eq!(found > 0.0, hits, "{flag}: {found} tokens found cached");
        server.stop("-TERM");
    }
}
