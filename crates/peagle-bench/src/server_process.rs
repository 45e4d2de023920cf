//! A `peagle-serve` child process for one sweep mode: started on a free loopback port, killed
//! when dropped.

use crate::BenchError;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, LineWriter, Write};
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
    /// announcing where it listens. `what` names the server in errors. With `log`, every line
    /// the server logs is written there as it comes, so that a run killed part-way still shows
    /// what its server was doing.
    pub fn start(
        bin: &Path,
        args: &[String],
        what: &str,
        timeout: Duration,
        log: Option<&Path>,
    ) -> Result<Self, BenchError> {
        let fail = |reason: String| BenchError::Server {
            what: what.to_string(),
            reason,
        };
        let mut log_file = match log {
            Some(path) => Some(
                path.parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| File::create(path))
                    .map(LineWriter::new)
                    .map_err(|e| fail(format!("cannot write its log to {}: {e}", path.display())))?,
            ),
            None => None,
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
                if let Some(file) = &mut log_file {
                    // A log that cannot be written is lost; the run goes on.
                    let _ = writeln!(file, "{line}");
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line the server logs reaches the log file, before and after it listens, and a
    /// server that never listens fails with its last lines.
    #[test]
    fn the_server_log_is_written_as_it_comes() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("run").join("server.log");
        let start = |script: &str, seconds| {
            ServerProcess::start(
                Path::new("/bin/sh"),
                &["-c".to_string(), script.to_string()],
                "test",
                Duration::from_secs(seconds),
                Some(&log),
            )
        };
        let server = start(
            "echo loading >&2; echo 'listening on http://127.0.0.1:9' >&2; echo serving >&2; sleep 30",
            10,
        )
        .unwrap();
        assert_eq!(server.url, "http://127.0.0.1:9");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&log).unwrap().contains("serving") {
            assert!(
                std::time::Instant::now() < deadline,
                "the log never got the line after listening"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let written = std::fs::read_to_string(&log).unwrap();
        assert_eq!(written, "loading\nlistening on http://127.0.0.1:9\nserving\n");
        drop(server);

        let err = start("echo 'no GPU here' >&2; exit 3", 1).err().unwrap();
        assert!(err.to_string().contains("no GPU here"), "{err}");
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "no GPU here\n");
    }
}
