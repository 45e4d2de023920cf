//! /v1/responses' stored responses: gone on from by `previous_response_id` as if the
//! conversation were sent whole, read, listed with their input items, and deleted.

use crate::common::{Options, TestServer};
use crate::responses::{items, request};
use peagle_server::ServerConfig;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_are_gone_on_from_read_and_deleted() {
    let server = TestServer::start().await;
    let first = server.ok("/v1/responses", request(6)).await;
    assert_eq!(first["store"], true);
    let id = first["id"].as_str().unwrap();
    let path = format!("/v1/responses/{id}");
    let read = server.get(&path).await;
    assert_eq!(read.status(), 200);
    assert_eq!(read.json::<Value>().await.unwrap(), first);

    // Going on from it is sending its conversation, through its answer, without its
    // instructions (a later response does not inherit them).
    let next = |input: Value| json!({"input": input, "max_output_tokens": 6, "temperature": 0, "ignore_eos": true});
    let mut second = next(json!("Now reverse it."));
    second["previous_response_id"] = json!(id);
    let second = server.ok("/v1/responses", second).await;
    assert_eq!(second["previous_response_id"], json!(id));
    let answer = first["output"][0]["content"][0]["text"].clone();
    let whole = next(json!([
        {"role": "user", "content": "Sort a list"},
        {"role": "assistant", "content": [{"type": "output_text", "text": answer}]},
        {"role": "user", "content": "Now reverse it."},
    ]));
    let whole = server.ok("/v1/responses", whole).await;
    assert_eq!(items(&second), items(&whole));
    assert_eq!(second["usage"]["input_tokens"], whole["usage"]["input_tokens"]);

    let delete = || server.client.delete(format!("{}{path}", server.url)).send();
    let deleted = delete().await.unwrap();
    assert_eq!(deleted.status(), 200);
    let body: Value = deleted.json().await.unwrap();
    assert_eq!(body, json!({"id": id, "object": "response.deleted", "deleted": true}));
    assert_eq!(server.get(&path).await.status(), 404);
    assert_eq!(delete().await.unwrap().status(), 404);
    let mut gone = next(json!("Again."));
    gone["previous_response_id"] = json!(id);
    let (status, error) = server.call("/v1/responses", gone).await;
    assert_eq!(
        (status.as_u16(), &error["error"]["param"]),
        (404, &json!("previous_response_id"))
    );

    // A streamed response is stored too, as its last event holds it; a client's X-Request-Id
    // never names it; it is not streamed again.
    let mut streaming = request(3);
    streaming["stream"] = json!(true);
    let response = server
        .post("/v1/responses")
        .header("x-request-id", "mine")
        .json(&streaming)
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    let last = text.rsplit("data: ").next().unwrap();
    let last: Value = serde_json::from_str(last.trim()).unwrap();
    let streamed = &last["response"];
    assert_ne!(streamed["id"], "resp_mine");
    let path = format!("/v1/responses/{}", streamed["id"].as_str().unwrap());
    assert_eq!(&server.get(&path).await.json::<Value>().await.unwrap(), streamed);
    assert_eq!(server.get(&format!("{path}?stream=true")).await.status(), 400);

    let mut unstored = request(2);
    unstored["store"] = json!(false);
    let unstored = server.ok("/v1/responses", unstored).await;
    assert_eq!(unstored["store"], false);
    let path = format!("/v1/responses/{}", unstored["id"].as_str().unwrap());
    assert_eq!(server.get(&path).await.status(), 404);

    // A server that keeps none stores nothing and refuses to go on.
    let keeps_none = TestServer::with(Options {
        config: ServerConfig {
            responses_store_bytes: 0,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let body = keeps_none.ok("/v1/responses", request(2)).await;
    assert_eq!(body["store"], false);
    let mut on = request(2);
    on["previous_response_id"] = body["id"].clone();
    let (status, error) = keeps_none.call("/v1/responses", on).await;
    assert_eq!(
        (status.as_u16(), &error["error"]["param"]),
        (400, &json!("previous_response_id"))
    );
}

/// A stored response lists its own input items (not its instructions, nor the conversation
/// of the response it goes on from), newest first unless asked otherwise, a page at a time;
/// an unknown response is a 404 and a bad page a 400 naming its parameter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_list_their_own_input_items() {
    let server = TestServer::start().await;
    let mut body = request(2);
    body["input"] = json!([
        {"role": "user", "content": "Sort a list", "id": "msg_first"},
        {"role": "assistant", "content": "Use sorted()."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Reverse it"}]},
    ]);
    let first = server.ok("/v1/responses", body).await;
    let list = |query: String| {
        let path = format!("/v1/responses/{}/input_items{query}", first["id"].as_str().unwrap());
        let server = &server;
        async move {
            let response = server.get(&path).await;
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        }
    };
    let (status, all) = list(String::new()).await;
    assert_eq!(status, 200);
    assert_eq!(all["object"], "list");
    let data = all["data"].as_array().unwrap();
    let texts: Vec<&str> = data.iter().map(|i| i["content"][0]["text"].as_str().unwrap()).collect();
    assert_eq!(texts, ["Reverse it", "Use sorted().", "Sort a list"], "newest first");
    assert_eq!(data[1]["content"][0]["type"], "output_text");
    assert_eq!(data[2]["content"][0]["type"], "input_text");
    assert_eq!(
        (&all["last_id"], &all["has_more"]),
        (&json!("msg_first"), &json!(false))
    );
    assert!(data
        .iter()
        .all(|i| i["type"] == "message" && i["status"] == "completed"));

    let (_, page) = list("?order=asc&limit=2".into()).await;
    assert_eq!(
        (&page["first_id"], &page["has_more"]),
        (&json!("msg_first"), &json!(true))
    );
    let after = page["last_id"].as_str().unwrap();
    let (_, rest) = list(format!("?order=asc&limit=2&after={after}")).await;
    assert_eq!(rest["data"].as_array().unwrap().len(), 1);
    assert_eq!((&rest["last_id"], &rest["has_more"]), (&all["first_id"], &json!(false)));
    for (query, param) in [
        ("?limit=0", "limit"),
        ("?order=up", "order"),
        ("?after=msg_none", "after"),
    ] {
        let (status, error) = list(query.into()).await;
        assert_eq!((status, &error["error"]["param"]), (400, &json!(param)), "{query}");
    }

    let mut next = request(2);
    next["input"] = json!("And dedupe it");
    next["previous_response_id"] = first["id"].clone();
    let second = server.ok("/v1/responses", next).await;
    let path = format!("/v1/responses/{}/input_items", second["id"].as_str().unwrap());
    let own: Value = server.get(&path).await.json().await.unwrap();
    let own = own["data"].as_array().unwrap();
    assert_eq!(own.len(), 1);
    assert_eq!(
        (&own[0]["role"], &own[0]["content"][0]["text"]),
        (&json!("user"), &json!("And dedupe it"))
    );
    assert_eq!(server.get("/v1/responses/resp_none/input_items").await.status(), 404);
}
