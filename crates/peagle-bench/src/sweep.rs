//! `peagle-bench sweep`: one `peagle-serve` per mode (no speculation, EAGLE-3 and P-EAGLE at
//! several K), the same prompts and levels against each, modes interleaved within each repeat
//! and each repeat starting at another mode, so that drift in the machine's speed spreads over
//! all of them instead of favouring one.

use crate::error::error_chain;
use crate::server_process::ServerProcess;
use crate::sweep_report::{compare, write_sweep_report};
use crate::{run, write_report, BenchConfig, BenchError, BenchResult, Workload};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Longest wait for a server to load its models and listen.
const START_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Serialize)]
pub struct SweepConfig {
    pub serve_bin: PathBuf,
    pub model: String,
    /// P-EAGLE drafter: modes at each of `peagle_k`.
    pub peagle_draft_model: Option<String>,
    /// EAGLE-3 drafter: modes at each of `eagle3_k`.
    pub eagle3_draft_model: Option<String>,
    pub peagle_k: Vec<usize>,
    pub eagle3_k: Vec<usize>,
    /// Passes over all modes.
    pub repeats: usize,
    /// Passed to every server, e.g. `--fixed-k`.
    pub server_args: Vec<String>,
    pub workload: Workload,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Method {
    #[serde(rename = "none")]
    Plain,
    #[serde(rename = "eagle3")]
    Eagle3,
    #[serde(rename = "peagle")]
    PEagle,
}

#[derive(Debug, Clone, Serialize)]
pub struct Mode {
    pub name: String,
    pub method: Method,
    pub k: usize,
}

impl Mode {
    fn new(method: Method, k: usize) -> Self {
        let name = match method {
            Method::Plain => "no speculation".to_string(),
            Method::Eagle3 => format!("EAGLE-3 K={k}"),
            Method::PEagle => format!("P-EAGLE K={k}"),
        };
        Self { name, method, k }
    }

    /// A directory name: `none`, `eagle3-k3`, `peagle-k5`.
    fn slug(&self) -> String {
        match self.method {
            Method::Plain => "none".into(),
            Method::Eagle3 => format!("eagle3-k{}", self.k),
            Method::PEagle => format!("peagle-k{}", self.k),
        }
    }

    fn server_args(&self, config: &SweepConfig) -> Vec<String> {
        let mut args = vec!["--model".to_string(), config.model.clone()];
        let drafter = match self.method {
            Method::Plain => None,
            Method::Eagle3 => config.eagle3_draft_model.as_ref(),
            Method::PEagle => config.peagle_draft_model.as_ref(),
        };
        if let Some(dir) = drafter {
            args.extend(["--draft-model".into(), dir.clone(), "--k".into(), self.k.to_string()]);
        }
        if self.method == Method::PEagle {
            args.push("--parallel-drafting".into());
        }
        args.extend(config.server_args.iter().cloned());
        args
    }
}

/// The modes a configuration asks for: no speculation first, then each drafter at each K.
pub fn modes(config: &SweepConfig) -> Vec<Mode> {
    let mut modes = vec![Mode::new(Method::Plain, 0)];
    if config.eagle3_draft_model.is_some() {
        modes.extend(config.eagle3_k.iter().map(|k| Mode::new(Method::Eagle3, *k)));
    }
    if config.peagle_draft_model.is_some() {
        modes.extend(config.peagle_k.iter().map(|k| Mode::new(Method::PEagle, *k)));
    }
    modes
}

/// One mode's benchmark in one repeat.
#[derive(Debug, Clone, Serialize)]
pub struct SweepRun {
    pub mode: Mode,
    pub repeat: usize,
    pub result: BenchResult,
}

/// A mode that failed in one repeat: its server did not start, a level did not finish (the
/// levels before it are in the runs), or a level lost requests (it is left out of the runs).
#[derive(Debug, Clone, Serialize)]
pub struct SweepFailure {
    pub mode: Mode,
    pub repeat: usize,
    pub reason: String,
}

/// What a sweep ran: every run that finished a level, and every mode that failed.
#[derive(Debug, Clone, Default)]
pub struct SweepOutcome {
    pub runs: Vec<SweepRun>,
    pub failures: Vec<SweepFailure>,
}

/// Starts each mode's server in turn, benchmarks it, and writes each run's report under
/// `out/runs/MODE-rREPEAT`. Each repeat starts at another mode (see `repeat_order`). A mode
/// that fails is recorded and the sweep goes on: an hour of other modes is not lost to one.
/// The sweep's report in `out` is rewritten after every mode, so a sweep stopped part way
/// (a GPU lease running out) keeps what its finished modes measured.
pub async fn run_sweep(config: &SweepConfig, out: &Path) -> Result<SweepOutcome, BenchError> {
    let modes = modes(config);
    let mut outcome = SweepOutcome::default();
    for repeat in 0..config.repeats {
        for (i, mode) in repeat_order(&modes, repeat, config.repeats).enumerate() {
            eprintln!(
                "peagle-bench sweep: {} (mode {}/{}, repeat {}/{})",
                mode.name,
                i + 1,
                modes.len(),
                repeat + 1,
                config.repeats
            );
            let dir = out.join("runs").join(format!("{}-r{}", mode.slug(), repeat + 1));
            let failure = |reason: String| SweepFailure {
                mode: mode.clone(),
                repeat,
                reason,
            };
            let mut result = match run_mode(config, mode, &dir.join("server.log")).await {
                Ok(result) => result,
                Err(e) => {
                    // The report names the mode already.
                    let reason = match e {
                        BenchError::Server { reason, .. } => reason,
                        other => error_chain(&other),
                    };
                    eprintln!("peagle-bench sweep: {} failed: {reason}", mode.name);
                    outcome.failures.push(failure(reason));
                    write_sweep_report(&compare(config, outcome.clone()), out)?;
                    continue;
                }
            };
            write_report(&result, &dir)?;
            for failed in result.failures() {
                eprintln!("peagle-bench sweep: {} failed: {failed}", mode.name);
                outcome
                    .failures
                    .push(failure(format!("{failed} (its report is in {})", dir.display())));
            }
            // A level that lost requests ran another workload than the other modes' levels.
            result.levels.retain(|l| l.failed == 0);
            outcome.runs.push(SweepRun {
                mode: mode.clone(),
                repeat,
                result,
            });
            write_sweep_report(&compare(config, outcome.clone()), out)?;
        }
    }
    Ok(outcome)
}

/// Starts `mode`'s server, its log written to `log`, and benchmarks it.
async fn run_mode(config: &SweepConfig, mode: &Mode, log: &Path) -> Result<BenchResult, BenchError> {
    let (bin, args, what) = (config.serve_bin.clone(), mode.server_args(config), mode.name.clone());
    let log = log.to_path_buf();
    let started = std::time::Instant::now();
    let server =
        tokio::task::spawn_blocking(move || ServerProcess::start(&bin, &args, &what, START_TIMEOUT, Some(&log)))
            .await
            .expect("the start thread does not panic")?;
    eprintln!(
        "peagle-bench sweep: {} listening after {:.1} s",
        mode.name,
        started.elapsed().as_secs_f64()
    );
    let bench = BenchConfig {
        url: server.url.clone(),
        model: None,
        workload: config.workload.clone(),
    };
    run(&bench).await
}

/// The modes of repeat `repeat` of `repeats`: rotated so that each repeat starts a fraction
/// of the list further on. On this host a run's place in the order mattered (the last mode of
/// every repeat, P-EAGLE K=7, ran 0.68x to 0.94x plain at concurrency 16 without drafting,
/// and 1.05x when run before plain), so no mode may always hold the same place.
fn repeat_order(modes: &[Mode], repeat: usize, repeats: usize) -> impl Iterator<Item = &Mode> {
    let shift = repeat * modes.len() / repeats.max(1);
    modes.iter().cycle().skip(shift).take(modes.len())
}
