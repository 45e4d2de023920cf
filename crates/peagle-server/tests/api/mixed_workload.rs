//! Many clients at once, each asking for a random mix of what completions, chat and the
//! Responses API offer: greedy or seeded sampling with `n` choices, stop strings (kept or not),
//! logprobs with alternatives, penalties, `min_tokens`, a grammar, speculation off, streamed or
//! not. Under continuous batching with P-EAGLE's drafts accepted several at a time, every
//! response equals the same request's non-streamed response alone without speculation: each
//! choice's (or output item's) text, finish and stop reasons (or status), log-probabilities,
//! and the usage.

use crate::common::{Options, TestServer, MODEL};
use crate::responses::{events, items, rebuilt};
use futures_util::future::join_all;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const PROMPTS: [&str; 6] = [
    "def add(a, b):",
    "import os\n\n\ndef list_files(path):\n",
    "class Stack:\n    def __init__(self):\n",
    "# Sort the list in place\ndef sort(items):\n    for i in range(",
    "def parse_args():\n    parser = argparse.ArgumentParser(",
    "    return self._cache[key]\n\n    def",
];

/// One request: its path, its body (not streamed), and whether it is streamed under load.
struct Case {
    path: &'static str,
    body: Value,
    stream: bool,
}

fn cases(n: usize) -> Vec<Case> {
    // Seeded, so that a failure names a case that reruns.
    let mut c = StdRng::seed_from_u64(20261203);
    (0..n)
        .map(|_| {
            let chat = c.random_bool(0.4);
            let prompt = *PROMPTS.choose(&mut c).unwrap();
            let mut body = match chat {
                true => json!({"model": MODEL, "messages": [{"role": "user", "content": prompt}]}),
                false => json!({"model": MODEL, "prompt": prompt}),
            };
            let max_tokens = c.random_range(1..=48);
            body["max_tokens"] = json!(max_tokens);
            if c.random_bool(0.4) {
                body["temperature"] = json!(0);
            } else {
                body["temperature"] = json!(0.6 + c.random_range(0..7) as f64 / 10.0);
                body["seed"] = json!(c.random_range(0..1 << 30));
                body["n"] = json!(c.random_range(1..=3));
                body["top_p"] = json!(*[1.0, 0.9].choose(&mut c).unwrap());
                body["top_k"] = json!(*[-1, 20].choose(&mut c).unwrap());
                body["min_p"] = json!(*[0.0, 0.05].choose(&mut c).unwrap());
            }
            if c.random_bool(0.35) {
                let stops = [
                    json!("\n\n"),
                    json!("return"),
                    json!([")", ":\n"]),
                    json!(["self", "("]),
                ];
                body["stop"] = stops.choose(&mut c).unwrap().clone();
                body["include_stop_str_in_output"] = json!(c.random_bool(0.3));
            }
            if c.random_bool(0.4) {
                let top = c.random_range(0..4);
                match chat {
                    true => {
                        body["logprobs"] = json!(true);
                        body["top_logprobs"] = json!(top);
                    }
                    false => body["logprobs"] = json!(top),
                }
            }
            if c.random_bool(0.2) {
                body["presence_penalty"] = json!(c.random_range(0..5) as f64 / 2.0 - 1.0);
                body["frequency_penalty"] = json!(c.random_range(0..5) as f64 / 4.0);
                body["repetition_penalty"] = json!(*[1.0, 1.2].choose(&mut c).unwrap());
            }
            if c.random_bool(0.2) {
                body["min_tokens"] = json!(c.random_range(1..=max_tokens.min(6)));
            }
            if c.random_bool(0.3) {
                body["ignore_eos"] = json!(true);
            }
            if c.random_bool(0.2) {
                body["speculative"] = json!(false);
            }
            if c.random_bool(0.1) {
                match chat {
                    true => body["response_format"] = json!({"type": "json_object"}),
                    false => body["guided_regex"] = json!("[a-z_]+\\((self|x|y|, )*\\):"),
                }
            }
            let stream = c.random_bool(0.5);
            match (chat, c.random_bool(0.5)) {
                (true, true) => Case {
                    path: "/v1/responses",
                    body: as_response(body),
                    stream,
                },
                (true, false) => Case {
                    path: "/v1/chat/completions",
                    body,
                    stream,
                },
                (false, _) => Case {
                    path: "/v1/completions",
                    body,
                    stream,
                },
            }
        })
        .collect()
}

/// A chat request as the Responses API asks it: its message as `input`, its fields by
/// their names there (one answer: no `n`).
fn as_response(chat: Value) -> Value {
    let mut body = chat;
    let fields = body.as_object_mut().unwrap();
    let input = fields.remove("messages").unwrap()[0]["content"].clone();
    fields.insert("input".into(), input);
    let max = fields.remove("max_tokens").unwrap();
    fields.insert("max_output_tokens".into(), max);
    fields.remove("n");
    if fields.remove("logprobs").is_some() {
        fields.insert("include".into(), json!(["message.output_text.logprobs"]));
    }
    if let Some(format) = fields.remove("response_format") {
        fields.insert("text".into(), json!({ "format": format }));
    }
    body
}

/// What a response says of each choice, in index order, and its token counts: the same
/// whether it was streamed or not.
#[derive(Debug, Default, PartialEq)]
struct Outcome {
    choices: Vec<Choice>,
    prompt_tokens: Value,
    completion_tokens: Value,
}

#[derive(Debug, Default, Clone, PartialEq)]
struct Choice {
    text: String,
    finish_reason: Value,
    stop_reason: Value,
    /// Each token's entry: its token, log-probability and alternatives.
    logprobs: Vec<Value>,
}

/// A completion's log-probabilities as one entry a token (its offsets left out: a stream's
/// are its own).
fn completion_logprobs(logprobs: &Value) -> Vec<Value> {
    let Some(tokens) = logprobs["tokens"].as_array() else {
        return Vec::new();
    };
    (0..tokens.len())
        .map(|i| json!([tokens[i], logprobs["token_logprobs"][i], logprobs["top_logprobs"][i]]))
        .collect()
}

fn chat_logprobs(logprobs: &Value) -> Vec<Value> {
    logprobs["content"].as_array().cloned().unwrap_or_default()
}

/// The outcome of a Responses API response: its status (as a finish reason) and each output
/// item (its kind and text, a message's logprobs) as a choice.
fn response_outcome(response: &Value) -> Outcome {
    let status = Choice {
        finish_reason: response["status"].clone(),
        stop_reason: response["incomplete_details"].clone(),
        ..Default::default()
    };
    let output = items(response).into_iter().zip(response["output"].as_array().unwrap());
    let choices = output.map(|((kind, text), item)| Choice {
        text: format!("{kind}: {text}"),
        logprobs: item["content"][0]["logprobs"].as_array().cloned().unwrap_or_default(),
        ..Default::default()
    });
    Outcome {
        choices: std::iter::once(status).chain(choices).collect(),
        prompt_tokens: response["usage"]["input_tokens"].clone(),
        completion_tokens: response["usage"]["output_tokens"].clone(),
    }
}

/// The outcome of a non-streamed response.
fn whole(body: &Value) -> Outcome {
    if body["object"] == "response" {
        return response_outcome(body);
    }
    let chat = body["object"] == "chat.completion";
    let choices = body["choices"].as_array().unwrap();
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i, "{body}");
    }
    Outcome {
        choices: choices
            .iter()
            .map(|choice| Choice {
                text: match chat {
                    true => choice["message"]["content"].as_str().unwrap_or_default().into(),
                    false => choice["text"].as_str().unwrap().into(),
                },
                finish_reason: choice["finish_reason"].clone(),
                stop_reason: choice["stop_reason"].clone(),
                logprobs: match chat {
                    true => chat_logprobs(&choice["logprobs"]),
                    false => completion_logprobs(&choice["logprobs"]),
                },
            })
            .collect(),
        prompt_tokens: body["usage"]["prompt_tokens"].clone(),
        completion_tokens: body["usage"]["completion_tokens"].clone(),
    }
}

/// The outcome of a streamed response's chunks, each choice's pieces joined in order; its
/// usage from the last chunk.
fn joined(chunks: &[Value], n: usize) -> Outcome {
    let mut choices = vec![Choice::default(); n];
    for chunk in chunks {
        let chat = chunk["object"] == "chat.completion.chunk";
        for piece in chunk["choices"].as_array().unwrap() {
            let choice = &mut choices[piece["index"].as_u64().unwrap() as usize];
            let (text, logprobs) = match chat {
                true => (&piece["delta"]["content"], chat_logprobs(&piece["logprobs"])),
                false => (&piece["text"], completion_logprobs(&piece["logprobs"])),
            };
            choice.text.push_str(text.as_str().unwrap_or_default());
            choice.logprobs.extend(logprobs);
            if !piece["finish_reason"].is_null() {
                assert!(choice.finish_reason.is_null(), "a second finish: {chunk}");
                choice.finish_reason = piece["finish_reason"].clone();
                choice.stop_reason = piece["stop_reason"].clone();
            }
        }
    }
    let usage = &chunks.last().expect("chunks")["usage"];
    Outcome {
        choices,
        prompt_tokens: usage["prompt_tokens"].clone(),
        completion_tokens: usage["completion_tokens"].clone(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_load_gets_what_each_request_gets_alone() {
    let server = TestServer::with(Options {
        fixed_k: true,
        ..Default::default()
    })
    .await;
    let cases = cases(48);
    // Alone and without drafts: one token an engine step, so that the responses under load,
    // where accepted drafts commit several a step, are checked against the plain ones.
    let mut alone = Vec::new();
    for case in &cases {
        let mut body = case.body.clone();
        body["speculative"] = json!(false);
        alone.push(whole(&server.ok(case.path, body).await));
    }
    // The cases must reach what they are meant to test.
    let finishes: Vec<&Value> = alone
        .iter()
        .flat_map(|o| &o.choices)
        .map(|c| &c.finish_reason)
        .collect();
    assert!(finishes.contains(&&json!("stop")) && finishes.contains(&&json!("length")));
    assert!(alone.iter().flat_map(|o| &o.choices).any(|c| c.stop_reason.is_string()));
    assert!(alone.iter().flat_map(|o| &o.choices).any(|c| !c.logprobs.is_empty()));
    let chosen = |(case, outcome): (&Case, &Outcome)| case.path != "/v1/responses" && outcome.choices.len() > 1;
    assert!(cases.iter().zip(&alone).any(chosen), "no request had n > 1");
    assert!(cases.iter().any(|c| c.path == "/v1/responses"));

    let accepted_before = server.metric("peagle:spec_decode_num_accepted_tokens_total").await;
    let together = join_all(cases.iter().map(|case| {
        let server = &server;
        async move {
            let n = case.body["n"].as_u64().unwrap_or(1) as usize;
            match case.stream {
                true if case.path == "/v1/responses" => {
                    let mut body = case.body.clone();
                    body["stream"] = json!(true);
                    let events = events(server, body).await;
                    let last = events.iter().rev().find(|e| e.get("response").is_some()).unwrap();
                    assert_eq!(rebuilt(&events), items(&last["response"]), "{}", case.body);
                    response_outcome(&last["response"])
                }
                true => {
                    let mut body = case.body.clone();
                    body["stream"] = json!(true);
                    body["stream_options"] = json!({"include_usage": true});
                    joined(&server.stream(case.path, body).await, n)
                }
                false => whole(&server.ok(case.path, case.body.clone()).await),
            }
        }
    }))
    .await;
    for (i, (got, want)) in together.iter().zip(&alone).enumerate() {
        assert_eq!(
            got, want,
            "request {i} (streamed: {}): {}",
            cases[i].stream, cases[i].body
        );
    }
    let accepted = server.metric("peagle:spec_decode_num_accepted_tokens_total").await - accepted_before;
    assert!(accepted > 0.0, "no draft was accepted under load");
}
