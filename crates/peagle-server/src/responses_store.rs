//! Responses kept in memory for `previous_response_id`, `GET /v1/responses/{id}` and
//! `DELETE /v1/responses/{id}`: each response with the conversation it ended, as chat
//! messages, so that a later request goes on from it. The store is bounded in bytes
//! (`--responses-store-mb`): past the bound the least recently used responses are forgotten,
//! and nothing survives a restart. A bound of 0 keeps nothing, as vLLM without its store.

use crate::protocol::chat::{ChatMessage, MessageContent};
use crate::protocol::responses::ResponseObject;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// A stored response and the conversation through its answer (without its instructions,
/// which a later response does not inherit, as OpenAI has it).
pub struct Stored {
    pub response: ResponseObject,
    pub conversation: Vec<ChatMessage>,
}

pub struct ResponseStore {
    limit: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, (Arc<Stored>, usize)>,
    /// Ids, least recently used first.
    order: VecDeque<String>,
    bytes: usize,
}

impl ResponseStore {
    /// A store of at most `limit` bytes (as `Stored::bytes` estimates them); 0 keeps nothing.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.limit > 0
    }

    /// The response `id`, now the most recently used.
    pub fn get(&self, id: &str) -> Option<Arc<Stored>> {
        let mut inner = self.lock();
        let stored = inner.entries.get(id)?.0.clone();
        inner.touch(id);
        Some(stored)
    }

    /// Keeps `stored` under its response's id, forgetting the least recently used responses
    /// as its room needs; one larger than the whole store is not kept.
    pub fn put(&self, stored: Stored) {
        let bytes = stored.bytes();
        if bytes > self.limit {
            return;
        }
        let id = stored.response.id.clone();
        let mut inner = self.lock();
        inner.remove(&id);
        while inner.bytes + bytes > self.limit {
            let Some(oldest) = inner.order.front().cloned() else {
                break;
            };
            inner.remove(&oldest);
        }
        inner.bytes += bytes;
        inner.order.push_back(id.clone());
        inner.entries.insert(id, (Arc::new(stored), bytes));
    }

    /// Forgets the response `id`; whether it was kept.
    pub fn remove(&self, id: &str) -> bool {
        self.lock().remove(id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Inner {
    fn remove(&mut self, id: &str) -> bool {
        let Some((_, bytes)) = self.entries.remove(id) else {
            return false;
        };
        self.bytes -= bytes;
        self.order.retain(|kept| kept != id);
        true
    }

    fn touch(&mut self, id: &str) {
        if let Some(at) = self.order.iter().position(|kept| kept == id) {
            let id = self.order.remove(at).expect("a position found");
            self.order.push_back(id);
        }
    }
}

impl Stored {
    /// About what the response and its conversation take in memory: their text, and a
    /// little for each message and item around it.
    fn bytes(&self) -> usize {
        let message = |m: &ChatMessage| {
            let content = match &m.content {
                Some(MessageContent::Text(text)) => text.len(),
                Some(MessageContent::Parts(parts)) => {
                    parts.iter().filter_map(|p| p.text.as_ref()).map(String::len).sum()
                }
                None => 0,
            };
            let calls = m.tool_calls.iter().flatten();
            let calls: usize = calls
                .map(|c| c.id.len() + c.function.name.len() + c.function.arguments.len())
                .sum();
            128 + content + m.reasoning_content.as_ref().map_or(0, String::len) + calls
        };
        let response = serde_json::to_vec(&self.response).map_or(0, |json| json.len());
        response + self.conversation.iter().map(message).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::responses::TextConfig;
    use serde_json::json;

    fn stored(id: &str, text: usize) -> Stored {
        let response = ResponseObject {
            id: id.into(),
            object: "response",
            created_at: 0,
            status: "completed",
            completed_at: Some(0),
            error: None,
            incomplete_details: None,
            instructions: None,
            max_output_tokens: None,
            metadata: None,
            model: "m".into(),
            output: Vec::new(),
            parallel_tool_calls: true,
            previous_response_id: None,
            reasoning: None,
            store: true,
            temperature: None,
            text: TextConfig::default(),
            tool_choice: json!("auto"),
            tools: Vec::new(),
            top_p: None,
            truncation: "disabled",
            usage: None,
            user: None,
        };
        let message = ChatMessage {
            role: "user".into(),
            content: Some(MessageContent::Text("x".repeat(text))),
            reasoning_content: None,
            tool_calls: None,
            tool_call_id: None,
        };
        Stored {
            response,
            conversation: vec![message],
        }
    }

    /// Past its bound the store forgets the least recently used responses first (a read
    /// counts as a use); one larger than the whole store is not kept; a deleted one is gone.
    #[test]
    fn the_least_recently_used_responses_are_forgotten_for_room() {
        let one = stored("a", 1000).bytes();
        let store = ResponseStore::new(3 * one);
        for id in ["a", "b", "c"] {
            store.put(stored(id, 1000));
        }
        assert!(store.get("a").is_some(), "a is read, so b is the least recently used");
        store.put(stored("d", 1000));
        let kept = |id: &str| store.get(id).is_some();
        assert_eq!(["a", "b", "c", "d"].map(kept), [true, false, true, true]);
        store.put(stored("huge", 10_000));
        assert!(
            !kept("huge") && kept("a"),
            "too large for the store: not kept, nothing forgotten"
        );
        assert!(store.remove("c") && !store.remove("c") && !kept("c"));
        store.put(stored("e", 1000));
        assert!(
            ["a", "d", "e"].map(kept).iter().all(|&k| k),
            "the deleted one's room is free"
        );
        let off = ResponseStore::new(0);
        off.put(stored("a", 1));
        assert!(!off.enabled() && off.get("a").is_none());
    }
}
