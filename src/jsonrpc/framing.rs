//! Splits a byte stream into complete JSON values.
//!
//! SPDK writes each reply as one JSON value and usually, but not always, a
//! newline after it (a reply to a request without an id has none). Nothing
//! else delimits messages, so the only reliable framing is the JSON grammar
//! itself: a value is complete when a streaming parser finishes it.

use bytes::{Buf, BytesMut};
use serde::de::DeserializeOwned;

/// Why the bytes received so far cannot be a JSON value stream.
#[derive(Debug, thiserror::Error)]
#[error("malformed JSON from the server at byte {offset}: {source}")]
pub struct FramingError {
    offset: usize,
    #[source]
    source: serde_json::Error,
}

/// Accumulates bytes and hands out each complete top-level JSON value.
#[derive(Debug, Default)]
pub struct JsonFramer {
    buffer: BytesMut,
}

impl JsonFramer {
    /// Appends bytes read from the socket.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// Bytes received but not yet returned as a complete value (whitespace
    /// between values included).
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }

    /// Returns the next complete value's bytes, `None` when more bytes are needed,
    /// or an error when the buffered bytes can never become valid JSON.
    pub fn next_value(&mut self) -> Result<Option<Vec<u8>>, FramingError> {
        Ok(self
            .next_decoded::<serde::de::IgnoredAny>()?
            .map(|(_, bytes)| bytes))
    }

    /// Like [`JsonFramer::next_value`], also decoding the value as `T` in the
    /// same pass over the bytes; a value that is valid JSON but not a `T` is
    /// an error too.
    pub fn next_decoded<T: DeserializeOwned>(
        &mut self,
    ) -> Result<Option<(T, Vec<u8>)>, FramingError> {
        let leading = self
            .buffer
            .iter()
            .take_while(|b| b.is_ascii_whitespace())
            .count();
        self.buffer.advance(leading);
        if self.buffer.is_empty() {
            return Ok(None);
        }
        let mut values = serde_json::Deserializer::from_slice(&self.buffer).into_iter::<T>();
        match values.next() {
            Some(Ok(value)) => {
                let end = values.byte_offset();
                Ok(Some((value, self.buffer.split_to(end).to_vec())))
            }
            Some(Err(e)) if e.is_eof() => Ok(None),
            Some(Err(source)) => Err(FramingError {
                offset: values.byte_offset(),
                source,
            }),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(framer: &mut JsonFramer) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(v) = framer.next_value().unwrap() {
            out.push(String::from_utf8(v).unwrap());
        }
        out
    }

    #[test]
    fn splits_concatenated_values_with_and_without_newlines() {
        let mut framer = JsonFramer::default();
        // The SPDK v24.09 capture: a null-id reply has no newline, the next one does.
        framer.extend(br#"{"jsonrpc":"2.0","id":null,"result":1}{"jsonrpc":"2.0","id":20,"result":{"a":"}{"}}"#);
        framer.extend(b"\n");
        assert_eq!(
            drain(&mut framer),
            [
                r#"{"jsonrpc":"2.0","id":null,"result":1}"#,
                r#"{"jsonrpc":"2.0","id":20,"result":{"a":"}{"}}"#
            ]
        );
        assert_eq!(framer.pending(), 0);
    }

    #[test]
    fn waits_for_a_value_split_at_any_byte() {
        let whole =
            br#"{"jsonrpc":"2.0","id":7,"result":[{"name":"Malloc0","num_blocks":131072}]}"#;
        for cut in 1..whole.len() {
            let mut framer = JsonFramer::default();
            framer.extend(&whole[..cut]);
            assert!(framer.next_value().unwrap().is_none(), "cut at {cut}");
            framer.extend(&whole[cut..]);
            assert_eq!(framer.next_value().unwrap().unwrap(), whole.to_vec());
        }
    }

    #[test]
    fn decodes_each_value_as_it_frames_it() {
        #[derive(serde::Deserialize)]
        struct Id {
            id: u64,
        }
        let mut framer = JsonFramer::default();
        framer.extend(br#"{"id":3,"result":"x"} {"id":"#);
        let (value, bytes) = framer.next_decoded::<Id>().unwrap().unwrap();
        assert_eq!(
            (value.id, &bytes[..]),
            (3, &br#"{"id":3,"result":"x"}"#[..])
        );
        assert!(framer.next_decoded::<Id>().unwrap().is_none());
        framer.extend(br#""three"}"#);
        assert!(framer.next_decoded::<Id>().is_err());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for garbage in [
            &b"hello world\n"[..],
            b"{\"a\":}",
            b"}",
            b"\xff\xfe",
            b"[1,,2]",
        ] {
            let mut framer = JsonFramer::default();
            framer.extend(garbage);
            assert!(framer.next_value().is_err(), "{garbage:?}");
        }
    }
}
