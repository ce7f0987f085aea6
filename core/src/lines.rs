//! Newline framing of the backend's stdout with a maximum line length.

/// One framed line, or the news that one was skipped for being too long.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// A complete line without its `\n` (a trailing `\r` is left for the router to strip).
    Complete(&'a [u8]),
    /// A line longer than the maximum was discarded up to and including its newline.
    TooLong,
}

/// Splits a byte stream into lines. Memory stays under `max_line` plus one read chunk: an
/// oversized line is discarded as it streams past and reading resynchronises at the next
/// newline.
#[derive(Debug)]
pub struct LineFramer {
    buf: Vec<u8>,
    max_line: usize,
    discarding: bool,
}

impl LineFramer {
    /// A framer that skips lines longer than `max_line` bytes.
    pub fn new(max_line: usize) -> Self {
        LineFramer {
            buf: Vec::new(),
            max_line,
            discarding: false,
        }
    }

    /// Feeds the next chunk of bytes, calling `on_line` for each line it completes.
    pub fn push(&mut self, mut chunk: &[u8], mut on_line: impl FnMut(Line<'_>)) {
        while !chunk.is_empty() {
            match memchr::memchr(b'\n', chunk) {
                Some(nl) => {
                    let (head, rest) = (&chunk[..nl], &chunk[nl + 1..]);
                    chunk = rest;
                    if self.discarding {
                        self.discarding = false;
                        continue;
                    }
                    if self.buf.len() + head.len() > self.max_line {
                        self.buf.clear();
                        on_line(Line::TooLong);
                    } else if self.buf.is_empty() {
                        on_line(Line::Complete(head));
                    } else {
                        self.buf.extend_from_slice(head);
                        on_line(Line::Complete(&self.buf));
                        self.buf.clear();
                    }
                }
                None => {
                    if !self.discarding {
                        if self.buf.len() + chunk.len() > self.max_line {
                            self.buf = Vec::new();
                            self.discarding = true;
                            on_line(Line::TooLong);
                        } else {
                            self.buf.extend_from_slice(chunk);
                        }
                    }
                    chunk = &[];
                }
            }
        }
    }

    /// Feeds the next chunk and returns the lines it completes as owned buffers, a line
    /// that was too long as `None`: the batch a shell hands its loop in one message.
    pub fn push_batch(&mut self, chunk: &[u8]) -> Vec<Option<Vec<u8>>> {
        let mut batch = Vec::new();
        self.push(chunk, |line| {
            batch.push(match line {
                Line::Complete(bytes) => Some(bytes.to_vec()),
                Line::TooLong => None,
            })
        });
        batch
    }

    /// Bytes held for an unfinished line.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(framer: &mut LineFramer, chunks: &[&[u8]]) -> Vec<String> {
        let mut out = Vec::new();
        for c in chunks {
            framer.push(c, |l| {
                out.push(match l {
                    Line::Complete(b) => String::from_utf8_lossy(b).into_owned(),
                    Line::TooLong => "<too long>".into(),
                })
            });
        }
        out
    }

    #[test]
    fn frames_across_chunks_and_resyncs() {
        let mut f = LineFramer::new(5);
        let lines = collect(
            &mut f,
            &[
                b"ab",
                b"c\nde\r\n",
                b"0123456",
                b"789\nok\n",
                b"123456\nx\n",
            ],
        );
        assert_eq!(
            lines,
            ["abc", "de\r", "<too long>", "ok", "<too long>", "x"]
        );
        assert_eq!(f.buffered(), 0);
    }
}
