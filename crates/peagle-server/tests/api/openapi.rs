//! `/openapi.json` describes what the server serves: every route, the request bodies (both
//! views of the completions and chat bodies) and the responses, errors included, every schema
//! it refers to defined.

use crate::common::TestServer;
use peagle_server::ServerConfig;
use reqwest::StatusCode;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spec_describes_every_route_and_needs_no_key() {
    let server = TestServer::with_config(ServerConfig {
        api_key: Some("sk-test".into()),
        ..Default::default()
    })
    .await;
    let response = server.get("/openapi.json").await;
    assert_eq!(response.status(), StatusCode::OK);
    let spec: Value = response.json().await.unwrap();
    assert!(
        spec["openapi"].as_str().unwrap().starts_with("3."),
        "{}",
        spec["openapi"]
    );
    let routes = [
        ("/v1/completions", "post"),
        ("/v1/chat/completions", "post"),
        ("/v1/responses", "post"),
        ("/v1/responses/{id}", "get"),
        ("/v1/responses/{id}", "delete"),
        ("/v1/responses/{id}/input_items", "get"),
        ("/v1/responses/{id}/cancel", "post"),
        ("/v1/models", "get"),
        ("/v1/models/{id}", "get"),
        ("/tokenize", "post"),
        ("/detokenize", "post"),
        ("/reset_prefix_cache", "post"),
        ("/health", "get"),
        ("/version", "get"),
        ("/metrics", "get"),
    ];
    let paths = spec["paths"].as_object().unwrap();
    let distinct: std::collections::BTreeSet<&str> = routes.iter().map(|(path, _)| *path).collect();
    assert_eq!(paths.len(), distinct.len(), "{:?}", paths.keys().collect::<Vec<_>>());
    for (path, method) in routes {
        let operation = &spec["paths"][path][method];
        assert!(
            operation["responses"]["200"].is_object(),
            "{method} {path}: {operation}"
        );
    }
    let completions = &spec["paths"]["/v1/completions"]["post"];
    let body = &completions["requestBody"]["content"]["application/json"]["schema"]["$ref"];
    let name = body.as_str().unwrap().rsplit('/').next().unwrap();
    let views: Vec<&str> = spec["components"]["schemas"][name]["allOf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["$ref"].as_str().unwrap())
        .collect();
    assert_eq!(
        views,
        [
            "#/components/schemas/CompletionRequest",
            "#/components/schemas/SamplingRequest"
        ]
    );
    let content = completions["responses"]["200"]["content"].as_object().unwrap();
    assert!(content.contains_key("application/json") && content.contains_key("text/event-stream"));
    let too_large = &completions["responses"]["413"]["content"]["application/json"]["schema"]["$ref"];
    assert_eq!(too_large, "#/components/schemas/ErrorResponse");
    // The sampling fields beside the raw-JSON groups flattened into them (refused fields,
    // structured output), whose own schemas each part of allOf names.
    let sampling = spec["components"]["schemas"]["SamplingRequest"]["allOf"]
        .as_array()
        .unwrap();
    let own = sampling.iter().find(|part| part.get("properties").is_some()).unwrap();
    assert!(own["properties"]["stop"].is_object(), "{own}");
    let structured = &spec["components"]["schemas"]["StructuredRequest"]["properties"];
    assert!(
        structured["response_format"].is_object() && structured["guided_json"].is_object(),
        "{structured}"
    );
    let mut refs = Vec::new();
    references(&spec, &mut refs);
    for reference in refs {
        let name = reference.strip_prefix("#/components/schemas/").unwrap_or(reference);
        assert!(
            spec["components"]["schemas"][name].is_object(),
            "{reference} names no schema"
        );
    }
}

/// Every `$ref` in `value`.
fn references<'a>(value: &'a Value, refs: &mut Vec<&'a str>) {
    match value {
        Value::Object(map) => {
            refs.extend(map.get("$ref").and_then(Value::as_str));
            map.values().for_each(|v| references(v, refs));
        }
        Value::Array(items) => items.iter().for_each(|v| references(v, refs)),
        _ => {}
    }
}
