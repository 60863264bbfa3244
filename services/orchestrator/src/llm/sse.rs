//! A Server-Sent Events reader over a byte stream.

use bytes::Bytes;
use futures::{Stream, StreamExt};

/// One SSE event.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct SseEvent {
    /// The `event:` field.
    pub event: String,
    /// The joined `data:` lines.
    pub data: String,
}

/// Splits a byte stream into SSE events.
pub struct SseReader<S> {
    inner: S,
    buf: Vec<u8>,
    done: bool,
}

impl<S, E> SseReader<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    /// Wraps a body stream.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            done: false,
        }
    }

    /// The next event; Ok(None) at a clean end of stream; the body's own
    /// error when the transport fails.
    pub async fn next_event(&mut self) -> Result<Option<SseEvent>, E> {
        loop {
            if let Some(ev) = self.take_event() {
                return Ok(Some(ev));
            }
            if self.done {
                // A final event without the blank line.
                if self.buf.iter().any(|b| !b.is_ascii_whitespace()) {
                    self.buf.extend_from_slice(b"\n\n");
                    continue;
                }
                return Ok(None);
            }
            match self.inner.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => return Err(e),
                None => self.done = true,
            }
        }
    }

    fn take_event(&mut self) -> Option<SseEvent> {
        loop {
            let (pos, len) = find_blank_line(&self.buf)?;
            let raw: Vec<u8> = self.buf.drain(..pos + len).collect();
            let text = String::from_utf8_lossy(&raw[..pos]);
            let mut ev = SseEvent::default();
            let mut data = Vec::new();
            for line in text.lines() {
                if line.starts_with(':') {
                    continue;
                }
                let (field, value) = match line.split_once(':') {
                    Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                    None => (line, ""),
                };
                match field {
                    "event" => ev.event = value.to_owned(),
                    "data" => data.push(value.to_owned()),
                    _ => {}
                }
            }
            if data.is_empty() && ev.event.is_empty() {
                continue;
            }
            ev.data = data.join("\n");
            return Some(ev);
        }
    }
}

fn find_blank_line(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' && buf[i + 1] == b'\n' {
            return Some((i, 2));
        }
        if i + 3 < buf.len() && &buf[i..i + 4] == b"\r\n\r\n" {
            return Some((i, 4));
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn splits_events_across_chunks() {
        let chunks: Vec<Result<Bytes, String>> = vec![
            Ok(Bytes::from("event: a\nda")),
            Ok(Bytes::from(
                "ta: 1\n\n: comment\n\ndata: x\r\n\r\ndata: last",
            )),
        ];
        let mut r = SseReader::new(futures::stream::iter(chunks));
        assert_eq!(
            r.next_event().await.unwrap().unwrap(),
            SseEvent {
                event: "a".into(),
                data: "1".into()
            }
        );
        assert_eq!(r.next_event().await.unwrap().unwrap().data, "x");
        assert_eq!(r.next_event().await.unwrap().unwrap().data, "last");
        assert!(r.next_event().await.unwrap().is_none());
    }
}
