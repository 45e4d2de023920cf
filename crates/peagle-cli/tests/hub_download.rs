//! Models fetched from a hub: downloaded into an empty cache, served from the cache after,
//! resumed from a partial file, authenticated with a token, given up on when the hub stops
//! sending (but not while it sends slowly), and refused with a clear error offline or for an
//! unknown repository. The hub is a loopback stand-in, never the network.

mod common;

use common::fake_hub::{etag, FakeHub, Pace, COMMIT};
use hf_hub::Cache;
use peagle_cli::hub::{Hub, HubSettings, DEFAULT_STALL_LIMIT};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn hub(cache: &Path, endpoint: &str, token: Option<&str>, offline: bool) -> Hub {
    hub_with_limit(cache, endpoint, token, offline, DEFAULT_STALL_LIMIT)
}

fn hub_with_limit(cache: &Path, endpoint: &str, token: Option<&str>, offline: bool, stall_limit: Duration) -> Hub {
    Hub::new(HubSettings {
        cache: Cache::new(cache.to_path_buf()),
        endpoint: endpoint.to_string(),
        token: token.map(str::to_owned),
        offline,
        stall_limit,
    })
    .unwrap()
}

fn file_requests(server: &FakeHub, file: &str) -> Vec<String> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.starts_with(&format!("{file} ")))
        .collect()
}

#[test]
fn downloads_into_the_cache_once_and_then_serves_from_it() {
    let server = FakeHub::start(&[("acme/tiny", fixture("tiny-llama"))], None);
    let cache = tempfile::tempdir().unwrap();
    let dir = hub(cache.path(), &server.url, None, false)
        .snapshot("acme/tiny")
        .unwrap();
    assert_eq!(dir, cache.path().join(format!("models--acme--tiny/snapshots/{COMMIT}")));
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert_eq!(
            std::fs::read(dir.join(file)).unwrap(),
            std::fs::read(fixture("tiny-llama").join(file)).unwrap(),
            "{file}"
        );
    }
    assert!(!dir.join("original").exists(), "subdirectories are not fetched");
    let served = server.requests().len();

    // Everything is cached: online asks only for the repository info, offline asks nothing.
    assert_eq!(
        hub(cache.path(), &server.url, None, false)
            .snapshot("acme/tiny")
            .unwrap(),
        dir
    );
    assert_eq!(server.requests().len(), served);
    drop(server);
    assert_eq!(
        hub(cache.path(), "http://127.0.0.1:9", None, true)
            .snapshot("acme/tiny")
            .unwrap(),
        dir
    );
    // An unreachable hub falls back to the cached snapshot.
    assert_eq!(
        hub(cache.path(), "http://127.0.0.1:9", None, false)
            .snapshot("acme/tiny")
            .unwrap(),
        dir
    );
}

#[test]
fn a_partial_download_resumes_where_it_stopped() {
    let server = FakeHub::start(&[("acme/tiny", fixture("tiny-llama"))], None);
    let cache = tempfile::tempdir().unwrap();
    let weights = std::fs::read(fixture("tiny-llama").join("model.safetensors")).unwrap();
    let half = weights.len() / 2;
    let blobs = cache.path().join("models--acme--tiny/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(format!("{}.part", etag(&weights))), &weights[..half]).unwrap();

    let dir = hub(cache.path(), &server.url, None, false)
        .snapshot("acme/tiny")
        .unwrap();
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), weights);
    let requests = file_requests(&server, "model.safetensors");
    assert!(
        requests.contains(&format!("model.safetensors bytes={half}-")),
        "the download restarts at byte {half}: {requests:?}"
    );
}

#[test]
fn a_hub_that_stops_sending_is_given_up_on_with_a_clear_error() {
    let server = FakeHub::start_paced(&[("acme/tiny", fixture("tiny-llama"))], None, Pace::StopHalfway);
    let cache = tempfile::tempdir().unwrap();
    let (url, root) = (server.url.clone(), cache.path().to_path_buf());
    let started = Instant::now();
    // On a thread of its own, so that a regression fails here rather than hanging the suite.
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let hub = hub_with_limit(&root, &url, None, false, Duration::from_secs(1));
        let _ = sender.send(hub.snapshot("acme/tiny").map_err(|e| format!("{e:#}")));
    });
    let err = receiver
        .recv_timeout(Duration::from_secs(30))
        .expect("the stalled download was not given up on")
        .unwrap_err();
    assert!(
        err.contains("acme/tiny")
            && err.contains("nothing received for 1 s while downloading")
            && err.contains("HF_HUB_DOWNLOAD_TIMEOUT"),
        "{err}"
    );
    // One file's limit, not the default's ten seconds, nor forever.
    assert!(started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());
}

#[test]
fn a_download_slower_than_the_limit_completes_while_bytes_keep_coming() {
    // Each file in 12 pieces 100 ms apart: 1.2 s a file, longer than the 1 s limit, which
    // counts from the last piece received.
    let pace = Pace::Pieces(12, Duration::from_millis(100));
    let server = FakeHub::start_paced(&[("acme/tiny", fixture("tiny-llama"))], None, pace);
    let cache = tempfile::tempdir().unwrap();
    let dir = hub_with_limit(cache.path(), &server.url, None, false, Duration::from_secs(1))
        .snapshot("acme/tiny")
        .unwrap();
    assert_eq!(
        std::fs::read(dir.join("model.safetensors")).unwrap(),
        std::fs::read(fixture("tiny-llama").join("model.safetensors")).unwrap()
    );
}

#[test]
fn gated_repositories_need_the_token() {
    let server = FakeHub::start(&[("acme/gated", fixture("tiny-llama"))], Some("hf_secret"));
    let cache = tempfile::tempdir().unwrap();
    let err = format!(
        "{:#}",
        hub(cache.path(), &server.url, None, false)
            .snapshot("acme/gated")
            .unwrap_err()
    );
    assert!(err.contains("acme/gated") && err.contains("HF_TOKEN"), "{err}");
    let dir = hub(cache.path(), &server.url, Some("hf_secret"), false)
        .snapshot("acme/gated")
        .unwrap();
    assert!(dir.join("model.safetensors").is_file());
}

#[test]
fn missing_models_are_clear_errors() {
    let server = FakeHub::start(&[("acme/tiny", fixture("tiny-llama"))], None);
    let cache = tempfile::tempdir().unwrap();
    let err = format!(
        "{:#}",
        hub(cache.path(), &server.url, None, false)
            .snapshot("acme/nope")
            .unwrap_err()
    );
    assert!(err.contains("acme/nope") && err.contains("no such repository"), "{err}");
    let err = format!(
        "{:#}",
        hub(cache.path(), &server.url, None, true)
            .snapshot("acme/tiny")
            .unwrap_err()
    );
    assert!(
        err.contains("acme/tiny")
            && err.contains("not in the local Hugging Face cache")
            && err.contains("downloads are off"),
        "{err}"
    );
    assert!(server.requests().is_empty(), "offline never calls the hub");
}
