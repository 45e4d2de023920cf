use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use peagle_bench::{summary_table, write_report, BenchConfig};
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
    /// Streams completions at each concurrency level and reports throughput, latency and acceptance.
    Serve(ServeArgs),
}

#[derive(Args)]
struct ServeArgs {
    /// Base URL of the server.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// JSONL file of {"prompt": ...} lines.
    #[arg(long)]
    dataset: PathBuf,
    /// Prompts per level: the dataset's first N, cycled if it has fewer.
    #[arg(long, default_value_t = 100)]
    num_prompts: usize,
    /// Comma-separated maximum requests in flight, one level each.
    #[arg(long, value_delimiter = ',', default_value = "1", value_parser = positive)]
    concurrency: Vec<usize>,
    /// New tokens per request (EOS is ignored so every request makes exactly this many).
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Model to request; default: the first the server lists.
    #[arg(long)]
    model: Option<String>,
    /// Where result.json and summary.md go.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

/// A concurrency of 0 would never send a request.
fn positive(text: &str) -> Result<usize, String> {
    match text.parse() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{e}")),
    }
}

#[tokio::main]
async fn main() {
    let Command::Serve(args) = Cli::parse().command;
    if let Err(e) = serve(args).await {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn serve(args: ServeArgs) -> Result<()> {
    let config = BenchConfig {
        url: args.url,
        dataset: args.dataset,
        num_prompts: args.num_prompts,
        concurrency: args.concurrency,
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        model: args.model,
    };
    let result = peagle_bench::run(&config).await?;
    write_report(&result, &args.out)?;
    print!("{}", summary_table(&result.levels));
    eprintln!("wrote {}", args.out.join("result.json").display());
    Ok(())
}
