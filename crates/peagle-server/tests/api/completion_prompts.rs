//! /v1/completions' prompts: token ids, echo, special tokens, truncation, and the prompt
//! scored (echoed logprobs, vLLM's prompt_logprobs).

use crate::common::{greedy, texts, TestServer, MAX_MODEL_LEN, MODEL};
use serde_json::{json, Value};

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
