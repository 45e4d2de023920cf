//! The sweep's comparison: per mode and concurrency, output tokens/s over the repeats, speedup
//! over no speculation (of the means, and within each repeat) and over the best EAGLE-3 mode,
//! acceptance length and mean k. Written as `sweep.json`, `sweep.md` and `sweep.png`.

use crate::report::{create_dir, step_table, two_places, write_json, write_text, StepRow};
use crate::sweep::{modes, Method, Mode, SweepConfig, SweepFailure, SweepOutcome, SweepRun};
use crate::{BenchError, StepBreakdown};
use peagle_plot::{line_chart, Chart, Series};
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::Path;

#[derive(Debug, Clone, Serialize)]
pub struct SweepRow {
    pub mode: Mode,
    pub concurrency: usize,
    /// Output tokens/s of each repeat, in order.
    pub output_throughput: Vec<f64>,
    pub mean_output_throughput: f64,
    /// Mean tokens/s over the no-speculation mode's at the same concurrency.
    pub vs_no_speculation: Option<f64>,
    /// Per repeat, tokens/s over the no-speculation mode's in the same repeat. The two ran
    /// minutes apart rather than a whole sweep, so these show whether a mode is slower than
    /// plain decoding in every repeat or only on average over a noisy host.
    pub vs_no_speculation_per_repeat: Vec<f64>,
    /// Mean tokens/s over the fastest EAGLE-3 mode's at the same concurrency.
    pub vs_best_eagle3: Option<f64>,
    pub acceptance_length: Option<f64>,
    pub mean_draft_length: Option<f64>,
    /// Engine time per step, averaged over the repeats.
    pub engine: Option<StepBreakdown>,
    pub mean_output_tokens: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SweepReport {
    pub config: SweepConfig,
    pub rows: Vec<SweepRow>,
    pub runs: Vec<SweepRun>,
    /// Modes that failed in a repeat; the rows hold what they finished.
    pub failures: Vec<SweepFailure>,
}

/// Aggregates the runs of every mode at every concurrency; the rows come grouped by
/// concurrency, modes in sweep order. A mode that failed in a repeat is averaged over the
/// repeats that finished its level.
pub fn compare(config: &SweepConfig, outcome: SweepOutcome) -> SweepReport {
    let SweepOutcome { runs, failures } = outcome;
    let mut rows = Vec::new();
    for &concurrency in &config.workload.concurrency {
        let group: Vec<SweepRow> = modes(config)
            .into_iter()
            .map(|mode| aggregate(mode, concurrency, &runs))
            .collect();
        let fastest = |method: Method| {
            group
                .iter()
                .filter(|r| r.mode.method == method)
                .map(|r| r.mean_output_throughput)
                .reduce(f64::max)
                .filter(|t| *t > 0.0)
        };
        let (plain, eagle3) = (fastest(Method::Plain), fastest(Method::Eagle3));
        let plain_mode = group
            .iter()
            .find(|r| r.mode.method == Method::Plain)
            .map(|r| r.mode.clone());
        for mut row in group {
            if row.output_throughput.is_empty() {
                // Failed in every repeat: nothing to compare.
                rows.push(row);
                continue;
            }
            row.vs_no_speculation = plain.map(|p| row.mean_output_throughput / p);
            if let Some(plain_mode) = &plain_mode {
                row.vs_no_speculation_per_repeat = paired_ratios(&row.mode, plain_mode, concurrency, &runs);
            }
            row.vs_best_eagle3 = eagle3.map(|e| row.mean_output_throughput / e);
            rows.push(row);
        }
    }
    SweepReport {
        config: config.clone(),
        rows,
        runs,
        failures,
    }
}

/// For each repeat that ran both, `mode`'s tokens/s at `concurrency` over `base`'s.
fn paired_ratios(mode: &Mode, base: &Mode, concurrency: usize, runs: &[SweepRun]) -> Vec<f64> {
    let throughput = |m: &Mode, repeat: usize| {
        runs.iter()
            .find(|r| r.mode.name == m.name && r.repeat == repeat)
            .and_then(|r| r.result.levels.iter().find(|l| l.concurrency == concurrency))
            .map(|l| l.output_throughput)
            .filter(|t| *t > 0.0)
    };
    let repeats: BTreeSet<usize> = runs.iter().map(|r| r.repeat).collect();
    repeats
        .into_iter()
        .filter_map(|r| Some(throughput(mode, r)? / throughput(base, r)?))
        .collect()
}

/// One mode at one concurrency, over its repeats; the speedups are filled in by `compare`.
fn aggregate(mode: Mode, concurrency: usize, runs: &[SweepRun]) -> SweepRow {
    let levels: Vec<_> = runs
        .iter()
        .filter(|r| r.mode.name == mode.name)
        .filter_map(|r| r.result.levels.iter().find(|l| l.concurrency == concurrency))
        .collect();
    let mean_of = |values: &[f64]| (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64);
    let throughput: Vec<f64> = levels.iter().map(|l| l.output_throughput).collect();
    let tokens: Vec<f64> = levels.iter().map(|l| l.total_output_tokens as f64).collect();
    let acceptance: Vec<f64> = levels.iter().filter_map(|l| l.acceptance_length).collect();
    let draft_length: Vec<f64> = levels.iter().filter_map(|l| l.mean_draft_length).collect();
    SweepRow {
        mode,
        concurrency,
        mean_output_throughput: mean_of(&throughput).unwrap_or(0.0),
        output_throughput: throughput,
        vs_no_speculation: None,
        vs_no_speculation_per_repeat: Vec::new(),
        vs_best_eagle3: None,
        acceptance_length: mean_of(&acceptance),
        mean_draft_length: mean_of(&draft_length),
        engine: mean_breakdown(levels.iter().filter_map(|l| l.engine).collect()),
        mean_output_tokens: mean_of(&tokens).unwrap_or(0.0),
    }
}

/// Writes `sweep.json`, `sweep.md` and `sweep.png` into `dir`.
pub fn write_sweep_report(report: &SweepReport, dir: &Path) -> Result<(), BenchError> {
    create_dir(dir)?;
    write_json(dir, "sweep.json", report)?;
    let c = &report.config;
    let markdown = format!(
        "# peagle-bench sweep\n\nTarget `{}`; P-EAGLE drafter `{}`; EAGLE-3 drafter `{}`. {} prompts from `{}` \
         ({} endpoint), {} new tokens each, temperature {}; {} repeat(s), modes interleaved within each, \
         each repeat starting at another mode. Server arguments added to every mode: `{}`.\n\n{}",
        c.model,
        c.peagle_draft_model.as_deref().unwrap_or("-"),
        c.eagle3_draft_model.as_deref().unwrap_or("-"),
        c.workload.num_prompts,
        c.workload.dataset.display(),
        c.workload.endpoint.as_str(),
        c.workload.max_tokens,
        c.workload.temperature,
        c.repeats,
        c.server_args.join(" "),
        sweep_table(&report.rows),
    );
    let steps: Vec<StepRow> = report
        .rows
        .iter()
        .map(|r| StepRow {
            label: format!("{} at concurrency {}", r.mode.name, r.concurrency),
            output_tokens: r.mean_output_tokens,
            engine: r.engine,
        })
        .collect();
    let mut markdown = format!("{markdown}\n{}", step_table("mode", &steps));
    if !report.failures.is_empty() {
        markdown.push_str("\n## Failed runs\n\nThe rows above average the repeats that finished each level.\n\n");
        for f in &report.failures {
            markdown.push_str(&format!("- {}, repeat {}: {}\n", f.mode.name, f.repeat + 1, f.reason));
        }
    }
    write_text(dir, "sweep.md", markdown)?;
    let series: Vec<Series> = modes(c)
        .into_iter()
        .map(|mode| Series {
            points: report
                .rows
                .iter()
                .filter(|r| r.mode.name == mode.name && !r.output_throughput.is_empty())
                .map(|r| (r.concurrency as f64, r.mean_output_throughput))
                .collect(),
            name: mode.name,
        })
        .collect();
    let chart = Chart {
        title: "Output throughput by mode",
        x_desc: "concurrency",
        y_desc: "tokens/s",
        x_log: true,
        y_range: None,
    };
    // Every mode failed in every repeat: the Markdown says so, and there is nothing to plot.
    if series.iter().any(|s| !s.points.is_empty()) {
        line_chart(&dir.join("sweep.png"), &chart, &series)?;
    }
    Ok(())
}

/// The field-by-field mean of per-repeat breakdowns.
fn mean_breakdown(all: Vec<StepBreakdown>) -> Option<StepBreakdown> {
    let n = all.len() as f64;
    let mean = |f: fn(&StepBreakdown) -> f64| all.iter().map(f).sum::<f64>() / n;
    (!all.is_empty()).then(|| StepBreakdown {
        steps: mean(|b| b.steps),
        target_ms: mean(|b| b.target_ms),
        drafter_ms: mean(|b| b.drafter_ms),
        verify_ms: mean(|b| b.verify_ms),
        other_ms: mean(|b| b.other_ms),
        busy_fraction: mean(|b| b.busy_fraction),
    })
}

/// One line per row, in the rows' order (`compare` groups them by concurrency).
pub fn sweep_table(rows: &[SweepRow]) -> String {
    let mut table = String::from(
        "| concurrency | mode | output tok/s | range over repeats | vs no speculation | same, per repeat \
         | vs best EAGLE-3 | acceptance length | mean k |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let ratio = |r: Option<f64>| r.map_or("-".into(), |r| format!("{r:.2}x"));
        let cells = [
            row.concurrency.to_string(),
            row.mode.name.clone(),
            match row.output_throughput.is_empty() {
                true => "-".into(),
                false => format!("{:.1}", row.mean_output_throughput),
            },
            range(&row.output_throughput).map_or("-".into(), |(lo, hi)| format!("{lo:.1} - {hi:.1}")),
            ratio(row.vs_no_speculation),
            range(&row.vs_no_speculation_per_repeat).map_or("-".into(), |(lo, hi)| format!("{lo:.2}x - {hi:.2}x")),
            ratio(row.vs_best_eagle3),
            two_places(row.acceptance_length),
            two_places(row.mean_draft_length),
        ];
        table.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    table
}

/// Lowest and highest of two or more values.
fn range(values: &[f64]) -> Option<(f64, f64)> {
    let lo = values.iter().copied().reduce(f64::min)?;
    let hi = values.iter().copied().reduce(f64::max)?;
    (values.len() > 1).then_some((lo, hi))
}
