//! Splits a byte stream into complete JSON values, with bounded memory.
//!
//! SPDK writes JSON-RPC messages back to back with no delimiter (a reply to a
//! request without an id does not even end in a newline), so the only
//! reliable framing is the JSON grammar itself. Both ends of our JSON-RPC use
//! this crate: the client in `snap-csi` reads SPDK's replies with it, and the
//! SNAP emulator reads its clients' requests.
//!
//! A value is found in one pass over the bytes as they arrive: a small
//! scanner follows strings, escapes and nesting across reads, and only a
//! complete value is handed to serde_json, once. Re-parsing the whole buffer
//! after every read would cost time quadratic in the message size, which a
//! peer dribbling a large message could turn into a CPU sink.
//!
//! The scanner also enforces the [`Limits`]: a value that grows past
//! `max_message_bytes` or nests deeper than `max_depth` is an error as soon
//! as the offending byte is seen, so the buffer never holds more than one
//! value's limit plus one read. Whitespace between values is dropped as it is
//! scanned. After an error the stream cannot be resynchronised (neither can
//! SPDK's): the caller closes the connection.

use bytes::{Buf, BytesMut};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

/// How large and how deep one value may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_message_bytes: usize,
    pub max_depth: usize,
}

impl Limits {
    /// Sized for SPDK's replies. The largest we ask for is `bdev_get_bdevs`
    /// without a name: about 0.9 KiB per bdev in the v24.09 capture, up to 2
    /// KiB with an NVMe bdev's `driver_specific`, so 64 MiB is some 32,000
    /// bdevs, far past what one SNAP serves, and still a bound a node's
    /// memory limit survives. SPDK's deepest reply nests 7 levels; 64 leaves
    /// room and stays below serde_json's own recursion limit (128), so every
    /// value the framer accepts can also be decoded.
    pub const SPDK_REPLIES: Limits = Limits {
        max_message_bytes: 64 << 20,
        max_depth: 64,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::SPDK_REPLIES
    }
}

/// Why the bytes received can never become the next value.
#[derive(Debug, thiserror::Error)]
pub enum FramingError {
    #[error("not JSON: byte {byte:#04x} at offset {offset} of the stream cannot start a value")]
    NotJson { offset: u64, byte: u8 },
    #[error(
        "a JSON value starting at offset {offset} of the stream is larger than the limit of {limit} bytes"
    )]
    TooLarge { offset: u64, limit: usize },
    #[error(
        "a JSON value starting at offset {offset} of the stream nests deeper than the limit of {limit} levels"
    )]
    TooDeep { offset: u64, limit: usize },
    #[error("malformed JSON in the value at offset {offset} of the stream: {source}")]
    Malformed {
        offset: u64,
        #[source]
        source: serde_json::Error,
    },
}

/// Where the scanner is inside the value at the front of the buffer.
#[derive(Debug, Clone, Copy)]
enum Scan {
    /// Inside an object or array.
    Nested {
        depth: usize,
        in_string: bool,
        escaped: bool,
    },
    /// A string at the top level.
    String { escaped: bool },
    /// A number, `true`, `false` or `null` at the top level: it ends at the
    /// first byte that cannot continue it.
    Scalar,
}

/// Accumulates bytes and hands out each complete top-level JSON value.
#[derive(Debug, Default)]
pub struct JsonFramer {
    limits: Limits,
    buffer: BytesMut,
    /// `None` between values.
    scan: Option<Scan>,
    /// How many bytes at the front of `buffer` the scanner has seen.
    scanned: usize,
    /// Bytes taken off the stream before `buffer`, for error offsets.
    consumed: u64,
}

impl JsonFramer {
    pub fn new(limits: Limits) -> Self {
        JsonFramer {
            limits,
            ..JsonFramer::default()
        }
    }

    /// Appends bytes read from the socket.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// Bytes received but not yet returned as a complete value.
    pub fn pending(&self) -> usize {
        self.buffer.len()
    }

    /// Returns the next complete value's bytes (valid JSON and UTF-8), `None`
    /// when more bytes are needed, or an error when the stream can never
    /// continue.
    pub fn next_value(&mut self) -> Result<Option<Vec<u8>>, FramingError> {
        let Some((offset, frame)) = self.next_frame()? else {
            return Ok(None);
        };
        // A raw value, unlike `IgnoredAny`, checks that strings are UTF-8.
        match serde_json::from_slice::<&RawValue>(&frame) {
            Ok(_) => Ok(Some(frame.to_vec())),
            Err(source) => Err(FramingError::Malformed { offset, source }),
        }
    }

    /// Like [`JsonFramer::next_value`], also decoding the value as `T`; a
    /// value that is valid JSON but not a `T` is an error too.
    pub fn next_decoded<T: DeserializeOwned>(
        &mut self,
    ) -> Result<Option<(T, Vec<u8>)>, FramingError> {
        let Some((offset, frame)) = self.next_frame()? else {
            return Ok(None);
        };
        match serde_json::from_slice::<T>(&frame) {
            Ok(value) => Ok(Some((value, frame.to_vec()))),
            Err(source) => Err(FramingError::Malformed { offset, source }),
        }
    }

    /// Takes the next complete value's bytes off the buffer, with its offset
    /// in the stream.
    fn next_frame(&mut self) -> Result<Option<(u64, BytesMut)>, FramingError> {
        let Some(end) = self.find_end()? else {
            return Ok(None);
        };
        let offset = self.consumed;
        self.consumed += end as u64;
        self.scan = None;
        self.scanned = 0;
        Ok(Some((offset, self.buffer.split_to(end))))
    }

    /// The length of the value at the front of the buffer once it is complete.
    fn find_end(&mut self) -> Result<Option<usize>, FramingError> {
        let scan = match &mut self.scan {
            Some(scan) => scan,
            None => {
                let blank = self
                    .buffer
                    .iter()
                    .take_while(|b| is_json_whitespace(**b))
                    .count();
                self.buffer.advance(blank);
                self.consumed += blank as u64;
                let Some(&first) = self.buffer.first() else {
                    return Ok(None);
                };
                self.scanned = 1;
                self.scan.insert(match first {
                    b'{' | b'[' => Scan::Nested {
                        depth: 1,
                        in_string: false,
                        escaped: false,
                    },
                    b'"' => Scan::String { escaped: false },
                    b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => Scan::Scalar,
                    byte => {
                        return Err(FramingError::NotJson {
                            offset: self.consumed,
                            byte,
                        });
                    }
                })
            }
        };
        // Scanning past the limit is wasted work: stop there and report it.
        let limit = self.limits.max_message_bytes;
        let bytes = &self.buffer[..self.buffer.len().min(limit.saturating_add(1))];
        let end = scan
            .advance(bytes, &mut self.scanned, self.limits.max_depth)
            .map_err(|limit| FramingError::TooDeep {
                offset: self.consumed,
                limit,
            })?;
        if end.unwrap_or(self.scanned) > limit {
            return Err(FramingError::TooLarge {
                offset: self.consumed,
                limit,
            });
        }
        Ok(end)
    }
}

impl Scan {
    /// Scans `bytes[*scanned..]`; the value's length if it ends among them,
    /// or `Err(max_depth)` when it nests deeper.
    fn advance(
        &mut self,
        bytes: &[u8],
        scanned: &mut usize,
        max_depth: usize,
    ) -> Result<Option<usize>, usize> {
        while let Some(&byte) = bytes.get(*scanned) {
            let at = *scanned;
            *scanned += 1;
            match self {
                Scan::String { escaped } => {
                    if string_ends(escaped, byte) {
                        return Ok(Some(at + 1));
                    }
                }
                Scan::Scalar => {
                    if !(byte.is_ascii_alphanumeric() || matches!(byte, b'+' | b'-' | b'.')) {
                        return Ok(Some(at));
                    }
                }
                Scan::Nested {
                    depth,
                    in_string,
                    escaped,
                } => {
                    if *in_string {
                        *in_string = !string_ends(escaped, byte);
                        continue;
                    }
                    match byte {
                        b'"' => *in_string = true,
                        b'{' | b'[' => {
                            *depth += 1;
                            if *depth > max_depth {
                                return Err(max_depth);
                            }
                        }
                        b'}' | b']' => {
                            *depth -= 1;
                            if *depth == 0 {
                                return Ok(Some(at + 1));
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        Ok(None)
    }
}

/// JSON's four whitespace bytes (not Rust's `is_ascii_whitespace`, which
/// also takes form feed).
fn is_json_whitespace(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// Whether `byte` closes a string, given whether the byte before it escaped it.
fn string_ends(escaped: &mut bool, byte: u8) -> bool {
    if *escaped {
        *escaped = false;
        return false;
    }
    match byte {
        b'\\' => {
            *escaped = true;
            false
        }
        b'"' => true,
        _ => false,
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
        framer.extend(br#"{"jsonrpc":"2.0","id":null,"result":1}{"jsonrpc":"2.0","id":20,"result":{"a":"}{\"]"}}"#);
        framer.extend(b"\n 7 \"top\" true\n");
        assert_eq!(
            drain(&mut framer),
            [
                r#"{"jsonrpc":"2.0","id":null,"result":1}"#,
                r#"{"jsonrpc":"2.0","id":20,"result":{"a":"}{\"]"}}"#,
                "7",
                r#""top""#,
                "true",
            ]
        );
        assert_eq!(framer.pending(), 0);
    }

    #[test]
    fn decodes_each_value_as_it_frames_it() {
        #[derive(Debug, serde::Deserialize)]
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
        let error = framer.next_decoded::<Id>().unwrap_err();
        assert!(
            matches!(error, FramingError::Malformed { offset: 22, .. }),
            "{error}"
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for garbage in [
            &b"hello world\n"[..],
            b"{\"a\":}",
            b"}",
            b"\xff\xfe",
            b"[1,,2]",
            b"{\"a\":1]",
            b"\"\xff\"",
            b"\x0c{}",
        ] {
            let mut framer = JsonFramer::default();
            framer.extend(garbage);
            assert!(framer.next_value().is_err(), "{garbage:?}");
        }
    }

    #[test]
    fn errors_say_where_and_which_limit() {
        let limits = Limits {
            max_message_bytes: 16,
            max_depth: 3,
        };
        let mut framer = JsonFramer::new(limits);
        framer.extend(b"{}  [[[[");
        assert_eq!(framer.next_value().unwrap().unwrap(), b"{}");
        assert_eq!(
            framer.next_value().unwrap_err().to_string(),
            "a JSON value starting at offset 4 of the stream nests deeper than the limit of 3 levels"
        );
        let mut framer = JsonFramer::new(limits);
        framer.extend(br#"{"a":"0123456789abcdef"#);
        assert_eq!(
            framer.next_value().unwrap_err().to_string(),
            "a JSON value starting at offset 0 of the stream is larger than the limit of 16 bytes"
        );
        let mut framer = JsonFramer::new(limits);
        framer.extend(b"\n\x00");
        assert_eq!(
            framer.next_value().unwrap_err().to_string(),
            "not JSON: byte 0x00 at offset 1 of the stream cannot start a value"
        );
    }

    #[test]
    fn a_value_exactly_at_the_limits_is_accepted() {
        let value = br#"[[[{"a":"0123"}]]]"#;
        let mut framer = JsonFramer::new(Limits {
            max_message_bytes: value.len(),
            max_depth: 4,
        });
        framer.extend(value);
        assert_eq!(framer.next_value().unwrap().unwrap(), value);
    }
}
