//! A blocking call given up on once it goes too long without progress. The hub client (ureq
//! under hf-hub) sets no read timeout, so a connection that stops sending would block a
//! download, and the server's start-up, forever. A limit on the whole call would cut off a
//! large download that is still arriving: the limit is on the quiet between signs of progress.

use anyhow::{anyhow, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The last sign of progress of a call, which the call gives each time it makes some.
pub struct Beat {
    start: Instant,
    /// Microseconds from `start` to the last sign.
    last: AtomicU64,
}

impl Beat {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    /// The call made progress now.
    pub fn now(&self) {
        self.last
            .store(self.start.elapsed().as_micros() as u64, Ordering::Relaxed);
    }

    /// How long since the last sign of progress, or since the call began.
    fn quiet(&self) -> Duration {
        self.start
            .elapsed()
            .saturating_sub(Duration::from_micros(self.last.load(Ordering::Relaxed)))
    }
}

/// Runs `call` on a thread of its own and returns what it returns, or None once `limit` has
/// passed with no sign of progress (its beat, or its start). A call given up on is left
/// blocked on its thread; the caller fails, and the process with it. A panic in the call is
/// resumed here, as if it had run on the caller's thread.
pub fn unless_stalled<T: Send + 'static>(
    limit: Duration,
    call: impl FnOnce(&Beat) -> T + Send + 'static,
) -> Result<Option<T>> {
    let beat = Arc::new(Beat::new());
    let (sender, receiver) = mpsc::channel();
    let thread = {
        let beat = beat.clone();
        std::thread::Builder::new()
            .name("hub-fetch".into())
            .spawn(move || {
                let _ = sender.send(call(&beat));
            })
            .map_err(|e| anyhow!("cannot start a thread for the hub: {e}"))?
    };
    loop {
        let quiet = beat.quiet();
        if quiet >= limit {
            return Ok(None);
        }
        match receiver.recv_timeout(limit - quiet) {
            Ok(value) => return Ok(Some(value)),
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => match thread.join() {
                Err(panic) => std::panic::resume_unwind(panic),
                Ok(()) => unreachable!("the call's thread ends only after sending or panicking"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten times the gaps between beats below, so that a busy machine's late wake-ups still
    /// fall well within it.
    const LIMIT: Duration = Duration::from_secs(1);

    #[test]
    fn a_call_that_keeps_making_progress_runs_past_the_limit() {
        let started = Instant::now();
        let got = unless_stalled(LIMIT, |beat| {
            for _ in 0..15 {
                std::thread::sleep(LIMIT / 10);
                beat.now();
            }
            7
        })
        .unwrap();
        assert_eq!(got, Some(7));
        assert!(started.elapsed() > LIMIT);
    }

    #[test]
    fn a_quiet_call_is_given_up_on_and_its_caller_goes_on() {
        let (release, blocked) = mpsc::channel::<()>();
        let started = Instant::now();
        let got = unless_stalled(LIMIT, move |beat| {
            beat.now();
            let _ = blocked.recv();
        })
        .unwrap();
        assert_eq!(got, None);
        assert!(started.elapsed() >= LIMIT);
        drop(release);
    }

    #[test]
    #[should_panic(expected = "the call's own panic")]
    fn a_panic_in_the_call_reaches_the_caller() {
        let _ = unless_stalled(LIMIT, |_| -> u8 { panic!("the call's own panic") });
    }
}
