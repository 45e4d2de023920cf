//! A response's output items, built as the answer's parser splits it: reasoning items,
//! assistant messages and function calls. Each change between reasoning, text and a call
//! closes the item before and opens the next, and every step is also a stream event
//! (`response.output_item.added`, `response.output_text.delta`, ...), so a streamed
//! response's events describe exactly the items the same splits give whole. Where logprobs
//! are asked for, a message's text carries its tokens' entries, each text delta those it
//! adds (`responses_logprobs` says which tokens a text's are).

use crate::answer::{CallPiece, Split};
use crate::protocol::chat::{ChatMessage, ChatTokenLogprob, MessageContent};
use crate::protocol::random_id;
use crate::protocol::responses::{FunctionCallItem, MessageItem, OutputItem, OutputText, ReasoningItem, ReasoningText};
use crate::protocol::tools::{FunctionCall, ToolCall};
use crate::protocol::TokenLogprob;
use serde_json::{json, Value};

#[derive(Debug, Default)]
pub struct OutputItems {
    items: Vec<OutputItem>,
    /// Whether the last item is still being written.
    open: bool,
    /// The output index of each of the answer's calls, by the parser's call index.
    calls: Vec<usize>,
    /// Events since the last `take_events`, without their sequence numbers.
    events: Vec<Value>,
    /// Whether messages' texts carry their tokens' logprobs.
    logprobs: bool,
}

impl OutputItems {
    /// Items whose messages carry their tokens' logprobs where `logprobs` says so.
    pub fn new(logprobs: bool) -> Self {
        Self {
            logprobs,
            ..Self::default()
        }
    }

    /// Adds what a split of the answer holds: more of the open call, which was written before
    /// anything else the split holds, then its reasoning, its text (with `entries`, its
    /// tokens' logprobs where they are asked for) and its other calls' pieces.
    pub fn push(&mut self, split: Split, entries: &[TokenLogprob]) {
        let open_call = self.open_call();
        let (continuing, others): (Vec<CallPiece>, Vec<CallPiece>) = split
            .calls
            .into_iter()
            .partition(|p| p.name.is_none() && Some(p.index) == open_call);
        for piece in continuing {
            self.call(piece);
        }
        if !split.reasoning.is_empty() {
            self.reasoning(&split.reasoning);
        }
        if !split.content.is_empty() {
            self.text(&split.content, entries);
        }
        for piece in others {
            self.call(piece);
        }
    }

    /// The parser's index of the call being written, if one is.
    fn open_call(&self) -> Option<usize> {
        let last = self.items.len().checked_sub(1).filter(|_| self.open)?;
        self.calls.iter().position(|&index| index == last)
    }

    /// Closes the last item: `completed`, or `incomplete` where the answer was cut short.
    pub fn finish(&mut self, status: &'static str) {
        self.close(status);
    }

    pub fn take_events(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.events)
    }

    pub fn items(&self) -> &[OutputItem] {
        &self.items
    }

    /// All the reasoning's text.
    pub fn reasoning_text(&self) -> String {
        self.reasoning_pieces().collect()
    }

    /// Each reasoning item's text, in order.
    fn reasoning_pieces(&self) -> impl Iterator<Item = &str> {
        self.items.iter().flat_map(|item| match item {
            OutputItem::Reasoning(r) => r.content.iter().map(|c| c.text.as_str()).collect(),
            _ => Vec::new(),
        })
    }

    /// The answer as the assistant's chat message, for the conversation a stored response
    /// ends: its reasoning, its text (null where it only called) and its whole calls by their
    /// ids (one cut short may hold no JSON, which a later prompt could not render).
    pub fn answer(&self) -> ChatMessage {
        let mut content = String::new();
        let mut calls = Vec::new();
        for item in &self.items {
            match item {
                OutputItem::Message(m) => content.extend(m.content.iter().map(|c| c.text.as_str())),
                OutputItem::FunctionCall(c) if c.status == "incomplete" => {}
                OutputItem::FunctionCall(c) => calls.push(ToolCall {
                    id: c.call_id.clone(),
                    kind: "function".into(),
                    function: FunctionCall {
                        name: c.name.clone(),
                        arguments: c.arguments.clone(),
                    },
                }),
                OutputItem::Reasoning(_) => {}
            }
        }
        // Reasoning items joined as input's are.
        let reasoning = self.reasoning_pieces().collect::<Vec<_>>().join("\n");
        ChatMessage {
            role: "assistant".into(),
            content: (!content.is_empty() || calls.is_empty()).then_some(MessageContent::Text(content)),
            reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
            tool_calls: (!calls.is_empty()).then_some(calls),
            tool_call_id: None,
        }
    }

    fn reasoning(&mut self, delta: &str) {
        if !matches!(self.open_item(), Some(OutputItem::Reasoning(_))) {
            self.open(OutputItem::Reasoning(ReasoningItem {
                kind: "reasoning",
                id: item_id("rs"),
                summary: Vec::new(),
                content: Vec::new(),
                status: "in_progress",
            }));
            let part = ReasoningText {
                kind: "reasoning_text",
                text: String::new(),
            };
            self.part_added(json!(part));
            if let Some(OutputItem::Reasoning(r)) = self.items.last_mut() {
                r.content.push(part);
            }
        }
        if let Some(OutputItem::Reasoning(r)) = self.items.last_mut() {
            r.content[0].text += delta;
        }
        self.item_event(
            "response.reasoning_text.delta",
            json!({"content_index": 0, "delta": delta}),
        );
    }

    fn text(&mut self, delta: &str, entries: &[TokenLogprob]) {
        if !matches!(self.open_item(), Some(OutputItem::Message(_))) {
            self.open(OutputItem::Message(MessageItem {
                kind: "message",
                id: item_id("msg"),
                role: "assistant",
                status: "in_progress",
                content: Vec::new(),
            }));
            let part = OutputText {
                kind: "output_text",
                text: String::new(),
                annotations: Vec::new(),
                logprobs: self.logprobs.then(Vec::new),
            };
            self.part_added(json!(part));
            if let Some(OutputItem::Message(m)) = self.items.last_mut() {
                m.content.push(part);
            }
        }
        let entries: Vec<ChatTokenLogprob> = match self.logprobs {
            true => entries.iter().map(ChatTokenLogprob::new).collect(),
            false => Vec::new(),
        };
        if let Some(OutputItem::Message(m)) = self.items.last_mut() {
            let part = &mut m.content[0];
            part.text += delta;
            part.logprobs
                .iter_mut()
                .for_each(|all| all.extend(entries.iter().cloned()));
        }
        let delta = json!({"content_index": 0, "delta": delta, "logprobs": entries});
        self.item_event("response.output_text.delta", delta);
    }

    fn call(&mut self, piece: CallPiece) {
        if let Some(name) = piece.name {
            self.open(OutputItem::FunctionCall(FunctionCallItem {
                kind: "function_call",
                id: item_id("fc"),
                call_id: format!("call_{}", random_id()),
                name,
                arguments: String::new(),
                status: "in_progress",
            }));
            self.calls.push(self.items.len() - 1);
        }
        // A parser names a call in its first piece and writes its pieces in a row, so a later
        // piece finds its call open; one that did not would follow the call's done event.
        if self.open_call() != Some(piece.index) {
            return;
        }
        let index = self.calls[piece.index];
        let OutputItem::FunctionCall(call) = &mut self.items[index] else {
            return;
        };
        if piece.arguments.is_empty() {
            return;
        }
        call.arguments += &piece.arguments;
        let event = json!({"type": "response.function_call_arguments.delta", "item_id": call.id,
                           "output_index": index, "delta": piece.arguments});
        self.events.push(event);
    }

    fn open_item(&self) -> Option<&OutputItem> {
        self.items.last().filter(|_| self.open)
    }

    /// Closes the open item and opens `item`.
    fn open(&mut self, item: OutputItem) {
        self.close("completed");
        self.items.push(item);
        self.open = true;
        let item = json!(self.items.last());
        let index = self.items.len() - 1;
        self.events
            .push(json!({"type": "response.output_item.added", "output_index": index, "item": item}));
    }

    fn part_added(&mut self, part: Value) {
        self.item_event("response.content_part.added", json!({"content_index": 0, "part": part}));
    }

    /// An event of the last item: `fields` with its type, id and output index.
    fn item_event(&mut self, kind: &str, mut fields: Value) {
        let index = self.items.len() - 1;
        let id = match &self.items[index] {
            OutputItem::Reasoning(r) => &r.id,
            OutputItem::Message(m) => &m.id,
            OutputItem::FunctionCall(c) => &c.id,
        };
        fields["type"] = json!(kind);
        fields["item_id"] = json!(id);
        fields["output_index"] = json!(index);
        self.events.push(fields);
    }

    /// The open item's closing events, with `status` set on it.
    fn close(&mut self, status: &'static str) {
        if !std::mem::take(&mut self.open) {
            return;
        }
        let Some(item) = self.items.last_mut() else {
            return;
        };
        let done = match item {
            OutputItem::Reasoning(r) => {
                r.status = status;
                let part = &r.content[0];
                vec![
                    (
                        "response.reasoning_text.done",
                        json!({"content_index": 0, "text": part.text}),
                    ),
                    ("response.content_part.done", json!({"content_index": 0, "part": part})),
                ]
            }
            OutputItem::Message(m) => {
                m.status = status;
                let part = &m.content[0];
                vec![
                    (
                        "response.output_text.done",
                        json!({"content_index": 0, "text": part.text, "logprobs": part.logprobs.as_deref().unwrap_or_default()}),
                    ),
                    ("response.content_part.done", json!({"content_index": 0, "part": part})),
                ]
            }
            OutputItem::FunctionCall(c) => {
                c.status = status;
                vec![(
                    "response.function_call_arguments.done",
                    json!({"name": c.name, "arguments": c.arguments}),
                )]
            }
        };
        for (kind, fields) in done {
            self.item_event(kind, fields);
        }
        let index = self.items.len() - 1;
        let item = json!(self.items[index]);
        self.events
            .push(json!({"type": "response.output_item.done", "output_index": index, "item": item}));
    }
}

/// An output item's id: its kind's prefix and 32 random hex digits.
fn item_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_id())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::{AnswerParser, Offer};
    use crate::harmony;

    fn split(reasoning: &str, content: &str, calls: Vec<CallPiece>) -> Split {
        Split {
            reasoning: reasoning.into(),
            content: content.into(),
            calls,
        }
    }

    fn piece(index: usize, name: Option<&str>, arguments: &str) -> CallPiece {
        CallPiece {
            index,
            name: name.map(str::to_string),
            arguments: arguments.into(),
        }
    }

    /// The items the events describe, rebuilt as a client rebuilds them: added items, their
    /// deltas, and the done items.
    fn replayed(events: &[Value]) -> Vec<Value> {
        let mut items: Vec<Value> = Vec::new();
        for event in events {
            let index = event["output_index"].as_u64().unwrap() as usize;
            match event["type"].as_str().unwrap() {
                "response.output_item.added" => {
                    assert_eq!(index, items.len(), "{event}");
                    items.push(event["item"].clone());
                }
                "response.content_part.added" => {
                    let content = items[index]["content"].as_array_mut().unwrap();
                    content.push(event["part"].clone());
                }
                "response.reasoning_text.delta" | "response.output_text.delta" => {
                    let part = &mut items[index]["content"][0];
                    part["text"] = json!(part["text"].as_str().unwrap().to_string() + event["delta"].as_str().unwrap());
                    if let Some(entries) = part.get_mut("logprobs").and_then(Value::as_array_mut) {
                        entries.extend(event["logprobs"].as_array().unwrap().iter().cloned());
                    }
                }
                "response.function_call_arguments.delta" => {
                    let arguments = &mut items[index]["arguments"];
                    *arguments = json!(arguments.as_str().unwrap().to_string() + event["delta"].as_str().unwrap());
                }
                "response.output_item.done" => {
                    let done = &event["item"];
                    let mut rebuilt = items[index].clone();
                    rebuilt["status"] = done["status"].clone();
                    assert_eq!(&rebuilt, done, "the deltas make the done item");
                    items[index] = rebuilt;
                }
                _ => {}
            }
            if let Some(id) = event.get("item_id") {
                assert_eq!(id, &items[index]["id"], "{event}");
            }
        }
        items
    }

    #[test]
    fn each_change_of_kind_is_a_new_item_and_the_events_make_the_items() {
        let mut output = OutputItems::default();
        let mut events = Vec::new();
        for split in [
            split("Need ", "", vec![]),
            split("weather.", "Let me ", vec![]),
            split("", "check.", vec![piece(0, Some("get_weather"), "{\"ci")]),
            split("", "", vec![piece(0, None, "ty\":\"Rome\"}")]),
            split("", "", vec![piece(1, Some("get_time"), "")]),
            split("", "", vec![piece(1, None, "{}")]),
        ] {
            output.push(split, &[]);
            events.extend(output.take_events());
        }
        output.finish("completed");
        events.extend(output.take_events());
        let items = json!(output.items());
        assert_eq!(replayed(&events), items.as_array().unwrap().clone());
        let kinds: Vec<&str> = items
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call", "function_call"]);
        assert_eq!(
            items[0]["content"],
            json!([{"type": "reasoning_text", "text": "Need weather."}])
        );
        assert_eq!(items[0]["summary"], json!([]));
        assert_eq!(
            items[1]["content"],
            json!([{"type": "output_text", "text": "Let me check.", "annotations": []}])
        );
        assert_eq!(items[2]["name"], "get_weather");
        assert_eq!(items[2]["arguments"], "{\"city\":\"Rome\"}");
        assert_eq!(items[3]["arguments"], "{}");
        assert_ne!(items[2]["call_id"], items[3]["call_id"]);
        assert!(items.as_array().unwrap().iter().all(|i| i["status"] == "completed"));
        assert_eq!(output.reasoning_text(), "Need weather.");
        let added = events
            .iter()
            .filter(|e| e["type"] == "response.output_item.added")
            .count();
        let done = events
            .iter()
            .filter(|e| e["type"] == "response.output_item.done")
            .count();
        assert_eq!((added, done), (4, 4));
    }

    /// A harmony answer, whole or streamed in pieces: each message an item in the answer's
    /// order, its analysis a reasoning item, its preamble a message, its call a function call.
    #[test]
    fn a_harmony_answers_channels_become_items_in_order() {
        let text = "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary<|message|>\
            Checking.<|end|><|start|>assistant<|channel|>analysis<|message|>Rome, then.<|end|>\
            <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json\
            <|message|>{\"city\":\"Rome\"}";
        let want = json!([
            {"type": "reasoning", "text": "Need it."},
            {"type": "message", "text": "Checking."},
            {"type": "reasoning", "text": "Rome, then."},
            {"type": "function_call", "text": "get_weather {\"city\":\"Rome\"}"},
        ]);
        for piece in [1, 5, 40, text.len()] {
            let offer = Offer::new(vec!["get_weather".into()], true);
            let mut parser = AnswerParser::Harmony(harmony::Channels::offering(offer));
            let mut output = OutputItems::default();
            let pieces = crate::answer::pieces(text, piece);
            for (i, text) in pieces.iter().enumerate() {
                for split in parser.split_in_order(text, i + 1 == pieces.len()) {
                    output.push(split, &[]);
                }
            }
            output.finish("completed");
            let got: Vec<Value> = json!(output.items())
                .as_array()
                .unwrap()
                .iter()
                .map(|item| {
                    let text = match item["type"].as_str().unwrap() {
                        "function_call" => format!(
                            "{} {}",
                            item["name"].as_str().unwrap(),
                            item["arguments"].as_str().unwrap()
                        ),
                        _ => item["content"][0]["text"].as_str().unwrap().to_string(),
                    };
                    json!({"type": item["type"], "text": text})
                })
                .collect();
            assert_eq!(json!(got), want, "in pieces of {piece}");
        }
    }

    /// A split that ends the open call and goes on with text (several tokens a step, under
    /// speculation) finishes the call before the text's message opens.
    #[test]
    fn a_calls_last_piece_comes_before_the_text_after_it() {
        let mut output = OutputItems::default();
        let mut events = Vec::new();
        output.push(split("", "", vec![piece(0, Some("f"), "{\"a\":")]), &[]);
        output.push(split("", "Done.", vec![piece(0, None, "1}")]), &[]);
        output.finish("completed");
        events.extend(output.take_events());
        let items = json!(output.items());
        assert_eq!(replayed(&events), items.as_array().unwrap().clone());
        assert_eq!(items[0]["arguments"], "{\"a\":1}");
        assert_eq!(items[1]["content"][0]["text"], "Done.");
    }

    #[test]
    fn an_answer_cut_short_leaves_its_last_item_incomplete() {
        let mut output = OutputItems::default();
        output.push(split("a", "b", vec![]), &[]);
        output.finish("incomplete");
        let items = json!(output.items());
        assert_eq!(items[0]["status"], "completed");
        assert_eq!(items[1]["status"], "incomplete");
        let mut empty = OutputItems::default();
        empty.push(split("", "", vec![]), &[]);
        empty.finish("completed");
        assert!(empty.items().is_empty() && empty.take_events().is_empty());
    }
}
