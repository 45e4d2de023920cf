//! Threads of their own for the per-token text work of every choice: detokenizing, matching
//! stop strings, spelling logprobs. That work grows with what a request asks for, so it runs
//! here, on a small runtime apart from the one serving connections: a request with costly
//! text work slows only the choices that share these threads, never accepting, reading or
//! `/health`.

use std::future::Future;
use tokio::runtime::{Builder, Runtime};

/// Most text threads: detokenizing a token takes microseconds, so a few keep up with many
/// streams, and the rest of the cores stay with the engine.
const MAX_THREADS: usize = 4;

pub struct TextWorkers {
    /// Always Some until dropped.
    runtime: Option<Runtime>,
}

impl TextWorkers {
    pub fn start() -> std::io::Result<Self> {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(MAX_THREADS);
        let runtime = Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("peagle-text")
            .enable_time()
            .build()?;
        Ok(Self { runtime: Some(runtime) })
    }

    pub fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) {
        if let Some(runtime) = &self.runtime {
            runtime.spawn(work);
        }
    }
}

impl Drop for TextWorkers {
    /// The server may drop its state from within the async runtime, where a runtime may not
    /// block to wait for its tasks: those still running are left to end with the process.
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
