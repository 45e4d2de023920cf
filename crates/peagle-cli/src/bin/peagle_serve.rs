//! peagle-serve: the OpenAI-compatible server, with vLLM's flags. With no --model it serves
//! the bundled demo model with its P-EAGLE drafter.

use anyhow::{bail, Context, Result};
use clap::Parser;
use peagle_cli::hub::Hub;
use peagle_cli::model_source::{resolve_dir, resolve_model, ModelSource};
use peagle_cli::speculative_config::SpeculativeConfig;
use peagle_cli::{demo_model_dir, init_tracing_at};
use peagle_engine::{DraftModel, EngineBuilder, GenerationDefaults, SchedulerConfig, DEFAULT_GPU_MEMORY_UTILIZATION};
use peagle_models::{DTypeSpec, DeviceSpec, KvCacheDtype, LoadOptions};
use peagle_server::fd_limit::raise_open_files_limit;
use peagle_server::{start_engine, Parsers, ReasoningParser, Server, ServerConfig, ToolCallParser};
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

/// The demo drafter, next to the demo model.
const DEMO_DRAFTER: &str = "pystdlib-12l-peagle";
/// Its fastest K on the demo model's eval prompts (its model card: 1.08x at K = 3, 0.92x at 7).
const DEMO_K: usize = 3;

#[derive(Parser)]
#[command(version, about = "Serve a model over an OpenAI-compatible HTTP API")]
struct Args {
    /// Model directory, preset name (gpt-oss-20b, gpt-oss-120b, qwen3-coder-30b-a3b) or
    /// Hugging Face id, downloaded into the HF cache when it is not there.
    /// Default: the bundled demo model and its P-EAGLE drafter.
    #[arg(long)]
    model: Option<String>,
    /// Use only the local Hugging Face cache, never the network (also HF_HUB_OFFLINE=1).
    #[arg(long)]
    offline: bool,
    /// EAGLE-3 or P-EAGLE drafter (directory or Hugging Face id): enables speculative decoding.
    #[arg(long)]
    draft_model: Option<String>,
    /// Draft all K tokens in one P-EAGLE pass (always on for P-EAGLE checkpoints).
    #[arg(long)]
    parallel_drafting: bool,
    /// Drafts per step. Default: the preset's, else the drafter's published value, else 3.
    #[arg(long)]
    k: Option<usize>,
    /// vLLM's spelling: {"method":"eagle3","model":...,"num_speculative_tokens":K,"parallel_drafting":true}.
    #[arg(long, conflicts_with = "draft_model")]
    speculative_config: Option<String>,
    /// Turn speculation off while more than N sequences decode at once (vLLM's
    /// speculative_disable_by_batch_size). Default: no limit beyond the adaptive k.
    #[arg(long)]
    speculative_disable_by_batch_size: Option<usize>,
    /// Always draft the full K. Default: per batch size, the k (0 included) with the best
    /// measured goodput; see README "Speculation under load".
    #[arg(long)]
    fixed_k: bool,
    /// Address to listen on (0.0.0.0: all interfaces).
    #[arg(long, env = "PEAGLE_HOST", default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port (logged at start).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Clients must send `Authorization: Bearer KEY` to /v1 routes.
    #[arg(long, env = "PEAGLE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The model name clients send. Default: the --model argument (the demo's directory name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Most sequences in one engine step.
    #[arg(long)]
    max_num_seqs: Option<usize>,
    /// Longest sequence, prompt plus completion. Default: the model's max_position_embeddings.
    #[arg(long)]
    max_model_len: Option<usize>,
    /// Most tokens (prefill chunks plus verification windows) in one engine step.
    #[arg(long)]
    max_num_batched_tokens: Option<usize>,
    /// KV cache size in blocks. Default: room for --max-num-seqs full-length sequences, at most
    /// 4 GiB on the CPU or what --gpu-memory-utilization leaves on a GPU.
    #[arg(long)]
    kv_cache_blocks: Option<usize>,
    /// The share of the GPU's memory the engine may fill: the weights, a step's activations
    /// (measured at start-up by running the largest step) and the KV cache, which gets the rest.
    #[arg(long, default_value_t = DEFAULT_GPU_MEMORY_UTILIZATION)]
    gpu_memory_utilization: f64,
    /// Tokens per KV cache block.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Requests waiting for admission beyond which new ones get 503.
    #[arg(long)]
    max_waiting_requests: Option<usize>,
    /// Reuse the KV cache of identical prompt prefixes across requests (on by default, as
    /// in vLLM).
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    enable_prefix_caching: bool,
    /// Recompute every prompt from its first token.
    #[arg(long, overrides_with = "enable_prefix_caching")]
    no_enable_prefix_caching: bool,
    /// Where the model runs: auto (GPU 0 where the build has CUDA and the host a GPU, else
    /// the CPU), cpu, cuda or cuda:N.
    #[arg(long, default_value_t = DeviceSpec::Auto)]
    device: DeviceSpec,
    /// Activation dtype: auto (f32 on the CPU, bf16 on a GPU), f32, bf16 or f16.
    #[arg(long, default_value_t = DTypeSpec::Auto)]
    dtype: DTypeSpec,
    /// What the KV cache stores: auto (the model's dtype: bf16 for a bf16 checkpoint such as
    /// the demo model, else f32), f32, bf16 (half the memory and attention reads), or fp8
    /// (e4m3, a quarter, with the checkpoint's per-layer k_scale and v_scale or 1).
    #[arg(long, default_value_t = KvCacheDtype::Auto)]
    kv_cache_dtype: KvCacheDtype,
    /// Run decode and verification steps, and the drafter's passes, by CUDA graphs, captured at
    /// start-up for every batch shape of up to 512 rows (on a GPU).
    #[arg(long)]
    cuda_graphs: bool,
    /// vLLM's: run every step eagerly, without CUDA graphs (peagle's default until
    /// --cuda-graphs), so vLLM command lines that pass it work unchanged.
    #[arg(long, conflicts_with = "cuda_graphs")]
    enforce_eager: bool,
    /// Larger request bodies get 413.
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Seconds a request's headers get to arrive whole; slower connections are closed.
    #[arg(long, default_value_t = 30)]
    header_timeout: u64,
    /// Seconds a request's body gets to arrive whole; slower requests get 408.
    #[arg(long, default_value_t = 60)]
    body_timeout: u64,
    /// Seconds a connection with no request in flight may stay silent before it is closed
    /// (uvicorn's --timeout-keep-alive, 5 s in vLLM).
    #[arg(long, default_value_t = 5)]
    timeout_keep_alive: u64,
    /// Most sequences (prompts × n) one request may ask for; more get 400.
    #[arg(long, default_value_t = 256)]
    max_sequences_per_request: usize,
    /// MiB of responses kept in memory for the Responses API's previous_response_id and
    /// /v1/responses/{id}, the least recently used forgotten first; 0 keeps none.
    #[arg(long, default_value_t = 64)]
    responses_store_mb: usize,
    /// Seconds running requests get to finish after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 30)]
    shutdown_timeout: u64,
    /// Sampling defaults for requests that leave fields out: `auto` (the model's
    /// generation_config.json), `vllm` (OpenAI's neutral ones) or a directory holding a
    /// generation_config.json.
    #[arg(long, default_value = "auto")]
    generation_config: String,
    /// The chat template: a Jinja file, or the template itself; replaces the model's own
    /// (chat_template.jinja or tokenizer_config.json's). gpt-oss chats are harmony either way.
    #[arg(long)]
    chat_template: Option<String>,
    /// How answers carry tool calls, so that chats may offer tools, for models whose chat
    /// template offers them: `hermes` (`<tool_call>` blocks: Qwen2.5, Qwen3, Hermes) or
    /// `llama3_json` (JSON objects: Llama 3.1 and later); `openai` is harmony's, which gpt-oss
    /// always has.
    #[arg(long)]
    tool_call_parser: Option<ToolCallParser>,
    /// vLLM's companion of --tool-call-parser, accepted with it: a parser is what lets a chat
    /// offer tools.
    #[arg(long)]
    enable_auto_tool_choice: bool,
    /// How answers carry reasoning, given as `reasoning_content`: `qwen3` (an answer that
    /// opens `<think>` reasons up to `</think>`) or `deepseek_r1` (from its start); where the
    /// generation prompt opens or closes the thinking, that decides. `openai_gptoss` is
    /// harmony's, which gpt-oss always has.
    #[arg(long)]
    reasoning_parser: Option<ReasoningParser>,
    /// Origins browsers may call the API from (CORS), as a JSON list as vLLM takes it.
    #[arg(long, default_value = r#"["*"]"#)]
    allowed_origins: String,
    /// Put an X-Request-Id header on every response: the client's own, or a new one that also
    /// names the completion.
    #[arg(long)]
    enable_request_id_headers: bool,
}

fn main() {
    init_tracing_at("info");
    if let Err(e) = run(Args::parse()) {
        eprintln!("peagle-serve: {e:#}");
        std::process::exit(1);
    }
}

/// The longest a connection timeout may be: a day. More is no timeout at all in practice,
/// and near u64::MAX seconds a deadline overflows.
const MAX_TIMEOUT_SECONDS: u64 = 24 * 3600;

fn run(args: Args) -> Result<()> {
    let timeouts = [
        ("--header-timeout", args.header_timeout),
        ("--body-timeout", args.body_timeout),
        ("--timeout-keep-alive", args.timeout_keep_alive),
    ];
    if let Some((flag, seconds)) = timeouts.iter().find(|(_, s)| !(1..=MAX_TIMEOUT_SECONDS).contains(s)) {
        bail!("{flag} must be 1 to {MAX_TIMEOUT_SECONDS} seconds, not {seconds}");
    }
    if args.enable_auto_tool_choice && args.tool_call_parser.is_none() {
        bail!("--enable-auto-tool-choice needs --tool-call-parser (hermes, llama3_json, or openai for gpt-oss)");
    }
    if args.shutdown_timeout > MAX_TIMEOUT_SECONDS {
        bail!(
            "--shutdown-timeout must be at most {MAX_TIMEOUT_SECONDS} seconds, not {}",
            args.shutdown_timeout
        );
    }
    let allowed_origins: Vec<String> = serde_json::from_str(&args.allowed_origins).with_context(|| {
        format!(
            "--allowed-origins {}: expected a JSON list of origins such as '[\"https://example.com\"]'",
            args.allowed_origins
        )
    })?;
    let load = LoadOptions::place(args.device, args.dtype).context("--device / --dtype")?;
    let config = ServerConfig {
        api_key: args.api_key,
        max_body_bytes: args.max_body_bytes,
        shutdown_timeout: Duration::from_secs(args.shutdown_timeout),
        allowed_origins,
        request_id_headers: args.enable_request_id_headers,
        header_timeout: Duration::from_secs(args.header_timeout),
        body_timeout: Duration::from_secs(args.body_timeout),
        keep_alive_timeout: Duration::from_secs(args.timeout_keep_alive),
        max_sequences_per_request: args.max_sequences_per_request,
        responses_store_bytes: args.responses_store_mb.saturating_mul(1 << 20),
    };
    config.check()?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    // Bound before the model loads, as vLLM does: a port in use or a bad --host fails at once,
    // not after a download. Clients that connect meanwhile wait for the model.
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind((args.host.as_str(), args.port)))
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    let hub = Hub::from_env(args.offline)?;
    let speculative = args
        .speculative_config
        .as_deref()
        .map(SpeculativeConfig::parse)
        .transpose()?;
    let (name, source) = match &args.model {
        Some(model) => {
            let own_drafter = speculative.is_some() || args.draft_model.is_some();
            (model.clone(), resolve_model(model, &hub, !own_drafter)?)
        }
        None => demo()?,
    };
    let drafter = match (&speculative, &args.draft_model) {
        (Some(speculative), _) => Some(resolve_dir(&speculative.model, &hub)?),
        (None, Some(dir)) => Some(resolve_dir(dir, &hub)?),
        (None, None) => source.drafter.clone(),
    };
    let k = args
        .k
        .or(speculative.as_ref().and_then(|s| s.num_speculative_tokens))
        .or(source.k);
    if k == Some(0) {
        bail!("--k must be at least 1");
    }
    if drafter.is_none() && (k.is_some() || args.parallel_drafting) {
        bail!("--k and --parallel-drafting need a drafter (--draft-model or --speculative-config)");
    }
    let counts = [
        ("--block-size", Some(args.block_size)),
        ("--max-num-seqs", args.max_num_seqs),
        ("--max-num-batched-tokens", args.max_num_batched_tokens),
        ("--max-waiting-requests", args.max_waiting_requests),
        ("--max-sequences-per-request", Some(args.max_sequences_per_request)),
        ("--max-body-bytes", Some(args.max_body_bytes)),
    ];
    if let Some((flag, _)) = counts.iter().find(|(_, n)| *n == Some(0)) {
        bail!("{flag} must be at least 1");
    }
    let defaults = SchedulerConfig::default();
    let builder = EngineBuilder {
        draft: drafter.map(|dir| DraftModel {
            dir,
            k,
            parallel: args.parallel_drafting || speculative.as_ref().is_some_and(SpeculativeConfig::parallel),
        }),
        load,
        max_model_len: args.max_model_len,
        kv_cache_blocks: args.kv_cache_blocks,
        gpu_memory_utilization: args.gpu_memory_utilization,
        block_size: args.block_size,
        kv_cache_dtype: args.kv_cache_dtype,
        cuda_graphs: args.cuda_graphs && !args.enforce_eager,
        scheduler: SchedulerConfig {
            max_num_seqs: args.max_num_seqs.unwrap_or(defaults.max_num_seqs),
            max_num_batched_tokens: args.max_num_batched_tokens.unwrap_or(defaults.max_num_batched_tokens),
            max_speculative_batch: args
                .speculative_disable_by_batch_size
                .or(speculative.as_ref().and_then(|s| s.disable_by_batch_size))
                .unwrap_or(defaults.max_speculative_batch),
            adaptive_k: !args.fixed_k,
            max_waiting: args.max_waiting_requests.unwrap_or(defaults.max_waiting),
            prefix_caching: !args.no_enable_prefix_caching,
        },
        generation_defaults: match args.generation_config.as_str() {
            "auto" => GenerationDefaults::Auto,
            "vllm" => GenerationDefaults::Neutral,
            dir => GenerationDefaults::Dir(dir.into()),
        },
        ..EngineBuilder::new(source.target.clone())
    };
    let name = args.served_model_name.unwrap_or(name);
    let parsers = Parsers {
        tool_call: args.tool_call_parser,
        reasoning: args.reasoning_parser,
    };
    let (engine, model) = start_engine(name, &builder, args.chat_template.as_deref(), parsers)
        .with_context(|| format!("cannot load {}", source.target.display()))?;
    match raise_open_files_limit() {
        Ok(limit) => tracing::info!(limit, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    runtime.block_on(async {
        let addr = listener.local_addr()?;
        tracing::info!(%addr, model = %model.name, "listening");
        eprintln!("peagle-serve: listening on http://{addr}");
        let shutdown = shutdown_signal()?;
        let watched = engine.clone();
        Server::new(engine, model, config)
            .context("starting the text worker threads")?
            .serve(listener, shutdown)
            .await?;
        if let Some(why) = watched.failure() {
            bail!("the engine failed: {why}");
        }
        tracing::info!("stopped");
        Ok(())
    })
}

/// The bundled demo model, with its P-EAGLE drafter when that is there too.
fn demo() -> Result<(String, ModelSource)> {
    let target = demo_model_dir()?;
    let drafter = target.with_file_name(DEMO_DRAFTER);
    let name = target
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("demo")
        .to_string();
    let has_drafter = drafter.join("config.json").exists();
    let source = ModelSource {
        drafter: has_drafter.then_some(drafter),
        target,
        k: has_drafter.then_some(DEMO_K),
    };
    Ok((name, source))
}

/// Completes on the first SIGINT or SIGTERM.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>> {
    let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut terminate = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}
