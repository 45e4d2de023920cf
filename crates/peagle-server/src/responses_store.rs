//! Responses kept in memory for `previous_response_id`, `GET /v1/responses/{id}` and
//! `DELETE /v1/responses/{id}`: each response as the JSON it was answered with, its input
//! items (`GET /v1/responses/{id}/input_items`), a background response's stream events, and
//! the conversation it ended, as chat messages, so that a later request goes on from it. The
//! store is bounded in bytes (`--responses-store-mb`): past the bound the least recently used
//! responses are forgotten, and nothing survives a restart. A bound of 0 keeps nothing, as
//! vLLM without its store. Each response holds its whole conversation, so a long chain of
//! responses takes room quadratic in its length.

use crate::protocol::chat::{ChatMessage, MessageContent};
use crate::responses_runs::SavedEvent;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

/// A stored response and the conversation through its answer (without its instructions,
/// which a later response does not inherit, as OpenAI has it).
pub struct Stored {
    /// The response object as JSON, as the request was answered.
    pub response: String,
    /// The request's own input items as `GET /v1/responses/{id}/input_items` lists them: a
    /// JSON array, each item with its id.
    pub input_items: String,
    pub conversation: Vec<ChatMessage>,
    /// Whether the server ended the answer early: the response is read, not gone on from.
    pub failed: bool,
    /// A background response's stream events, for `GET /v1/responses/{id}?stream=true`;
    /// none for another.
    pub events: Vec<SavedEvent>,
}

pub struct ResponseStore {
    limit: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Each id's response, its size, and its place in `order`.
    entries: HashMap<String, (Arc<Stored>, usize, u64)>,
    /// Ids by last use, least recent first.
    order: BTreeMap<u64, String>,
    next_use: u64,
    bytes: usize,
}

impl ResponseStore {
    /// A store of at most `limit` bytes (as `Stored::bytes` counts them); 0 keeps nothing.
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

    /// Keeps `stored` as `id`, forgetting the least recently used responses as its room needs;
    /// one larger than the whole store is not kept.
    pub fn put(&self, id: String, stored: Stored) {
        let bytes = stored.bytes();
        let mut inner = self.lock();
        inner.remove(&id);
        if bytes > self.limit {
            return;
        }
        while inner.bytes + bytes > self.limit {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            if let Some((_, size, _)) = inner.entries.remove(&oldest) {
                inner.bytes -= size;
            }
        }
        let used = inner.use_now();
        inner.bytes += bytes;
        inner.order.insert(used, id.clone());
        inner.entries.insert(id, (Arc::new(stored), bytes, used));
    }

    /// Forgets the response `id`; whether it was kept.
    pub fn remove(&self, id: &str) -> bool {
        self.lock().remove(id)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Inner {
    fn use_now(&mut self) -> u64 {
        self.next_use += 1;
        self.next_use
    }

    fn remove(&mut self, id: &str) -> bool {
        let Some((_, bytes, used)) = self.entries.remove(id) else {
            return false;
        };
        self.bytes -= bytes;
        self.order.remove(&used);
        true
    }

    fn touch(&mut self, id: &str) {
        let now = self.use_now();
        if let Some(entry) = self.entries.get_mut(id) {
            let before = std::mem::replace(&mut entry.2, now);
            self.order.remove(&before);
            self.order.insert(now, id.to_string());
        }
    }
}

impl Stored {
    /// What the response and its conversation take in memory: the response's JSON, the
    /// conversation's text, and a little for each message and call around it.
    fn bytes(&self) -> usize {
        let message = |m: &ChatMessage| {
            let content = match &m.content {
                Some(MessageContent::Text(text)) => text.len(),
                Some(MessageContent::Parts(parts)) => parts
                    .iter()
                    .map(|p| 64 + p.kind.len() + p.text.as_ref().map_or(0, String::len))
                    .sum(),
                None => 0,
            };
            let calls = m.tool_calls.iter().flatten();
            let calls: usize = calls
                .map(|c| 96 + c.id.len() + c.kind.len() + c.function.name.len() + c.function.arguments.len())
                .sum();
            let ids = m.tool_call_id.as_ref().map_or(0, String::len);
            160 + m.role.len() + content + m.reasoning_content.as_ref().map_or(0, String::len) + calls + ids
        };
        let events: usize = self.events.iter().map(|e| 64 + e.kind.len() + e.data.len()).sum();
        self.response.len() + self.input_items.len() + self.conversation.iter().map(message).sum::<usize>() + events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(text: usize) -> Stored {
        let response = "{\"object\": \"response\"}".to_string();
        let message = ChatMessage {
            role: "user".into(),
            content: Some(MessageContent::Text("x".repeat(text))),
            reasoning_content: None,
            tool_calls: None,
            tool_call_id: None,
        };
        Stored {
            response,
            input_items: "[]".into(),
            conversation: vec![message],
            failed: false,
            events: Vec::new(),
        }
    }

    /// Past its bound the store forgets the least recently used responses first (a read
    /// counts as a use); one larger than the whole store is not kept, and takes the place of
    /// nothing but its own id's; a deleted one is gone, its room free.
    #[test]
    fn the_least_recently_used_responses_are_forgotten_for_room() {
        let one = stored(1000).bytes();
        let store = ResponseStore::new(3 * one);
        for id in ["a", "b", "c"] {
            store.put(id.into(), stored(1000));
        }
        assert!(store.get("a").is_some(), "a is read, so b is the least recently used");
        store.put("d".into(), stored(1000));
        let kept = |id: &str| store.get(id).is_some();
        assert_eq!(["a", "b", "c", "d"].map(kept), [true, false, true, true]);
        store.put("huge".into(), stored(10_000));
        assert!(["a", "c", "d"].map(kept).iter().all(|&k| k) && !kept("huge"));
        store.put("a".into(), stored(10_000));
        assert!(
            !kept("a") && kept("c"),
            "a too large a second time: its first is gone too"
        );
        store.put("c".into(), stored(1000));
        assert!(kept("c") && kept("d"), "put again under its own id: counted once");
        assert!(store.remove("c") && !store.remove("c") && !kept("c"));
        for id in ["e", "f"] {
            store.put(id.into(), stored(1000));
        }
        assert!(
            ["d", "e", "f"].map(kept).iter().all(|&k| k),
            "the deleted ones' room is free"
        );
        let off = ResponseStore::new(0);
        off.put("a".into(), stored(1));
        assert!(!off.enabled() && off.get("a").is_none());
    }
}
