//! Stop strings over streamed text. Text that could be the beginning of a stop string is held
//! back until the next text settles it, so nothing a client has been sent is ever taken back,
//! and a stop string split across tokens is still found. When the stop string stays in the
//! text (vLLM's `include_stop_str_in_output`), nothing needs holding back: text goes out at
//! once, and its tail is kept only to find a stop string that it begins.

pub struct StopChecker {
    stops: Vec<String>,
    /// Cut the text after the stop string instead of before it.
    keep_stop: bool,
    /// Text not yet known to be free of stop strings; its first `sent` bytes went out already.
    held: String,
    sent: usize,
}

impl StopChecker {
    pub fn new(stops: Vec<String>, keep_stop: bool) -> Self {
        Self {
            stops,
            keep_stop,
            held: String::new(),
            sent: 0,
        }
    }

    /// Adds newly decoded text. Returns the text that is now safe to send and, when a stop
    /// string appeared, that string (the text is cut just before it, or just after it with
    /// `keep_stop`; nothing more follows).
    pub fn push(&mut self, text: &str) -> (String, Option<String>) {
        self.held.push_str(text);
        // A stop string longer than the held text cannot be in it; skipping those first keeps
        // thousands of long stop strings from costing a search each per token.
        let held = &self.held;
        let first = self
            .stops
            .iter()
            .filter(|s| s.len() <= held.len())
            .filter_map(|s| held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at);
        if let Some((at, stop)) = first {
            let stop = stop.clone();
            // A stop string ends in new text: the sent tail held none.
            let end = if self.keep_stop { at + stop.len() } else { at };
            let out = self.held[self.sent.min(end)..end].to_string();
            self.held.clear();
            self.sent = 0;
            return (out, Some(stop));
        }
        let tail = self.held.len() - self.partial_stop_len();
        let out = match self.keep_stop {
            true => self.held[self.sent..].to_string(),
            false => self.held[..tail].to_string(),
        };
        self.held.drain(..tail);
        self.sent = if self.keep_stop { self.held.len() } else { 0 };
        (out, None)
    }

    /// Whatever is still held back, once generation ended without a stop string.
    pub fn flush(&mut self) -> String {
        let out = self.held[self.sent..].to_string();
        self.held.clear();
        self.sent = 0;
        out
    }

    /// Length of the longest tail of the held text that is a proper prefix of a stop string.
    /// Only prefixes up to the held text's length can be one, so the work per stop string
    /// follows the held text (a token or two), not the stop string's length.
    fn partial_stop_len(&self) -> usize {
        let held = self.held.as_bytes();
        self.stops
            .iter()
            .filter_map(|s| {
                let longest = s.len().saturating_sub(1).min(held.len());
                (1..=longest)
                    .rev()
                    .find(|k| s.is_char_boundary(*k) && held.ends_with(&s.as_bytes()[..*k]))
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, Option<String>) {
        run_keeping(false, stops, pieces)
    }

    fn run_keeping(keep_stop: bool, stops: &[&str], pieces: &[&str]) -> (Vec<String>, Option<String>) {
        let mut checker = StopChecker::new(stops.iter().map(|s| s.to_string()).collect(), keep_stop);
        let mut sent = Vec::new();
        for piece in pieces {
            let (out, stop) = checker.push(piece);
            sent.push(out);
            if stop.is_some() {
                return (sent, stop);
            }
        }
        sent.push(checker.flush());
        (sent, None)
    }

    #[test]
    fn passes_text_through_without_stops() {
        assert_eq!(run(&[], &["ab", "c"]), (vec!["ab".into(), "c".into(), "".into()], None));
    }

    #[test]
    fn cuts_before_a_stop_split_across_pieces() {
        let (sent, stop) = run(&["END"], &["abc E", "N", "D more"]);
        assert_eq!(sent, vec!["abc ", "", ""]);
        assert_eq!(stop.as_deref(), Some("END"));
    }

    #[test]
    fn releases_held_text_when_the_stop_does_not_follow() {
        let (sent, stop) = run(&["END"], &["abc E", "X"]);
        assert_eq!(sent, vec!["abc ", "EX", ""]);
        assert_eq!(stop, None);
        let (sent, _) = run(&["END"], &["xyEN"]);
        assert_eq!(sent.concat(), "xyEN");
    }

    #[test]
    fn the_earliest_stop_wins() {
        let (sent, stop) = run(&["c", "ab"], &["xxabc"]);
        assert_eq!(sent, vec!["xx"]);
        assert_eq!(stop.as_deref(), Some("ab"));
    }

    #[test]
    fn keeping_the_stop_cuts_after_it_and_holds_nothing_back() {
        let (sent, stop) = run_keeping(true, &["END"], &["abc E", "N", "D more"]);
        assert_eq!(sent, vec!["abc E", "N", "D"]);
        assert_eq!(stop.as_deref(), Some("END"));
        let (sent, stop) = run_keeping(true, &["END"], &["abc E", "X", "END"]);
        assert_eq!(sent, vec!["abc E", "X", "END"]);
        assert_eq!(stop.as_deref(), Some("END"));
        let (sent, stop) = run_keeping(true, &["END"], &["E", "N"]);
        assert_eq!(sent, vec!["E", "N", ""]);
        assert_eq!(stop, None);
        let (sent, stop) = run_keeping(true, &["c", "ab"], &["xxabc"]);
        assert_eq!(sent, vec!["xxab"]);
        assert_eq!(stop.as_deref(), Some("ab"));
    }

    #[test]
    fn holds_back_only_on_character_boundaries() {
        let (sent, stop) = run(&["é!"], &["caf", "é", "?"]);
        assert_eq!(sent, vec!["caf", "", "é?", ""]);
        assert_eq!(stop, None);
    }

    /// A long stop string is found piece by piece, and held text is released as soon as it
    /// stops being a prefix of one, whatever the other stop strings' lengths.
    #[test]
    fn long_stop_strings_are_matched_across_many_pieces() {
        let long = "a".repeat(1000) + "b";
        let mut stops = vec![long.clone(), "END".to_string()];
        stops.extend((0..100).map(|i| format!("{i}").repeat(300)));
        let stops: Vec<&str> = stops.iter().map(String::as_str).collect();
        let mut pieces = vec!["x"];
        pieces.extend(std::iter::repeat_n("aa", 500));
        pieces.push("b tail");
        let (sent, stop) = run(&stops, &pieces);
        assert_eq!(sent.concat(), "x");
        assert_eq!(stop.as_deref(), Some(long.as_str()));
        let (sent, stop) = run(&stops, &["aaaa", "aE", "N", "D"]);
        assert_eq!(sent, vec!["", "aaaaa", "", ""]);
        assert_eq!(stop.as_deref(), Some("END"));
    }
}
