//! /v1/chat/completions: the chat template, plain and streamed answers, logprobs, budgets.

use crate::common::{greedy, streamed, texts, Options, TestServer, MAX_MODEL_LEN, MODEL};
use peagle_engine::GenerationDefaults;
use serde_json::{json, Value};

fn chat(max_tokens: Option<usize>) -> Value {
    let mut request = json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You write Python."},
            {"role": "user", "content": [{"type": "text", "text": "Sort a list"}]},
        ],
        "temperature": 0,
        "ignore_eos": true,
    });
    if let Some(m) = max_tokens {
        request["max_tokens"] = json!(m);
    }
    request
}

/// A usage block's token counts, leaving out how many came from the prefix cache.
fn token_counts(usage: &Value) -> [&Value; 3] {
    [
        &usage["prompt_tokens"],
        &usage["completion_tokens"],
        &usage["total_tokens"],
    ]
}

/// The demo model's template applied by hand: `# role: content\n` per message, then the
/// assistant header.
fn prompt_tokens() -> u64 {
    encode("# system: You write Python.\n# user: Sort a list\n# assistant:").len() as u64
}

/// Token ids of rendered prompt text (which holds its own special tokens).
fn encode(text: &str) -> Vec<u32> {
    let tokenizer = crate::common::tokenizer();
    tokenizer.encode(text, false).unwrap().get_ids().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_through_the_chat_template() {
    let server = TestServer::start().await;
    let body = server.ok("/v1/chat/completions", chat(Some(10))).await;
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"), "{body}");
    assert_eq!(body["object"], "chat.completion");
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(!choice["message"]["content"].as_str().unwrap().is_empty(), "{body}");
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(body["usage"]["prompt_tokens"].as_u64(), Some(prompt_tokens()));
    assert_eq!(body["usage"]["completion_tokens"], 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_role_then_content_deltas_then_usage() {
    let server = TestServer::start().await;
    let plain = server.ok("/v1/chat/completions", chat(Some(16))).await;
    let mut request = chat(Some(16));
    request["stream"] = json!(true);
    request["stream_options"] = json!({"include_usage": true});
    let chunks = server.stream("/v1/chat/completions", request).await;
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
    }
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let (text, finish) = streamed(&chunks, 0, "delta");
    assert_eq!(text, plain["choices"][0]["message"]["content"].as_str().unwrap());
    assert_eq!(finish.as_deref(), Some("length"));
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(token_counts(&last["usage"]), token_counts(&plain["usage"]));
    // The same prompt again: its full blocks come from the prefix cache.
    assert_eq!(last["usage"]["prompt_tokens_details"]["cached_tokens"], 16);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_list_each_token_with_its_alternatives() {
    let server = TestServer::start().await;
    let mut request = chat(Some(5));
    request["logprobs"] = json!(true);
    request["top_logprobs"] = json!(3);
    let body = server.ok("/v1/chat/completions", request).await;
    let content = body["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 5);
    for token in content {
        assert!(token["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(token["bytes"], json!(token["token"].as_str().unwrap().as_bytes()));
        let top = token["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["logprob"].as_f64(), token["logprob"].as_f64(), "{token}");
    }
}

/// Without max_tokens an answer gets the model's max_new_tokens (256 for the demo), or with
/// `--generation-config vllm` the rest of the context, as in vLLM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_max_tokens_the_answer_may_fill_the_context() {
    let server = TestServer::start().await;
    let body = server.ok("/v1/chat/completions", chat(None)).await;
    assert_eq!(body["usage"]["completion_tokens"], 256);
    let neutral = TestServer::with(Options {
        generation_defaults: GenerationDefaults::Neutral,
        ..Options::default()
    })
    .await;
    let body = neutral.ok("/v1/chat/completions", chat(None)).await;
    let expected = MAX_MODEL_LEN as u64 - prompt_tokens();
    assert_eq!(body["usage"]["completion_tokens"].as_u64(), Some(expected));
    assert_eq!(body["choices"][0]["finish_reason"], "length");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_and_max_completion_tokens() {
    let server = TestServer::start().await;
    let mut request = chat(None);
    request["n"] = json!(3);
    request["temperature"] = json!(1.0);
    request["seed"] = json!(1);
    request["max_completion_tokens"] = json!(7);
    let body = server.ok("/v1/chat/completions", request).await;
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
    }
    assert_eq!(body["usage"]["completion_tokens"], 21);
    assert_eq!(body["usage"]["prompt_tokens"].as_u64(), Some(prompt_tokens()));
}

/// vLLM's chat turn options: a final assistant message left open is continued exactly as the
/// same text sent to /v1/completions is, and echo starts the answer with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_assistant_message_can_be_continued_and_echoed() {
    let server = TestServer::start().await;
    let mut request = chat(Some(12));
    request["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": "def sort_list("}));
    request["add_generation_prompt"] = json!(false);
    request["continue_final_message"] = json!(true);
    let continued = server.ok("/v1/chat/completions", request.clone()).await;
    let prompt = "# system: You write Python.\n# user: Sort a list\n# assistant: def sort_list(";
    let mut completion = greedy(prompt, 12);
    completion["prompt"] = json!(encode(prompt));
    let same = server.ok("/v1/completions", completion).await;
    let answer = continued["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(answer, texts(&same)[0]);
    assert_eq!(token_counts(&continued["usage"]), token_counts(&same["usage"]));

    request["echo"] = json!(true);
    let echoed = server.ok("/v1/chat/completions", request.clone()).await;
    assert_eq!(
        echoed["choices"][0]["message"]["content"],
        format!("def sort_list({answer}")
    );
    request["stream"] = json!(true);
    let chunks = server.stream("/v1/chat/completions", request.clone()).await;
    assert_eq!(streamed(&chunks, 0, "delta").0, format!("def sort_list({answer}"));

    // Without the generation prompt the conversation just ends; both at once is refused.
    request["stream"] = json!(false);
    request["continue_final_message"] = json!(false);
    let closed = server.ok("/v1/chat/completions", request.clone()).await;
    assert_eq!(closed["usage"]["prompt_tokens"], encode(&format!("{prompt}\n")).len());
    // A conversation that ends with the user's turn is answered in the user's role (vLLM's
    // rule), and echo repeats that turn.
    let mut users = chat(Some(4));
    users["add_generation_prompt"] = json!(false);
    users["echo"] = json!(true);
    let body = server.ok("/v1/chat/completions", users.clone()).await;
    let message = &body["choices"][0]["message"];
    assert_eq!(message["role"], "user");
    assert!(
        message["content"].as_str().unwrap().starts_with("Sort a list"),
        "{body}"
    );
    // The tokenizer's own special tokens (a BOS) only when asked for.
    users["add_special_tokens"] = json!(true);
    let with_bos = server.ok("/v1/chat/completions", users).await;
    assert_eq!(
        with_bos["usage"]["prompt_tokens"].as_u64().unwrap(),
        body["usage"]["prompt_tokens"].as_u64().unwrap() + 1
    );

    request["add_generation_prompt"] = json!(true);
    request["continue_final_message"] = json!(true);
    let response = server.post("/v1/chat/completions").json(&request).send().await.unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["param"], "continue_final_message");
}
