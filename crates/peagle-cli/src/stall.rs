//! A blocking call given up on once it goes too long without progress. The hub client (ureq
//! under hf-hub) sets no read timeout, so a connection that stops sending would block a
//! download, and the server's start-up, forever. A limit on the whole call would cut off a
//! large download that is still arriving: the limit is on the quiet between signs of progress,
//! with an allowance of its own before the first, for a call that starts with several requests.

use anyhow::{anyhow, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The last sign of progress of a call, which the call gives each time it makes some.
pub struct Beat {
    start: Instant,
    /// Microseconds from `start` to the last sign; NONE before the first.
    last: AtomicU64,
}

const NONE: u64 = u64::MAX;

impl Beat {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last: AtomicU64::new(NONE),
        }
    }

    /// The call made progress now.
    pub fn now(&self) {
        self.last
            .store(self.start.elapsed().as_micros() as u64, Ordering::Relaxed);
    }

    /// How long since the last sign of progress (or since the call began), and whether there
    /// has been one.
    fn quiet(&self) -> (Duration, bool) {
        let elapsed = self.start.elapsed();
        match self.last.load(Ordering::Relaxed) {
            NONE => (elapsed, false),
            last => (elapsed.saturating_sub(Duration::from_micros(last)), true),
        }
    }
}

/// How long a call may go without a sign of progress.
#[derive(Debug, Clone, Copy)]
pub struct Quiet {
    /// From its start to its first sign.
    pub first: Duration,
    /// Between signs after that.
    pub then: Duration,
}

/// A call given up on: it went quiet for this long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stalled(pub Duration);

/// Runs `call` on a thread of its own and returns what it returns, or Stalled once it has gone
/// quiet for longer than `limits` allow. A call given up on is left blocked on its thread;
/// the caller fails, and the process with it. A panic in the call is resumed here, as if it
/// had run on the caller's thread.
pub fn unless_stalled<T: Send + 'static>(
    limits: Quiet,
    call: impl FnOnce(&Beat) -> T + Send + 'static,
) -> Result<Result<T, Stalled>> {
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
        let (quiet, began) = beat.quiet();
        let limit = if began { limits.then } else { limits.first };
        if quiet >= limit {
            // A result sent as the wait ran out still counts.
            return Ok(receiver.try_recv().map_err(|_| Stalled(limit)));
        }
        match receiver.recv_timeout(limit - quiet) {
            Ok(value) => return Ok(Ok(value)),
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
    const LIMITS: Quiet = Quiet {
        first: LIMIT,
        then: LIMIT,
    };

    #[test]
    fn a_call_that_keeps_making_progress_runs_past_the_limit() {
        let started = Instant::now();
        let got = unless_stalled(LIMITS, |beat| {
            for _ in 0..15 {
                std::thread::sleep(LIMIT / 10);
                beat.now();
            }
            7
        })
        .unwrap();
        assert_eq!(got, Ok(7));
        assert!(started.elapsed() > LIMIT);
    }

    #[test]
    fn a_quiet_call_is_given_up_on_and_its_caller_goes_on() {
        let (release, blocked) = mpsc::channel::<()>();
        let started = Instant::now();
        let got = unless_stalled(LIMITS, move |beat| {
            beat.now();
            let _ = blocked.recv();
        })
        .unwrap();
        assert_eq!(got, Err(Stalled(LIMIT)));
        assert!(started.elapsed() >= LIMIT);
        drop(release);
    }

    #[test]
    fn the_first_sign_of_progress_has_its_own_allowance() {
        let limits = Quiet {
            first: 3 * LIMIT,
            then: LIMIT,
        };
        let got = unless_stalled(limits, |beat| {
            std::thread::sleep(LIMIT + LIMIT / 2);
            beat.now();
            5
        })
        .unwrap();
        assert_eq!(got, Ok(5));
    }

    #[test]
    #[should_panic(expected = "the call's own panic")]
    fn a_panic_in_the_call_reaches_the_caller() {
        let _ = unless_stalled(LIMITS, |_| -> u8 { panic!("the call's own panic") });
    }
}
