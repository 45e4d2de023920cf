use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use peagle_bench::{compare, modes, run_sweep, summary_table, sweep_table, write_report};
use peagle_bench::{positive, BenchConfig, PrefixConfig, SweepConfig, Workload};
use std::path::PathBuf;

/// Benchmarks an OpenAI-compatible server.
#[derive(Parser)]
#[command(name = "peagle-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Streams requests at each concurrency level and reports throughput, latency and acceptance.
    Serve(ServeArgs),
    /// Starts peagle-serve once per mode (no speculation, EAGLE-3 and P-EAGLE at several K), runs
    /// the same workload against each and writes one comparison.
    Sweep(SweepArgs),
    /// Starts peagle-serve with prefix caching and without, and compares a shared-prefix
    /// workload's TTFT and a multi-turn chat's throughput.
    Prefix(PrefixArgs),
}

#[derive(Args)]
struct PrefixArgs {
    /// Target model (directory, preset or Hugging Face id), as peagle-serve takes it.
    #[arg(long)]
    model: String,
    /// JSONL of {"prompt": ...}: system prompts are built from its lines, questions are their
    /// first lines.
    #[arg(long)]
    dataset: PathBuf,
    /// Tokens of the system prompt every shared-prefix request starts with.
    #[arg(long, default_value_t = 700, value_parser = positive)]
    prefix_tokens: usize,
    /// Shared-prefix requests, sent one at a time after a warm-up one.
    #[arg(long, default_value_t = 16, value_parser = positive)]
    requests: usize,
    /// Tokens of the multi-turn chats' system prompt.
    #[arg(long, default_value_t = 300, value_parser = positive)]
    chat_prefix_tokens: usize,
    /// Chats at once.
    #[arg(long, default_value_t = 4, value_parser = positive)]
    conversations: usize,
    #[arg(long, default_value_t = 4, value_parser = positive)]
    turns: usize,
    /// Tokens of every answer.
    #[arg(long, default_value_t = 32, value_parser = positive)]
    max_tokens: usize,
    /// An argument for both servers, e.g. --server-arg=--draft-model=DIR (repeatable).
    #[arg(long, allow_hyphen_values = true)]
    server_arg: Vec<String>,
    /// The peagle-serve binary. Default: the one next to peagle-bench.
    #[arg(long)]
    serve_bin: Option<PathBuf>,
    /// Where prefix.json and prefix.md go.
    #[arg(long, default_value = "bench-results/prefix")]
    out: PathBuf,
}

#[derive(Args)]
struct ServeArgs {
    /// Base URL of the server.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    #[command(flatten)]
    workload: Workload,
    /// Model to request; default: the first the server lists.
    #[arg(long)]
    model: Option<String>,
    /// Where result.json, summary.md and the plots go.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

#[derive(Args)]
struct SweepArgs {
    /// Target model (directory, preset or Hugging Face id), as peagle-serve takes it.
    #[arg(long)]
    model: String,
    /// P-EAGLE drafter, run at each --peagle-k.
    #[arg(long)]
    draft_model: Option<String>,
    /// EAGLE-3 drafter, run at each --eagle3-k.
    #[arg(long)]
    eagle3_draft_model: Option<String>,
    #[arg(long, value_delimiter = ',', default_value = "3,5,7", value_parser = positive)]
    peagle_k: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "1,3,5", value_parser = positive)]
    eagle3_k: Vec<usize>,
    /// Passes over all modes; the modes interleave within each pass.
    #[arg(long, default_value_t = 1, value_parser = positive)]
    repeats: usize,
    /// Where every server runs its models: auto, cpu, cuda or cuda:N (peagle-serve's --device).
    #[arg(long, default_value = "auto")]
    device: String,
    /// Every server's activation dtype: auto, f32, bf16 or f16 (peagle-serve's --dtype).
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// An argument for every server, e.g. --server-arg=--fixed-k (repeatable).
    #[arg(long, allow_hyphen_values = true)]
    server_arg: Vec<String>,
    /// The peagle-serve binary. Default: the one next to peagle-bench.
    #[arg(long)]
    serve_bin: Option<PathBuf>,
    #[command(flatten)]
    workload: Workload,
    /// Where sweep.json, sweep.md, sweep.png and each run's report go.
    #[arg(long, default_value = "bench-results/sweep")]
    out: PathBuf,
}

#[tokio::main]
async fn main() {
    let result = match Cli::parse().command {
        Command::Serve(args) => serve(args).await,
        Command::Sweep(args) => sweep(args).await,
        Command::Prefix(args) => prefix(args).await,
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn serve(args: ServeArgs) -> Result<()> {
    let config = BenchConfig {
        url: args.url,
        model: args.model,
        workload: args.workload,
    };
    // Before the run, so an --out that cannot be written fails at once, not after it.
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create --out {}", args.out.display()))?;
    let result = peagle_bench::run(&config).await?;
    write_report(&result, &args.out)?;
    print!("{}", summary_table(&result.levels));
    eprintln!("wrote {}", args.out.display());
    let failures = result.failures();
    if !failures.is_empty() {
        anyhow::bail!(
            "{} (listed in {})",
            failures.join("; "),
            args.out.join("summary.md").display()
        );
    }
    Ok(())
}

/// The peagle-serve binary: `--serve-bin`, else the one next to peagle-bench.
fn serve_bin(given: Option<PathBuf>) -> Result<PathBuf> {
    match given {
        Some(bin) => Ok(bin),
        None => Ok(std::env::current_exe()
            .context("locating peagle-bench")?
            .with_file_name("peagle-serve")),
    }
}

async fn prefix(args: PrefixArgs) -> Result<()> {
    let config = PrefixConfig {
        serve_bin: serve_bin(args.serve_bin)?,
        model: args.model,
        server_args: args.server_arg,
        dataset: args.dataset,
        prefix_tokens: args.prefix_tokens,
        requests: args.requests,
        chat_prefix_tokens: args.chat_prefix_tokens,
        conversations: args.conversations,
        turns: args.turns,
        max_tokens: args.max_tokens,
    };
    peagle_bench::load_prompts(&config.dataset, 1)?;
    // Before the servers run, so an --out that cannot be written fails at once, not after them.
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create --out {}", args.out.display()))?;
    let report = peagle_bench::run_prefix(&config).await?;
    peagle_bench::write_prefix_report(&report, &args.out)?;
    print!("{}", report.table());
    eprintln!("wrote {}", args.out.display());
    Ok(())
}

async fn sweep(args: SweepArgs) -> Result<()> {
    let serve_bin = serve_bin(args.serve_bin)?;
    let config = SweepConfig {
        serve_bin,
        model: args.model,
        peagle_draft_model: args.draft_model,
        eagle3_draft_model: args.eagle3_draft_model,
        peagle_k: args.peagle_k,
        eagle3_k: args.eagle3_k,
        repeats: args.repeats,
        server_args: [
            vec!["--device".into(), args.device, "--dtype".into(), args.dtype],
            args.server_arg,
        ]
        .concat(),
        workload: args.workload,
    };
    // Each mode's runs share a directory: a K listed twice would overwrite its own results.
    for (flag, ks) in [("--peagle-k", &config.peagle_k), ("--eagle3-k", &config.eagle3_k)] {
        if let Some(k) = ks
            .iter()
            .enumerate()
            .find_map(|(i, k)| ks[..i].contains(k).then_some(k))
        {
            anyhow::bail!("{flag} lists {k} twice");
        }
    }
    // Read the dataset before starting any server, so a bad file fails at once.
    peagle_bench::load_prompts(&config.workload.dataset, config.workload.num_prompts)?;
    let outcome = run_sweep(&config, &args.out).await?;
    let report = compare(&config, outcome);
    print!("{}", sweep_table(&report.rows));
    eprintln!("wrote {}", args.out.display());
    match report.failures.len() {
        0 => Ok(()),
        n => anyhow::bail!(
            "{n} of {} runs failed (listed in {})",
            modes(&config).len() * config.repeats,
            args.out.join("sweep.md").display()
        ),
    }
}
