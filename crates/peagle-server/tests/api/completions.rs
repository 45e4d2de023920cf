//! /v1/completions: plain and streamed, n, stop strings, logprobs, seeds, penalties and token
//! constraints (its prompts: `completion_prompts.rs`).

use crate::common::{greedy, streamed, texts, token_id, Options, TestServer, MODEL};
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
