/// Splits a server-sent-event byte stream into the `data` payloads of whole events, however the
/// network cuts it into chunks.
#[derive(Default)]
pub struct SseBuffer {
    pending: Vec<u8>,
}

impl SseBuffer {
    /// Adds received bytes; returns the data of every event they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = find_event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..end.content).collect();
            self.pending.drain(..end.separator);
            let data = String::from_utf8_lossy(&event)
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect::<Vec<_>>()
                .join("\n");
            if !data.is_empty() {
                events.push(data);
            }
        }
        events
    }
}

struct EventEnd {
    content: usize,
    separator: usize,
}

/// Events end with a blank line; servers write it as `\n\n` or `\r\n\r\n`.
fn find_event_end(bytes: &[u8]) -> Option<EventEnd> {
    for (i, window) in bytes.windows(2).enumerate() {
        if window == b"\n\n" {
            return Some(EventEnd {
                content: i,
                separator: 2,
            });
        }
        if bytes[i..].starts_with(b"\r\n\r\n") {
            return Some(EventEnd {
                content: i,
                separator: 4,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_events_split_across_chunks() {
        let mut sse = SseBuffer::default();
        assert!(sse.push(b"data: {\"a\"").is_empty());
        assert_eq!(sse.push(b":1}\n\ndata: [DONE]\r\n\r\n"), vec!["{\"a\":1}", "[DONE]"]);
    }

    #[test]
    fn skips_comments_and_keeps_multiline_data() {
        let mut sse = SseBuffer::default();
        assert_eq!(sse.push(b": ping\n\ndata: a\ndata: b\n\n"), vec!["a\nb"]);
    }
}
