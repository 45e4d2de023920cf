//! The HTTP API end to end: a real server on a loopback port over the bundled demo model and
//! its P-EAGLE drafter, driven with an HTTP client.

mod cancel;
mod chat;
mod common;
mod completion_prompts;
mod completions;
mod concurrency;
mod engine_metrics;
mod errors;
mod hardening;
mod harmony;
mod harmony_tools;
mod hermes;
mod mixed_workload;
mod openapi;
mod prefix_cache;
mod responses;
mod responses_background;
mod responses_logprobs;
mod responses_store;
mod shutdown;
mod structured;
mod tokenize;
