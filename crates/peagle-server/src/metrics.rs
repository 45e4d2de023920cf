//! `/metrics` in the Prometheus text format, with vLLM's metric names under the `peagle:`
//! prefix so vLLM dashboards carry over. Engine counters come from the engine's snapshot;
//! latencies and finish reasons are measured here, where the client's view of a request is.

use crate::histogram::Histogram;
use peagle_engine::{EngineMetrics, FinishReason};
use std::fmt::{Display, Write};
use std::sync::Mutex;

// vLLM's buckets, so percentiles computed from either server compare.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];

pub struct ServerMetrics {
    recorded: Mutex<Recorded>,
}

#[derive(Clone)]
struct Recorded {
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    /// Arrival to first scheduled, first scheduled to first token, first token to end, first
    /// scheduled to end.
    queue: Histogram,
    prefill: Histogram,
    decode: Histogram,
    inference: Histogram,
    /// Per choice: time per output token after the first.
    tpot: Histogram,
    prompt_tokens: Histogram,
    generation_tokens: Histogram,
    /// Choices finished, by reason (indexed as `FinishReason::NAMES`).
    finished: [u64; 3],
}

/// A choice at its end, as the latency and length histograms see it.
#[derive(Debug, Clone, Copy)]
pub struct ChoiceEnd {
    pub reason: FinishReason,
    /// Arrival to end.
    pub seconds: f64,
    /// First scheduled to end, and to the first token; None before those.
    pub inference_seconds: Option<f64>,
    pub prefill_seconds: Option<f64>,
    /// First token to end; None before a first token.
    pub decode_seconds: Option<f64>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

impl ServerMetrics {
    /// Token-count histograms reach `max_model_len`.
    pub fn new(max_model_len: usize) -> Self {
        Self {
            recorded: Mutex::new(Recorded {
                ttft: Histogram::new(TTFT_BUCKETS),
                itl: Histogram::new(ITL_BUCKETS),
                e2e: Histogram::new(REQUEST_LATENCY_BUCKETS),
                queue: Histogram::new(REQUEST_LATENCY_BUCKETS),
                prefill: Histogram::new(REQUEST_LATENCY_BUCKETS),
                decode: Histogram::new(REQUEST_LATENCY_BUCKETS),
                inference: Histogram::new(REQUEST_LATENCY_BUCKETS),
                tpot: Histogram::new(ITL_BUCKETS),
                prompt_tokens: Histogram::one_two_five(max_model_len),
                generation_tokens: Histogram::one_two_five(max_model_len),
                finished: [0; 3],
            }),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Recorded) -> R) -> R {
        // A panic elsewhere cannot leave a histogram half-updated; keep serving metrics.
        let mut guard = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    /// Time from the request's arrival to its first token.
    pub fn first_token(&self, seconds: f64) {
        self.with(|r| r.ttft.observe(seconds));
    }

    /// Time from the request's arrival to its first engine step.
    pub fn queued(&self, seconds: f64) {
        self.with(|r| r.queue.observe(seconds));
    }

    /// Time between two token events of a request (one engine step, which may commit several
    /// tokens with speculation, as vLLM counts it).
    pub fn next_token(&self, seconds: f64) {
        self.with(|r| r.itl.observe(seconds));
    }

    pub fn finished(&self, end: ChoiceEnd) {
        self.with(|r| {
            r.e2e.observe(end.seconds);
            let phases = [
                (&mut r.inference, end.inference_seconds),
                (&mut r.prefill, end.prefill_seconds),
                (&mut r.decode, end.decode_seconds),
            ];
            for (histogram, seconds) in phases {
                if let Some(seconds) = seconds {
                    histogram.observe(seconds);
                }
            }
            r.prompt_tokens.observe(end.prompt_tokens as f64);
            r.generation_tokens.observe(end.completion_tokens as f64);
            if let Some(decode) = end.decode_seconds.filter(|_| end.completion_tokens > 1) {
                r.tpot.observe(decode / (end.completion_tokens - 1) as f64);
            }
            r.finished[end.reason.index()] += 1;
        });
    }

    pub fn render(&self, engine: &EngineMetrics, model_name: &str) -> String {
        let mut x = Exposition::new(model_name);
        x.gauge(
            "num_requests_running",
            "Requests in model execution batches.",
            engine.running,
        );
        x.gauge(
            "num_requests_waiting",
            "Requests waiting to be scheduled.",
            engine.waiting,
        );
        let usage = engine.kv_blocks_used as f64 / engine.kv_blocks_total.max(1) as f64;
        x.gauge("kv_cache_usage_perc", "KV cache usage: 1 means 100 percent.", usage);
        x.gauge("kv_blocks_used", "KV cache blocks in use.", engine.kv_blocks_used);
        x.gauge("num_kv_blocks", "KV cache blocks in all.", engine.kv_blocks_total);
        x.counter(
            "prompt_tokens_total",
            "Prefill tokens processed.",
            engine.prompt_tokens_total,
        );
        x.counter(
            "generation_tokens_total",
            "Generation tokens processed.",
            engine.generation_tokens_total,
        );
        x.counter(
            "prefix_cache_queries_total",
            "Prompt tokens of scheduled requests looked up in the prefix cache.",
            engine.prefix_cache_queries,
        );
        x.counter(
            "prefix_cache_hits_total",
            "Prompt tokens found in the prefix cache.",
            engine.prefix_cache_hits,
        );
        let hit_rate = engine.prefix_cache_hits as f64 / engine.prefix_cache_queries.max(1) as f64;
        x.gauge(
            "prefix_cache_hit_rate",
            "Share of looked-up prompt tokens found in the prefix cache.",
            hit_rate,
        );
        x.gauge(
            "kv_blocks_cached",
            "Free KV cache blocks that still hold a cached prefix.",
            engine.kv_blocks_cached_free,
        );
        x.counter(
            "num_preemptions_total",
            "Sequences preempted (to be recomputed).",
            engine.preemptions_total,
        );
        let r = self.with(|r| r.clone());
        x.header(
            "request_success_total",
            "counter",
            "Finished requests (each choice of n counts), by finish reason.",
        );
        for (name, count) in FinishReason::NAMES.iter().zip(r.finished) {
            x.sample("request_success_total", &format!("finished_reason=\"{name}\""), count);
        }
        x.histogram("time_to_first_token_seconds", "Time to first token.", &r.ttft);
        x.histogram("inter_token_latency_seconds", "Time between token events.", &r.itl);
        x.histogram(
            "time_per_output_token_seconds",
            "Per choice: time per output token after the first.",
            &r.tpot,
        );
        x.histogram(
            "e2e_request_latency_seconds",
            "Request latency, arrival to end.",
            &r.e2e,
        );
        x.histogram(
            "request_queue_time_seconds",
            "Time waiting for the first engine step.",
            &r.queue,
        );
        x.histogram(
            "request_prefill_time_seconds",
            "First engine step to first token.",
            &r.prefill,
        );
        x.histogram("request_decode_time_seconds", "First token to the end.", &r.decode);
        x.histogram(
            "request_inference_time_seconds",
            "First engine step to the end.",
            &r.inference,
        );
        x.histogram("request_prompt_tokens", "Prompt tokens per choice.", &r.prompt_tokens);
        x.histogram(
            "request_generation_tokens",
            "Generated tokens per choice.",
            &r.generation_tokens,
        );
        let times = &engine.step_times;
        x.counter("engine_steps_total", "Engine steps run.", times.steps);
        x.header(
            "engine_step_seconds_total",
            "counter",
            "Engine step time by phase: target forward, drafter, verification and sampling, the rest.",
        );
        for (phase, seconds) in [
            ("target", times.target_seconds),
            ("drafter", times.drafter_seconds),
            ("verify", times.verify_seconds),
            ("other", times.other_seconds),
        ] {
            x.sample("engine_step_seconds_total", &format!("phase=\"{phase}\""), seconds);
        }
        x.gauge(
            "spec_decode_k_in_use",
            "Drafts per step in use now (0: speculation off or suspended under load).",
            engine.k_in_use,
        );
        let spec = &engine.spec;
        x.counter(
            "spec_decode_num_drafts_total",
            "Verifications of drafted tokens (one per sequence per step).",
            spec.num_drafts,
        );
        x.counter(
            "spec_decode_num_draft_tokens_total",
            "Drafted tokens.",
            spec.num_draft_tokens,
        );
        x.counter(
            "spec_decode_num_accepted_tokens_total",
            "Accepted draft tokens.",
            spec.num_accepted_tokens,
        );
        x.header(
            "spec_decode_num_accepted_tokens_per_pos_total",
            "counter",
            "Drafts whose token at this position was accepted.",
        );
        for (position, accepted) in spec.accepted_per_position.iter().enumerate() {
            x.sample(
                "spec_decode_num_accepted_tokens_per_pos_total",
                &format!("position=\"{position}\""),
                accepted,
            );
        }
        x.out
    }
}

/// Writes metric families with the `peagle:` prefix and a `model_name` label on every sample.
struct Exposition {
    out: String,
    labels: String,
}

impl Exposition {
    fn new(model_name: &str) -> Self {
        let escaped = model_name
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        Self {
            out: String::new(),
            labels: format!("model_name=\"{escaped}\""),
        }
    }

    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP peagle:{name} {help}\n# TYPE peagle:{name} {kind}");
    }

    fn sample(&mut self, name: &str, extra_labels: &str, value: impl Display) {
        let sep = if extra_labels.is_empty() { "" } else { "," };
        let _ = writeln!(self.out, "peagle:{name}{{{}{sep}{extra_labels}}} {value}", self.labels);
    }

    fn gauge(&mut self, name: &str, help: &str, value: impl Display) {
        self.header(name, "gauge", help);
        self.sample(name, "", value);
    }

    fn counter(&mut self, name: &str, help: &str, value: impl Display) {
        self.header(name, "counter", help);
        self.sample(name, "", value);
    }

    fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.header(name, "histogram", help);
        h.write_samples(&mut self.out, &format!("peagle:{name}"), &self.labels);
    }
}
