//! /v1/completions: plain and streamed, n, stop strings, logprobs, seeds, echo, token prompts,
//! penalties and token constraints.

use crate::common::{greedy, streamed, texts, token_id, Options, TestServer, MAX_MODEL_LEN, MODEL};
use peagle_engine::GenerationDefaults;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_with_text_usage_and_finish_reason() {
    let server = TestServer::start().await;
    let body = server.ok("/v1/completions", greedy("def f(x):", 12)).await;
    assert!(body["id"].as_str().unwrap().starts_with("cmpl-"), "{body}");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], MODEL);
    let choice = &body["choices"][0];
    assert_eq!(
        (choice["index"].as_u64(), choice["finish_reason"].as_str()),
        (Some(0), Some("length"))
    );
    assert!(!choice["text"].as_str().unwrap().is_empty(), "{body}");
    assert_eq!(choice["logprobs"], serde_json::Value::Null);
    let usage = &body["usage"];
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 0);
    assert_eq!(usage["completion_tokens"], 12);
    assert_eq!(usage["total_tokens"].as_u64(), Some(prompt_tokens + 12));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_sends_the_same_text_then_usage_and_done() {
    let server = TestServer::start().await;
    let plain = server.ok("/v1/completions", greedy("import os", 20)).await;
    let mut request = greedy("import os", 20);
    request["stream"] = json!(true);
    request["stream_options"] = json!({"include_usage": true});
    let chunks = server.stream("/v1/completions", request).await;
    assert!(chunks.len() > 2, "{chunks:?}");
    for chunk in &chunks {
        assert_eq!(chunk["object"], "text_completion");
        assert_eq!(chunk["id"], chunks[0]["id"]);
    }
    let (text, finish) = streamed(&chunks, 0, "text");
    assert_eq!(text, texts(&plain)[0]);
    assert_eq!(finish.as_deref(), Some("length"));
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"], plain["usage"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_seeded_choices_differ_and_repeat() {
    let server = TestServer::start().await;
    let request = json!({
        "prompt": "class Node:",
        "max_tokens": 16,
        "n": 4,
        "seed": 5,
        "temperature": 1.0,
        "ignore_eos": true,
    });
    let first = server.ok("/v1/completions", request.clone()).await;
    let second = server.ok("/v1/completions", request.clone()).await;
    let choices = texts(&first);
    assert_eq!(choices.len(), 4);
    assert_eq!(choices, texts(&second));
    let indices: Vec<_> = first["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].clone())
        .collect();
    assert_eq!(indices, vec![json!(0), json!(1), json!(2), json!(3)]);
    let distinct: std::collections::HashSet<_> = choices.iter().collect();
    assert!(distinct.len() > 1, "all four seeded choices are equal: {choices:?}");
    assert_eq!(first["usage"]["completion_tokens"], 64);

    // Streamed, the same seeds give the same four texts.
    let mut streaming = request;
    streaming["stream"] = json!(true);
    let chunks = server.stream("/v1/completions", streaming).await;
    for (i, text) in choices.iter().enumerate() {
        assert_eq!(&streamed(&chunks, i as u64, "text").0, text);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_sampling_repeats_and_seeds_matter() {
    let server = TestServer::start().await;
    let request = |seed: i64| {
        json!({"prompt": "for i in", "max_tokens": 24, "temperature": 0.8, "top_p": 0.9, "top_k": 50,
               "seed": seed, "ignore_eos": true})
    };
    let a = texts(&server.ok("/v1/completions", request(11)).await);
    let b = texts(&server.ok("/v1/completions", request(11)).await);
    let c = texts(&server.ok("/v1/completions", request(12)).await);
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Any 64-bit integer is a seed, negative ones too (vLLM's range).
    let negative = texts(&server.ok("/v1/completions", request(-7)).await);
    assert_eq!(negative, texts(&server.ok("/v1/completions", request(-7)).await));
    assert_ne!(negative, a);
}

/// The end-of-sequence token is generated like any other: counted in usage and given a
/// log-probability, as vLLM does, though its text is not part of the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_of_sequence_token_counts_but_adds_no_text() {
    let server = TestServer::start().await;
    // The demo model ends this prompt at once.
    let mut request = greedy("if __name__ == '__main__':\n    main()\n", 5);
    request["ignore_eos"] = json!(false);
    request["logprobs"] = json!(1);
    let body = server.ok("/v1/completions", request.clone()).await;
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{body}");
    assert_eq!(choice["stop_reason"], Value::Null);
    assert_eq!(choice["text"], "");
    assert_eq!(choice["logprobs"]["tokens"], json!(["<|endoftext|>"]));
    assert!(choice["logprobs"]["token_logprobs"][0].as_f64().unwrap() < 0.0);
    assert_eq!(body["usage"]["completion_tokens"], 1);

    // skip_special_tokens false shows special tokens' text, here an ignored end-of-sequence.
    request["ignore_eos"] = json!(true);
    request["skip_special_tokens"] = json!(false);
    let shown = texts(&server.ok("/v1/completions", request.clone()).await).remove(0);
    assert!(shown.starts_with("<|endoftext|>") && shown.len() > 13, "{shown:?}");
    request["skip_special_tokens"] = json!(true);
    let hidden = texts(&server.ok("/v1/completions", request).await).remove(0);
    assert_eq!(hidden, shown["<|endoftext|>".len()..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_string_cuts_the_text_and_ends_the_choice() {
    let server = TestServer::start().await;
    let full = texts(&server.ok("/v1/completions", greedy("while True:", 40)).await).remove(0);
    // A stop string from the middle of the greedy text: the answer is what comes before it.
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 8, "{full:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let expected = &full[..full.find(&stop).unwrap()];

    let mut request = greedy("while True:", 40);
    request["stop"] = json!(["never appears \u{1}", stop]);
    let body = server.ok("/v1/completions", request.clone()).await;
    let choice = &body["choices"][0];
    assert_eq!(choice["text"], expected);
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["stop_reason"], json!(stop));
    assert!(body["usage"]["completion_tokens"].as_u64().unwrap() < 40, "{body}");

    request["stream"] = json!(true);
    let chunks = server.stream("/v1/completions", request.clone()).await;
    assert_eq!(
        streamed(&chunks, 0, "text"),
        (expected.to_string(), Some("stop".into()))
    );

    // include_stop_str_in_output keeps the stop string, streamed or not.
    request["include_stop_str_in_output"] = json!(true);
    request["stream"] = json!(false);
    let kept = &full[..full.find(&stop).unwrap() + stop.len()];
    assert_eq!(texts(&server.ok("/v1/completions", request.clone()).await), vec![kept]);
    request["stream"] = json!(true);
    let chunks = server.stream("/v1/completions", request.clone()).await;
    assert_eq!(streamed(&chunks, 0, "text"), (kept.to_string(), Some("stop".into())));
    request["include_stop_str_in_output"] = json!(false);

    // Stop strings are looked for only after min_tokens tokens, as in vLLM.
    request["min_tokens"] = json!(40);
    request["stream"] = json!(false);
    let body = server.ok("/v1/completions", request).await;
    assert_eq!(body["choices"][0]["text"], full);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_come_with_top_alternatives_and_offsets() {
    let server = TestServer::start().await;
    let mut request = greedy("def g(", 6);
    request["logprobs"] = json!(2);
    let body = server.ok("/v1/completions", request.clone()).await;
    let logprobs = &body["choices"][0]["logprobs"];
    let tokens = logprobs["tokens"].as_array().unwrap();
    let token_logprobs = logprobs["token_logprobs"].as_array().unwrap();
    let top = logprobs["top_logprobs"].as_array().unwrap();
    let offsets = logprobs["text_offset"].as_array().unwrap();
    assert_eq!(
        (tokens.len(), token_logprobs.len(), top.len(), offsets.len()),
        (6, 6, 6, 6)
    );
    assert_eq!(offsets[0], 0);
    for i in 0..6 {
        let chosen = token_logprobs[i].as_f64().unwrap();
        assert!(chosen <= 0.0, "{logprobs}");
        let alternatives = top[i].as_object().unwrap();
        assert!((1..=3).contains(&alternatives.len()), "{logprobs}");
        // Greedy picks the most likely token: nothing beats it.
        let best = alternatives
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!((best - chosen).abs() < 1e-4, "{logprobs}");
        assert_eq!(alternatives[tokens[i].as_str().unwrap()].as_f64(), Some(chosen));
        if i > 0 {
            assert!(offsets[i].as_u64() >= offsets[i - 1].as_u64());
        }
    }

    // vLLM's return_tokens_as_token_ids: the same entries, each token named by its id.
    request["return_tokens_as_token_ids"] = json!(true);
    let by_id = server.ok("/v1/completions", request).await;
    assert_eq!(by_id["choices"][0]["text"], body["choices"][0]["text"]);
    let by_id = &by_id["choices"][0]["logprobs"];
    let names: Vec<String> = tokens
        .iter()
        .map(|t| format!("token_id:{}", token_id(t.as_str().unwrap())))
        .collect();
    assert_eq!(by_id["tokens"], json!(names));
    assert_eq!(by_id["token_logprobs"], logprobs["token_logprobs"]);
    assert_eq!(by_id["text_offset"], logprobs["text_offset"]);
    for (i, name) in names.iter().enumerate() {
        let alternatives = by_id["top_logprobs"][i].as_object().unwrap();
        assert!(
            alternatives.keys().all(|k| k.starts_with("token_id:")),
            "{alternatives:?}"
        );
        assert_eq!(alternatives[name], token_logprobs[i]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_and_token_id_prompts() {
    let server = TestServer::start().await;
    let plain = texts(&server.ok("/v1/completions", greedy("x = [", 8)).await).remove(0);
    let mut request = greedy("x = [", 8);
    request["echo"] = json!(true);
    let echoed = texts(&server.ok("/v1/completions", request).await).remove(0);
    assert_eq!(echoed, format!("x = [{plain}"));

    // The same prompt as token ids, twice in one request: two choices, prompts counted twice.
    let tokenizer = crate::common::tokenizer();
    let ids = tokenizer.encode("x = [", true).unwrap().get_ids().to_vec();
    let mut request = greedy("", 8);
    request["prompt"] = json!([ids, ids]);
    let body = server.ok("/v1/completions", request).await;
    assert_eq!(texts(&body), vec![plain.clone(), plain]);
    assert_eq!(body["usage"]["prompt_tokens"].as_u64(), Some(2 * ids.len() as u64));
}

/// `add_special_tokens: false` leaves the tokenizer's BOS off a text prompt: the same
/// completion as the prompt's ids without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_special_tokens_false_leaves_the_bos_off_a_text_prompt() {
    let server = TestServer::start().await;
    let tokenizer = crate::common::tokenizer();
    let bare = tokenizer.encode("x = [", false).unwrap().get_ids().to_vec();
    let with_bos = tokenizer.encode("x = [", true).unwrap().get_ids().to_vec();
    assert_eq!(with_bos.len(), bare.len() + 1, "the demo tokenizer adds a BOS");
    let mut by_text = greedy("x = [", 8);
    by_text["add_special_tokens"] = json!(false);
    let mut by_ids = greedy("", 8);
    by_ids["prompt"] = json!(bare);
    let (text, ids) = (
        server.ok("/v1/completions", by_text).await,
        server.ok("/v1/completions", by_ids).await,
    );
    assert_eq!(text["usage"]["prompt_tokens"], bare.len());
    assert_eq!(texts(&text), texts(&ids));
}

/// `truncate_prompt_tokens` keeps a prompt's last tokens, as vLLM does: the completion of
/// those tokens alone, even for a prompt longer than the context; chats alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_prompt_tokens_keeps_the_last_tokens() {
    let server = TestServer::start().await;
    let tokenizer = crate::common::tokenizer();
    let prompt = "import os\nimport sys\n\ndef main(argv):\n    return";
    let ids = tokenizer.encode(prompt, true).unwrap().get_ids().to_vec();
    let last = ids[ids.len() - 6..].to_vec();
    let mut cut = greedy(prompt, 6);
    cut["truncate_prompt_tokens"] = json!(6);
    cut["echo"] = json!(true);
    let mut alone = greedy("", 6);
    alone["prompt"] = json!(last);
    alone["echo"] = json!(true);
    let (cut, alone) = (
        server.ok("/v1/completions", cut).await,
        server.ok("/v1/completions", alone).await,
    );
    assert_eq!(cut["usage"]["prompt_tokens"], 6);
    assert_eq!(texts(&cut), texts(&alone));

    let long = "x = 1\n".repeat(MAX_MODEL_LEN);
    let mut request = greedy(&long, 2);
    let (status, _) = server.call("/v1/completions", request.clone()).await;
    assert_eq!(status, reqwest::StatusCode::BAD_REQUEST, "too long without truncation");
    request["truncate_prompt_tokens"] = json!(10);
    let body = server.ok("/v1/completions", request).await;
    assert_eq!(body["usage"]["prompt_tokens"], 10);

    let chat = json!({"messages": [{"role": "user", "content": long}], "max_tokens": 2, "truncate_prompt_tokens": 12});
    let body = server.ok("/v1/chat/completions", chat).await;
    assert_eq!(body["usage"]["prompt_tokens"], 12);

    for (bad, why) in [
        (json!(0), "zero"),
        (json!(-2), "below -1"),
        (json!(MAX_MODEL_LEN + 1), "past the context"),
    ] {
        let mut request = greedy(prompt, 2);
        request["truncate_prompt_tokens"] = bad;
        let (status, error) = server.call("/v1/completions", request).await;
        assert_eq!(status, reqwest::StatusCode::BAD_REQUEST, "{why}");
        assert_eq!(error["error"]["param"], "truncate_prompt_tokens", "{why}");
    }
}

/// Echo with `max_tokens: 0` scores the prompt, as OpenAI's legacy API and vLLM do: the prompt
/// and its logprobs, nothing generated, streamed or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_with_no_tokens_scores_the_prompt_alone() {
    let server = TestServer::start().await;
    let prompt = "def area(radius):";
    let mut full = greedy(prompt, 3);
    full["echo"] = json!(true);
    full["logprobs"] = json!(1);
    let full = server.ok("/v1/completions", full).await;
    let mut scoring = greedy(prompt, 0);
    scoring["echo"] = json!(true);
    scoring["logprobs"] = json!(1);
    let body = server.ok("/v1/completions", scoring.clone()).await;
    let choice = &body["choices"][0];
    assert_eq!(choice["text"], prompt);
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(body["usage"]["completion_tokens"], 0);
    let prompt_len = body["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    let tokens = choice["logprobs"]["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), prompt_len);
    assert_eq!(
        tokens[..],
        full["choices"][0]["logprobs"]["tokens"].as_array().unwrap()[..prompt_len]
    );

    scoring["stream"] = json!(true);
    scoring["stream_options"] = json!({"include_usage": true});
    let chunks = server.stream("/v1/completions", scoring).await;
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(streamed, prompt);
    let entries: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["tokens"].as_array())
        .flatten()
        .collect();
    assert_eq!(entries.len(), prompt_len);
    let last = chunks.last().unwrap();
    assert_eq!(last["usage"]["completion_tokens"], 0, "{last}");

    let mut unscored = greedy(prompt, 0);
    unscored["logprobs"] = json!(1);
    let (status, _) = server.call("/v1/completions", unscored).await;
    assert_eq!(status, reqwest::StatusCode::BAD_REQUEST, "no tokens without echo");
}

/// Echo with logprobs scores the prompt: one entry per prompt token (the first, BOS, has
/// none and adds no text), then the completion's, with offsets into the echoed text. Each prompt row is the
/// model's distribution there: the alternatives at the last prompt token include what a
/// request for the prompt without it generates next, with the same log-probability.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_with_logprobs_scores_the_prompt() {
    let server = TestServer::start().await;
    let prompt = "def area(radius):";
    let tokenizer = crate::common::tokenizer();
    let ids = tokenizer.encode(prompt, true).unwrap().get_ids().to_vec();
    let mut request = greedy(prompt, 4);
    request["echo"] = json!(true);
    request["logprobs"] = json!(2);
    let body = server.ok("/v1/completions", request.clone()).await;
    let choice = &body["choices"][0];
    let logprobs = &choice["logprobs"];
    let tokens: Vec<&str> = logprobs["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let token_logprobs = logprobs["token_logprobs"].as_array().unwrap();
    let offsets = logprobs["text_offset"].as_array().unwrap();
    assert_eq!(tokens.len(), ids.len() + 4, "{logprobs}");
    assert_eq!(token_logprobs[0], Value::Null);
    assert!(
        token_logprobs[1..].iter().all(|l| l.as_f64().is_some_and(|l| l <= 0.0)),
        "{logprobs}"
    );
    let text = choice["text"].as_str().unwrap();
    assert!(text.starts_with(prompt), "{text}");
    assert_eq!(tokens[0], "<|endoftext|>");
    assert_eq!(tokens[1..].concat(), text);
    assert_eq!(offsets[0], 0);
    for (i, offset) in offsets.iter().enumerate().skip(1) {
        assert_eq!(offset.as_u64(), Some(tokens[1..i].concat().chars().count() as u64));
    }

    let mut shorter = greedy("", 1);
    shorter["prompt"] = json!(ids[..ids.len() - 1]);
    shorter["logprobs"] = json!(1);
    let next = server.ok("/v1/completions", shorter).await;
    let next = &next["choices"][0]["logprobs"];
    let (token, logprob) = (
        next["tokens"][0].as_str().unwrap(),
        next["token_logprobs"][0].as_f64().unwrap(),
    );
    let alternatives = &logprobs["top_logprobs"][ids.len() - 1];
    let scored = alternatives[token]
        .as_f64()
        .unwrap_or_else(|| panic!("{token:?} not in {alternatives}"));
    assert!((scored - logprob).abs() < 1e-4, "{scored} vs {logprob}");

    // Streamed: the same entries, in order, across the chunks.
    request["stream"] = json!(true);
    let chunks = server.stream("/v1/completions", request).await;
    let streamed: Vec<String> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["tokens"].as_array())
        .flatten()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, tokens);
    // The prompt's text comes with its logprobs in the first chunk, as vLLM sends it, and the
    // first token's alternatives are null there too.
    let first = &chunks[0]["choices"][0];
    assert_eq!(first["text"], prompt);
    assert_eq!(first["logprobs"]["tokens"].as_array().unwrap().len(), ids.len());
    assert_eq!(first["logprobs"]["top_logprobs"][0], Value::Null);
    assert_eq!(logprobs["top_logprobs"][0], Value::Null);
}

/// vLLM's `prompt_logprobs`: each prompt token but the first (null) with its log-probability
/// and rank, then its most likely alternatives ranked from 1, by token id: the echoed
/// logprobs' values, whatever count of alternatives each field asks for. Not in a stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_logprobs_score_the_prompt_with_ranks() {
    let server = TestServer::start().await;
    let prompt = "def area(radius):";
    let tokenizer = crate::common::tokenizer();
    let ids = tokenizer.encode(prompt, true).unwrap().get_ids().to_vec();
    let mut request = greedy(prompt, 4);
    request["prompt_logprobs"] = json!(3);
    request["echo"] = json!(true);
    request["logprobs"] = json!(1);
    let body = server.ok("/v1/completions", request.clone()).await;
    let choice = &body["choices"][0];
    let positions = choice["prompt_logprobs"].as_array().unwrap();
    assert_eq!(positions.len(), ids.len(), "{body}");
    assert_eq!(positions[0], Value::Null);
    let echoed = &choice["logprobs"];
    for (i, position) in positions.iter().enumerate().skip(1) {
        let entries = position.as_object().unwrap();
        let own = &entries[&ids[i].to_string()];
        assert_eq!(
            own["logprob"].as_f64(),
            echoed["token_logprobs"][i].as_f64(),
            "{position}"
        );
        assert_eq!(own["decoded_token"], echoed["tokens"][i]);
        let rank = own["rank"].as_u64().unwrap();
        assert!(rank >= 1, "{position}");
        // The token and 3 alternatives, the token once where it is one of them.
        assert_eq!(entries.len(), if rank <= 3 { 3 } else { 4 }, "{position}");
        let mut ranked: Vec<(u64, f64)> = entries
            .values()
            .map(|e| (e["rank"].as_u64().unwrap(), e["logprob"].as_f64().unwrap()))
            .collect();
        ranked.sort_by_key(|r| r.0);
        assert_eq!(
            ranked[..3].iter().map(|r| r.0).collect::<Vec<_>>(),
            [1, 2, 3],
            "{position}"
        );
        assert!(ranked.windows(2).all(|w| w[0].1 >= w[1].1), "{position}");
        // The echo's one alternative is the most likely.
        let top = echoed["top_logprobs"][i].as_object().unwrap();
        assert!(
            top.values().any(|lp| lp.as_f64() == Some(ranked[0].1)),
            "{top:?} {position}"
        );
    }
    assert!(
        positions[1..].iter().any(|p| p.as_object().unwrap().len() == 4),
        "some prompt token is not its row's most likely"
    );

    // Asked for alone, the same positions, and no logprobs.
    let mut alone = greedy(prompt, 4);
    alone["prompt_logprobs"] = json!(3);
    let body = server.ok("/v1/completions", alone.clone()).await;
    assert_eq!(&body["choices"][0]["prompt_logprobs"], &choice["prompt_logprobs"]);
    assert_eq!(body["choices"][0]["logprobs"], Value::Null);
    alone["prompt_logprobs"] = json!(0);
    let body = server.ok("/v1/completions", alone.clone()).await;
    let first = body["choices"][0]["prompt_logprobs"][1].as_object().unwrap();
    assert_eq!(first.keys().collect::<Vec<_>>(), [&ids[1].to_string()]);

    alone["stream"] = json!(true);
    let chunks = server.stream("/v1/completions", alone.clone()).await;
    assert!(chunks.iter().all(|c| c["choices"][0].get("prompt_logprobs").is_none()));
    alone["prompt_logprobs"] = json!(1);
    let (status, e) = server.call("/v1/completions", alone).await;
    assert_eq!(
        (status.as_u16(), &e["error"]["param"]),
        (400, &json!("prompt_logprobs")),
        "{e}"
    );

    // Chat has them once, beside the choices.
    let chat = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "def f():"}],
        "max_tokens": 2,
        "temperature": 0,
        "n": 2,
        "prompt_logprobs": 1,
    });
    let body = server.ok("/v1/chat/completions", chat).await;
    let positions = body["prompt_logprobs"].as_array().unwrap();
    assert_eq!(positions.len() as u64, body["usage"]["prompt_tokens"].as_u64().unwrap());
    assert_eq!(positions[0], Value::Null);
    assert!(positions[1].as_object().is_some_and(|p| !p.is_empty()), "{body}");
    assert!(body["choices"][0].get("prompt_logprobs").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculation_can_be_turned_off_per_request_with_the_same_greedy_text() {
    let server = TestServer::start().await;
    let drafts_before = server.metric("peagle:spec_decode_num_drafts_total").await;
    let mut request = greedy("def main():", 24);
    request["speculative"] = json!(false);
    let plain = texts(&server.ok("/v1/completions", request).await);
    assert_eq!(
        server.metric("peagle:spec_decode_num_drafts_total").await,
        drafts_before
    );
    let speculative = texts(&server.ok("/v1/completions", greedy("def main():", 24)).await);
    assert_eq!(plain, speculative);
    assert!(server.metric("peagle:spec_decode_num_drafts_total").await > drafts_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn penalties_and_logit_bias_steer_greedy_text_alike_with_and_without_speculation() {
    let server = TestServer::start().await;
    let prompt = "import os\nimport sys\n";
    let plain = texts(&server.ok("/v1/completions", greedy(prompt, 32)).await);
    let mut penalised = greedy(prompt, 32);
    penalised["repetition_penalty"] = json!(1.5);
    penalised["frequency_penalty"] = json!(0.5);
    penalised["presence_penalty"] = json!(0.5);
    let speculative = texts(&server.ok("/v1/completions", penalised.clone()).await);
    assert_ne!(speculative, plain, "the penalties change the text");
    penalised["speculative"] = json!(false);
    assert_eq!(texts(&server.ok("/v1/completions", penalised).await), speculative);

    // A bias of 100 on one token makes greedy decoding repeat it.
    let forced = token_id(" pass");
    let mut biased = greedy(prompt, 6);
    biased["logit_bias"] = json!({ forced.to_string(): 100 });
    assert_eq!(
        texts(&server.ok("/v1/completions", biased).await),
        vec![" pass".repeat(6)]
    );
}

/// vLLM's token constraints steer greedy text alike with and without speculation:
/// `bad_words` keeps a word's tokens (with and without a leading space) out of it, and
/// `allowed_token_ids` keeps every token in the set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_words_and_allowed_token_ids_constrain_greedy_text_alike_with_and_without_speculation() {
    let server = TestServer::start().await;
    let tokens_of = |body: &Value| -> Vec<String> {
        let tokens = body["choices"][0]["logprobs"]["tokens"].as_array().unwrap();
        tokens.iter().map(|t| t.as_str().unwrap().to_owned()).collect()
    };
    let mut request = greedy("import os\nimport sys\n", 32);
    request["logprobs"] = json!(0);
    let free = tokens_of(&server.ok("/v1/completions", request.clone()).await);
    assert!(free.iter().any(|t| t == "import"), "{free:?}");

    let mut banned = request.clone();
    banned["bad_words"] = json!([" import"]);
    let speculative = tokens_of(&server.ok("/v1/completions", banned.clone()).await);
    assert_ne!(speculative, free);
    assert!(
        !speculative.iter().any(|t| t == "import" || t == " import"),
        "{speculative:?}"
    );
    banned["speculative"] = json!(false);
    assert_eq!(tokens_of(&server.ok("/v1/completions", banned).await), speculative);

    // The free text's tokens but its first.
    let allowed: Vec<u32> = free[1..].iter().map(|t| token_id(t)).collect();
    let mut only = request;
    only["allowed_token_ids"] = json!(allowed);
    let speculative = tokens_of(&server.ok("/v1/completions", only.clone()).await);
    assert!(
        speculative.iter().all(|t| allowed.contains(&token_id(t))),
        "{speculative:?} leaves {allowed:?}"
    );
    assert_ne!(speculative[0], free[0]);
    only["speculative"] = json!(false);
    assert_eq!(tokens_of(&server.ok("/v1/completions", only).await), speculative);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_token_id_ends_the_choice_and_is_reported() {
    let server = TestServer::start().await;
    let mut request = greedy("def main():", 32);
    request["logprobs"] = json!(0);
    let free = server.ok("/v1/completions", request.clone()).await;
    let tokens = free["choices"][0]["logprobs"]["tokens"].as_array().unwrap().clone();
    let stop = token_id(tokens[4].as_str().unwrap());
    assert!(
        !tokens[..4].contains(&tokens[4]),
        "the stop token must not come earlier: {tokens:?}"
    );
    request["stop_token_ids"] = json!([stop]);
    let stopped = server.ok("/v1/completions", request.clone()).await;
    let choice = &stopped["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["stop_reason"], json!(stop));
    assert_eq!(choice["logprobs"]["tokens"].as_array().unwrap()[..], tokens[..5]);
    assert_eq!(stopped["usage"]["completion_tokens"], 5);
    // The stop token counts, but its text is not part of the answer unless asked for (vLLM).
    let free_text = texts(&free).remove(0);
    let offset = |i: usize| free["choices"][0]["logprobs"]["text_offset"][i].as_u64().unwrap() as usize;
    let prefix = |chars: usize| free_text.chars().take(chars).collect::<String>();
    assert_eq!(texts(&stopped), vec![prefix(offset(4))]);
    request["include_stop_str_in_output"] = json!(true);
    let kept = server.ok("/v1/completions", request.clone()).await;
    assert_eq!(texts(&kept), vec![prefix(offset(5))]);
    request["include_stop_str_in_output"] = json!(false);

    // Held back until 8 tokens are out, it cannot end the choice at the 5th.
    request["min_tokens"] = json!(8);
    let held = server.ok("/v1/completions", request).await;
    let held_tokens = held["choices"][0]["logprobs"]["tokens"].as_array().unwrap();
    assert!(held_tokens.len() >= 8, "{held}");
    assert_ne!(held_tokens[4], tokens[4]);
}

/// A generation config's sampling fields are the defaults of requests that leave them out, and
/// its max_new_tokens caps every choice (vLLM's `--generation-config`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generation_config_sets_defaults_and_caps_the_length() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"temperature": 0.0, "max_new_tokens": 5}"#,
    )
    .unwrap();
    let server = TestServer::with(Options {
        generation_defaults: GenerationDefaults::Dir(dir.path().to_owned()),
        ..Options::default()
    })
    .await;
    let greedy_five = server.ok("/v1/completions", greedy("import os", 5)).await;
    let mut unset = greedy("import os", 12);
    unset.as_object_mut().unwrap().remove("temperature");
    let body = server.ok("/v1/completions", unset).await;
    assert_eq!(texts(&body), texts(&greedy_five));
    assert_eq!(body["usage"]["completion_tokens"], 5);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
}

/// vLLM's continuous_usage_stats: every chunk carries its choice's usage so far.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_usage_counts_each_choice_as_it_streams() {
    let server = TestServer::start().await;
    let mut request = greedy("import os", 6);
    request["n"] = json!(2);
    request["stream"] = json!(true);
    request["stream_options"] = json!({"include_usage": true, "continuous_usage_stats": true});
    let chunks = server.stream("/v1/completions", request).await;
    let (last, choices) = chunks.split_last().unwrap();
    assert_eq!(last["usage"]["completion_tokens"], 12);
    let mut seen = [0u64; 2];
    for chunk in choices {
        let index = chunk["choices"][0]["index"].as_u64().unwrap() as usize;
        let so_far = chunk["usage"]["completion_tokens"].as_u64().unwrap();
        assert!(so_far >= seen[index], "{chunk}");
        seen[index] = so_far;
        // One prompt: its tokens count once in the total, and in each choice's chunks.
        assert_eq!(chunk["usage"]["prompt_tokens"], last["usage"]["prompt_tokens"]);
    }
    assert_eq!(seen, [6, 6]);
}
