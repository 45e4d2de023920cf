use crate::{BenchError, BenchResult, LevelResult};
use std::path::Path;

/// Writes `result.json` and `summary.md` into `dir`, creating it.
pub fn write_report(result: &BenchResult, dir: &Path) -> Result<(), BenchError> {
    let write = |name: &str, contents: String| {
        let path = dir.join(name);
        std::fs::write(&path, contents).map_err(|source| BenchError::Write { path, source })
    };
    std::fs::create_dir_all(dir).map_err(|source| BenchError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let json = serde_json::to_string_pretty(result).expect("results serialise: plain numbers and strings");
    write("result.json", json + "\n")?;
    let config = &result.config;
    let summary = format!(
        "# peagle-bench serve\n\nModel `{}` at {}, {} prompts from `{}`, {} new tokens each, temperature {}.\n\n{}",
        result.model,
        config.url,
        config.num_prompts,
        config.dataset.display(),
        config.max_tokens,
        config.temperature,
        summary_table(&result.levels),
    );
    write("summary.md", summary)
}

/// A Markdown table with one row per concurrency level.
pub fn summary_table(levels: &[LevelResult]) -> String {
    let mut table = String::from(
        "| concurrency | req/s | output tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | ITL p50 ms | ITL p99 ms \
         | acceptance length |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for level in levels {
        let cells = [
            level.concurrency.to_string(),
            format!("{:.2}", level.request_throughput),
            format!("{:.1}", level.output_throughput),
            cell(level.ttft_ms.map(|s| s.p50)),
            cell(level.ttft_ms.map(|s| s.p99)),
            cell(level.tpot_ms.map(|s| s.p50)),
            cell(level.itl_ms.map(|s| s.p50)),
            cell(level.itl_ms.map(|s| s.p99)),
            level.acceptance_length.map_or("-".into(), |a| format!("{a:.2}")),
        ];
        table.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    table
}

/// A latency in ms, or `-` where there was nothing to measure.
fn cell(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.1}"))
}
