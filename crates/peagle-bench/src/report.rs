use crate::{BenchError, BenchResult, LevelResult, StepBreakdown};
use peagle_plot::{line_chart, Chart, Series};
use std::path::Path;

/// Writes `result.json`, `summary.md`, `throughput.png` and `latency.png` into `dir`, creating it.
pub fn write_report(result: &BenchResult, dir: &Path) -> Result<(), BenchError> {
    create_dir(dir)?;
    write_json(dir, "result.json", result)?;
    let w = &result.config.workload;
    let summary = format!(
        "# peagle-bench serve\n\nModel `{}` at {}, {} prompts from `{}` ({} endpoint), {} new tokens each, \
         temperature {}.\n\n{}",
        result.model,
        result.config.url,
        w.num_prompts,
        w.dataset.display(),
        w.endpoint.as_str(),
        w.max_tokens,
        w.temperature,
        summary_table(&result.levels),
    );
    let steps: Vec<StepRow> = result
        .levels
        .iter()
        .map(|l| StepRow {
            label: l.concurrency.to_string(),
            output_tokens: l.total_output_tokens as f64,
            engine: l.engine,
        })
        .collect();
    let mut summary = format!("{summary}\n{}", step_table("concurrency", &steps));
    let failures = result.failures();
    if !failures.is_empty() {
        summary.push_str("\nFailures (the figures above are over the requests that completed):\n\n");
        for line in failures {
            summary.push_str(&format!("- {line}\n"));
        }
    }
    write_text(dir, "summary.md", summary)?;
    write_plots(&result.levels, dir)
}

/// Output tokens/s, and the median latencies, against concurrency.
fn write_plots(levels: &[LevelResult], dir: &Path) -> Result<(), BenchError> {
    let against_concurrency = |name: &str, value: &dyn Fn(&LevelResult) -> Option<f64>| Series {
        name: name.into(),
        points: levels
            .iter()
            .filter_map(|l| Some((l.concurrency as f64, value(l)?)))
            .collect(),
    };
    let throughput = [against_concurrency("output tokens/s", &|l| Some(l.output_throughput))];
    let chart = Chart {
        title: "Output throughput",
        x_desc: "concurrency",
        y_desc: "tokens/s",
        x_log: true,
        y_range: None,
    };
    line_chart(&dir.join("throughput.png"), &chart, &throughput)?;
    let latency = [
        against_concurrency("TTFT p50", &|l| l.ttft_ms.map(|s| s.p50)),
        against_concurrency("TPOT p50", &|l| l.tpot_ms.map(|s| s.p50)),
        against_concurrency("ITL p50", &|l| l.itl_ms.map(|s| s.p50)),
    ];
    let chart = Chart {
        title: "Median latencies",
        y_desc: "ms",
        ..chart
    };
    line_chart(&dir.join("latency.png"), &chart, &latency)?;
    Ok(())
}

/// A Markdown table with one row per concurrency level.
pub fn summary_table(levels: &[LevelResult]) -> String {
    let mut table = String::from(
        "| concurrency | completed | failed | req/s | output tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms \
         | ITL p50 ms | ITL p99 ms | acceptance length | mean k |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for level in levels {
        let cells = [
            level.concurrency.to_string(),
            level.completed.to_string(),
            level.failed.to_string(),
            format!("{:.2}", level.request_throughput),
            format!("{:.1}", level.output_throughput),
            cell(level.ttft_ms.map(|s| s.p50)),
            cell(level.ttft_ms.map(|s| s.p99)),
            cell(level.tpot_ms.map(|s| s.p50)),
            cell(level.itl_ms.map(|s| s.p50)),
            cell(level.itl_ms.map(|s| s.p99)),
            two_places(level.acceptance_length),
            two_places(level.mean_draft_length),
        ];
        table.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    table
}

/// One row of the engine-time table.
pub struct StepRow {
    pub label: String,
    pub output_tokens: f64,
    pub engine: Option<StepBreakdown>,
}

/// Where the server's engine time went per step, by phase; empty when the server does not
/// export it.
pub fn step_table(first_column: &str, rows: &[StepRow]) -> String {
    if rows.iter().all(|r| r.engine.is_none()) {
        return String::new();
    }
    let mut table = format!(
        "Engine time per step (ms), from the server's `engine_step_seconds_total`; busy = share of the \
         wall time spent in engine steps.\n\n| {first_column} | steps | output tokens/step | target | drafter \
         | verify | other | busy |\n|---|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for row in rows {
        let Some(e) = row.engine else { continue };
        table.push_str(&format!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0}% |\n",
            row.label,
            e.steps,
            row.output_tokens / e.steps,
            e.target_ms,
            e.drafter_ms,
            e.verify_ms,
            e.other_ms,
            100.0 * e.busy_fraction
        ));
    }
    table
}

/// A latency in ms, or `-` where there was nothing to measure.
fn cell(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.1}"))
}

pub(crate) fn two_places(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| format!("{v:.2}"))
}

pub(crate) fn create_dir(dir: &Path) -> Result<(), BenchError> {
    std::fs::create_dir_all(dir).map_err(|source| BenchError::Write {
        path: dir.to_path_buf(),
        source,
    })
}

pub(crate) fn write_text(dir: &Path, name: &str, contents: String) -> Result<(), BenchError> {
    let path = dir.join(name);
    std::fs::write(&path, contents).map_err(|source| BenchError::Write { path, source })
}

pub(crate) fn write_json(dir: &Path, name: &str, value: &impl serde::Serialize) -> Result<(), BenchError> {
    let json = serde_json::to_string_pretty(value).expect("results serialise: plain numbers and strings");
    write_text(dir, name, json + "\n")
}
