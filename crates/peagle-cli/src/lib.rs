//! Shared plumbing of the peagle binaries: they parse flags and call the library crates.

pub mod hub;
pub mod model_source;
pub mod report;
pub mod speculative_config;
pub mod stall;

use anyhow::{bail, Result};
use std::path::PathBuf;

/// Where the bundled demo model lives in a checkout.
pub const DEMO_MODEL: &str = "models/pystdlib-12l";

/// The demo model directory, found relative to the working directory or to this checkout.
pub fn demo_model_dir() -> Result<PathBuf> {
    let candidates = [
        PathBuf::from(DEMO_MODEL),
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(DEMO_MODEL),
    ];
    match candidates.iter().find(|p| p.join("config.json").exists()) {
        Some(dir) => Ok(dir.clone()),
        None => bail!("no --model given and the bundled demo model is not at {DEMO_MODEL}"),
    }
}

/// Logs to stderr, filtered by RUST_LOG (default: warnings).
pub fn init_tracing() {
    init_tracing_at("warn");
}

/// Logs to stderr, filtered by RUST_LOG, else at `default` ("info" for the server); in
/// colour on a terminal only, so that a log piped to a file stays plain text.
pub fn init_tracing_at(default: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default.into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
