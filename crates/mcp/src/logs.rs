//! What a server writes for people (stderr lines, `notifications/message`) goes to
//! tracing, bounded: a server must not be able to flood the gateway's logs.

use std::time::Duration;

use tokio::time::Instant;

/// Longest line logged, in bytes; the rest of a longer line is dropped.
pub(crate) const MAX_LINE_BYTES: usize = 2048;
/// Most lines logged per server in one [`WINDOW`].
pub(crate) const LINES_PER_WINDOW: u32 = 100;
/// The window of [`LINES_PER_WINDOW`].
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// How many lines a server may log now: [`LINES_PER_WINDOW`] per [`WINDOW`], and a count
/// of the ones dropped, reported when the next window opens.
#[derive(Debug)]
pub(crate) struct Budget {
    window_start: Instant,
    used: u32,
    dropped: u64,
}

/// Whether a line may be logged, and how many were dropped before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Log it; `dropped` lines were left out since the last one logged.
    Yes { dropped: u64 },
    /// Drop it.
    No,
}

impl Budget {
    pub(crate) fn new(now: Instant) -> Budget {
        Budget {
            window_start: now,
            used: 0,
            dropped: 0,
        }
    }

    pub(crate) fn admit(&mut self, now: Instant) -> Admit {
        if now.saturating_duration_since(self.window_start) >= WINDOW {
            self.window_start = now;
            self.used = 0;
        }
        if self.used >= LINES_PER_WINDOW {
            self.dropped += 1;
            return Admit::No;
        }
        self.used += 1;
        let dropped = std::mem::take(&mut self.dropped);
        Admit::Yes { dropped }
    }
}

/// Splits a byte stream into lines of at most [`MAX_LINE_BYTES`] bytes, whatever the
/// chunks it arrives in; the tail of a longer line is dropped.
#[derive(Debug, Default)]
pub(crate) struct Lines {
    partial: Vec<u8>,
    cut: bool,
}

impl Lines {
    /// Feeds `chunk`; calls `line` with every line it completes (without the newline)
    /// and whether that line was cut.
    pub(crate) fn push(&mut self, chunk: &[u8], mut line: impl FnMut(&[u8], bool)) {
        for piece in chunk.split_inclusive(|b| *b == b'\n') {
            let (text, ends) = match piece.strip_suffix(b"\n") {
                Some(text) => (text, true),
                None => (piece, false),
            };
            let room = MAX_LINE_BYTES.saturating_sub(self.partial.len());
            if text.len() > room {
                self.cut = true;
            }
            self.partial
                .extend_from_slice(&text[..text.len().min(room)]);
            if ends {
                let full = self.partial.strip_suffix(b"\r").unwrap_or(&self.partial);
                line(full, self.cut);
                self.partial.clear();
                self.cut = false;
            }
        }
    }

    /// The unfinished last line, if any (at the end of the stream).
    pub(crate) fn finish(&mut self, mut line: impl FnMut(&[u8], bool)) {
        if !self.partial.is_empty() {
            line(&self.partial, self.cut);
            self.partial.clear();
            self.cut = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_survive_any_chunking_and_long_lines_are_cut() {
        let mut lines = Lines::default();
        let mut seen: Vec<(String, bool)> = Vec::new();
        let long = "y".repeat(MAX_LINE_BYTES + 10);
        let text = format!("one\r\ntw{}o\n{long}\nlast", "");
        for chunk in text.as_bytes().chunks(3) {
            lines.push(chunk, |line, cut| {
                seen.push((String::from_utf8_lossy(line).into_owned(), cut));
            });
        }
        lines.finish(|line, cut| seen.push((String::from_utf8_lossy(line).into_owned(), cut)));
        assert_eq!(seen.len(), 4);
        assert_eq!(seen[0], ("one".to_owned(), false));
        assert_eq!(seen[1], ("two".to_owned(), false));
        assert_eq!(seen[2].0.len(), MAX_LINE_BYTES);
        assert!(seen[2].1);
        assert_eq!(seen[3], ("last".to_owned(), false));
    }

    #[test]
    fn the_budget_drops_a_flood_and_says_how_much() {
        let start = Instant::now();
        let mut budget = Budget::new(start);
        for _ in 0..LINES_PER_WINDOW {
            assert_eq!(budget.admit(start), Admit::Yes { dropped: 0 });
        }
        for _ in 0..5 {
            assert_eq!(budget.admit(start + Duration::from_secs(1)), Admit::No);
        }
        assert_eq!(budget.admit(start + WINDOW), Admit::Yes { dropped: 5 });
        assert_eq!(budget.admit(start + WINDOW), Admit::Yes { dropped: 0 });
    }
}
