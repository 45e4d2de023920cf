//! A `peagle-serve` child process for one sweep mode: started on a free loopback port, killed
//! when dropped.

use crate::BenchError;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// Lines of the server's log kept to explain a failed start.
const LOG_LINES: usize = 5;

pub struct ServerProcess {
    child: Child,
    pub url: String,
}

impl ServerProcess {
    /// Starts `bin args --host 127.0.0.1 --port 0` and waits up to `timeout` for the line
    /// announcing where it listens. `what` names the server in errors.
    pub fn start(bin: &Path, args: &[String], what: &str, timeout: Duration) -> Result<Self, BenchError> {
        let fail = |reason: String| BenchError::Server {
            what: what.to_string(),
            reason,
        };
        let mut child = Command::new(bin)
            .args(args)
            .args(["--host", "127.0.0.1", "--port", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| fail(format!("cannot run {}: {e}", bin.display())))?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (found, listening) = mpsc::channel();
        let kept = Arc::clone(&log);
        // Reads the log to its end, so a chatty server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.split("listening on ").nth(1) {
                    let _ = found.send(url.trim().to_string());
                }
                let mut kept = kept.lock().expect("log lock");
                if kept.len() == LOG_LINES {
                    kept.pop_front();
                }
                kept.push_back(line);
            }
        });
        match listening.recv_timeout(timeout) {
            Ok(url) => Ok(Self { child, url }),
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
                let log = log.lock().expect("log lock");
                let last: Vec<&str> = log
                    .iter()
                    .map(String::as_str)
                    .filter(|l| !l.trim().is_empty())
                    .collect();
                Err(fail(format!(
                    "the server did not start within {} s ({status}); its last log lines: {}",
                    timeout.as_secs(),
                    last.join(" | ")
                )))
            }
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
