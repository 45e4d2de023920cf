//! A stored response's input items, `GET /v1/responses/{id}/input_items`: the request's own
//! `input` (not the conversation of a `previous_response_id` before it, nor its
//! `instructions`), each item typed and with an id (the client's, or one made when the
//! response was stored), paged by item id as OpenAI's list endpoints are.

use super::responses::not_found;
use crate::error::ApiError;
use crate::openapi::ApiErrors;
use crate::protocol::random_id;
use crate::protocol::responses::{InputItem, InputItemList, ItemContent, ItemPart, ResponsesInput};
use crate::state::AppState;
use axum::extract::{Path, Query, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use utoipa::IntoParams;

/// The most items a page holds, and how many it holds by default.
const MOST_ITEMS: i64 = 100;
const DEFAULT_ITEMS: i64 = 20;

/// `input` as the listing gives it, in input order: a text is one user message. Called on an
/// input the request was served from, so every item's type and fields were checked.
pub fn input_items(input: &ResponsesInput) -> Vec<Value> {
    let items = match input {
        ResponsesInput::Text(text) => return vec![message_item(None, "user", &ItemContent::Text(text.clone()))],
        ResponsesInput::Items(items) => items,
    };
    items.iter().map(input_item).collect()
}

fn input_item(item: &InputItem) -> Value {
    let given = item.id.clone();
    let id = |prefix: &str| given.clone().unwrap_or_else(|| format!("{prefix}_{}", random_id()));
    let text = ItemContent::Text(String::new());
    match item.kind.as_deref().unwrap_or("message") {
        "function_call" => json!({
            "type": "function_call", "id": id("fc"), "call_id": item.call_id, "name": item.name,
            "arguments": item.arguments, "status": "completed",
        }),
        "function_call_output" => json!({
            "type": "function_call_output", "id": id("fco"), "call_id": item.call_id,
            "output": output(item.output.as_ref().unwrap_or(&text)), "status": "completed",
        }),
        "reasoning" => json!({
            "type": "reasoning", "id": id("rs"),
            "summary": item.summary.iter().flatten().map(part).collect::<Vec<_>>(),
            "content": item.content.as_ref().map(|c| parts(c, "reasoning_text")),
        }),
        _ => {
            let role = item.role.as_deref().unwrap_or("user");
            message_item(item.id.clone(), role, item.content.as_ref().unwrap_or(&text))
        }
    }
}

/// A message item: its text as one part, `output_text` for the assistant's (with the
/// annotations an output part has), `input_text` for the others'.
fn message_item(id: Option<String>, role: &str, content: &ItemContent) -> Value {
    let kind = if role == "assistant" {
        "output_text"
    } else {
        "input_text"
    };
    json!({
        "type": "message", "id": id.unwrap_or_else(|| format!("msg_{}", random_id())), "role": role,
        "content": parts(content, kind), "status": "completed",
    })
}

/// Content as parts: a text as one part of `kind`, parts as given.
fn parts(content: &ItemContent, kind: &str) -> Vec<Value> {
    match content {
        ItemContent::Text(text) => vec![part(&ItemPart {
            kind: kind.to_string(),
            text: Some(text.clone()),
        })],
        ItemContent::Parts(parts) => parts.iter().map(part).collect(),
    }
}

fn part(part: &ItemPart) -> Value {
    let mut value = json!({"type": part.kind, "text": part.text});
    if part.kind == "output_text" {
        value["annotations"] = json!([]);
    }
    value
}

/// A call output's content: its text as given, or its parts.
fn output(content: &ItemContent) -> Value {
    match content {
        ItemContent::Text(text) => json!(text),
        ItemContent::Parts(given) => json!(given.iter().map(part).collect::<Vec<_>>()),
    }
}

/// The listing's query. `include` is not read: what it adds (search results, images, output
/// logprobs) is in no input item this server takes.
#[derive(Debug, Deserialize, IntoParams)]
pub struct ItemsQuery {
    /// The items after this item, in the page's order.
    after: Option<String>,
    /// The items before this item, in the page's order: the nearest ones to it.
    before: Option<String>,
    /// How many items a page holds, 1 to 100 (default 20).
    limit: Option<i64>,
    /// "desc" (the default: the last input item first) or "asc".
    order: Option<String>,
}

#[utoipa::path(get, path = "/v1/responses/{id}/input_items", tag = "OpenAI", security(("api_key" = [])),
    params(("id" = String, Path, description = "A stored response's id"), ItemsQuery),
    responses((status = 200, description = "A page of the response's input items", body = InputItemList), ApiErrors))]
pub async fn list_input_items(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(query): Query<ItemsQuery>,
) -> Result<Json<InputItemList>, ApiError> {
    let stored = state.responses.get(&id).ok_or_else(|| not_found(&id, None))?;
    let items: Vec<Value> = serde_json::from_str(&stored.input_items)
        .map_err(|e| ApiError::internal(format!("a stored response's input items are not JSON: {e}")))?;
    page(items, &query).map(Json)
}

/// The page of `items` (in input order) that `query` asks for.
fn page(mut items: Vec<Value>, query: &ItemsQuery) -> Result<InputItemList, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_ITEMS);
    if !(1..=MOST_ITEMS).contains(&limit) {
        return Err(ApiError::invalid(
            Some("limit"),
            format!("limit: from 1 to {MOST_ITEMS}, not {limit}"),
        ));
    }
    match query.order.as_deref() {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(other) => {
            return Err(ApiError::invalid(
                Some("order"),
                format!("order: asc or desc, not {other:?}"),
            ))
        }
    }
    let position = |param: &str, cursor: &str| {
        items.iter().position(|item| item["id"] == cursor).ok_or_else(|| {
            ApiError::invalid(
                Some(param),
                format!("{param}: the response has no input item {cursor:?}"),
            )
        })
    };
    let start = match &query.after {
        Some(cursor) => position("after", cursor)? + 1,
        None => 0,
    };
    let end = match &query.before {
        Some(cursor) => position("before", cursor)?,
        None => items.len(),
    };
    let window = &items[start.min(end)..end];
    let limit = limit as usize;
    // Before a cursor alone, the page is the items nearest it; otherwise the first ones.
    let (first, has_more) = match query.before.is_some() && query.after.is_none() {
        true => (window.len().saturating_sub(limit), window.len() > limit),
        false => (0, window.len() > limit),
    };
    let data = window[first..window.len().min(first + limit)].to_vec();
    let id = |item: Option<&Value>| item.and_then(|i| i["id"].as_str()).map(str::to_string);
    Ok(InputItemList {
        object: "list",
        first_id: id(data.first()),
        last_id: id(data.last()),
        data,
        has_more,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &InputItemList) -> Vec<&str> {
        list.data.iter().map(|i| i["id"].as_str().unwrap()).collect()
    }

    fn query(after: Option<&str>, before: Option<&str>, limit: Option<i64>, order: Option<&str>) -> ItemsQuery {
        ItemsQuery {
            after: after.map(str::to_string),
            before: before.map(str::to_string),
            limit,
            order: order.map(str::to_string),
        }
    }

    /// Pages walk the items in either order from a cursor, newest first by default; a page
    /// before a cursor holds the items nearest it; a bad limit, order or cursor is a 400
    /// naming its parameter.
    #[test]
    fn pages_follow_the_order_and_the_cursors() {
        let items: Vec<Value> = ["a", "b", "c", "d", "e"].iter().map(|id| json!({"id": id})).collect();
        let get = |q: ItemsQuery| page(items.clone(), &q);
        let all = get(query(None, None, None, None)).unwrap();
        assert_eq!(ids(&all), ["e", "d", "c", "b", "a"]);
        assert_eq!(
            (all.first_id.as_deref(), all.last_id.as_deref(), all.has_more),
            (Some("e"), Some("a"), false)
        );
        let first = get(query(None, None, Some(2), Some("asc"))).unwrap();
        assert_eq!((ids(&first), first.has_more), (vec!["a", "b"], true));
        let next = get(query(Some("b"), None, Some(2), Some("asc"))).unwrap();
        assert_eq!((ids(&next), next.has_more), (vec!["c", "d"], true));
        let last = get(query(Some("d"), None, Some(2), Some("asc"))).unwrap();
        assert_eq!((ids(&last), last.has_more), (vec!["e"], false));
        let before = get(query(None, Some("d"), Some(2), Some("asc"))).unwrap();
        assert_eq!((ids(&before), before.has_more), (vec!["b", "c"], true));
        let between = get(query(Some("a"), Some("e"), Some(5), None)).unwrap();
        assert!(
            between.data.is_empty() && between.first_id.is_none(),
            "after a, before e, newest first"
        );
        let between = get(query(Some("e"), Some("a"), Some(2), None)).unwrap();
        assert_eq!((ids(&between), between.has_more), (vec!["d", "c"], true));
        for (q, param) in [
            (query(None, None, Some(0), None), "limit"),
            (query(None, None, Some(101), None), "limit"),
            (query(None, None, None, Some("up")), "order"),
            (query(Some("x"), None, None, None), "after"),
            (query(None, Some("x"), None, None), "before"),
        ] {
            let e = get(q).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(param)));
        }
    }

    /// A text input is one user message; items keep their ids and types, a message's text
    /// becomes a part (output_text for the assistant's), and ids are made where none is given.
    #[test]
    fn input_items_are_typed_with_ids() {
        let text = input_items(&ResponsesInput::Text("hi".into()));
        assert_eq!(text[0]["role"], "user");
        assert_eq!(text[0]["content"], json!([{"type": "input_text", "text": "hi"}]));
        assert!(text[0]["id"].as_str().unwrap().starts_with("msg_"));
        let items: Vec<InputItem> = serde_json::from_value(json!([
            {"role": "assistant", "content": "yes", "id": "msg_given"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
        ]))
        .unwrap();
        let listed = input_items(&ResponsesInput::Items(items));
        assert_eq!(listed[0]["id"], "msg_given");
        assert_eq!(
            listed[0]["content"],
            json!([{"type": "output_text", "text": "yes", "annotations": []}])
        );
        assert_eq!(
            (listed[1]["type"].as_str(), listed[1]["name"].as_str()),
            (Some("function_call"), Some("f"))
        );
        assert!(listed[1]["id"].as_str().unwrap().starts_with("fc_"));
        assert_eq!(
            (listed[2]["call_id"].as_str(), listed[2]["output"].as_str()),
            (Some("c1"), Some("42"))
        );
    }
}
