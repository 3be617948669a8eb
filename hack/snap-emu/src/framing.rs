//! SPDK's JSON-RPC framing, byte for byte (see `spdk-v24.09-wire.txt`).
//!
//! Requests are JSON values written back to back with no delimiter, so the
//! reader is the same streaming framer our client uses (`json-framing`, the
//! one crate of ours the emulator links): complete values are taken off the
//! front, an incomplete tail waits for more bytes, and anything that can never
//! become JSON ends the connection without a reply (SPDK cannot resynchronise
//! a stream either).
//!
//! Replies are compact JSON followed by `\n`, with two quirks of v24.09 kept on
//! purpose because clients must survive them: a *result* for a request without
//! an id (or with `"id":null`) loses its closing brace and newline, and every
//! non-ASCII character in a string is written as an uppercase `\uXXXX` escape.

use std::io;

use json_framing::Limits;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::rpc::RpcError;

/// How much a connection's reader takes from its socket at a time.
pub(crate) const READ_CHUNK: usize = 64 * 1024;

/// SPDK gives up on a connection whose unparsed input outgrows its buffer; we
/// do the same, with a limit far above any real request, so that no client can
/// make us buffer without bound.
pub(crate) const REQUEST_LIMITS: Limits = Limits {
    max_message_bytes: 4 << 20,
    ..Limits::SPDK_REPLIES
};

/// One request as SPDK's `parse_single_request` sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Frame {
    Call {
        /// The id already encoded for the reply; `None` for absent or null.
        id: Option<String>,
        method: String,
        /// `None` when absent or JSON null ("as if there were no parameters").
        params: Option<Value>,
    },
    /// Answered with -32600; the id is known only if it was checked before the fault.
    Invalid { id: Option<String> },
}

fn capture<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    // Taking the raw value (rather than Option<T>) keeps an explicit `null`
    // distinguishable from an absent member, as SPDK's decoder does.
    <&RawValue>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope<'a> {
    #[serde(borrow, default, deserialize_with = "capture")]
    jsonrpc: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "capture")]
    method: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "capture")]
    params: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "capture")]
    id: Option<&'a RawValue>,
}

/// Classifies one complete JSON value, checking in SPDK's order.
pub(crate) fn parse_frame(raw: &str) -> Frame {
    let invalid = Frame::Invalid { id: None };
    if !raw.starts_with('{') {
        // Batch arrays and bare scalars alike: "Invalid request", id null.
        return invalid;
    }
    let Ok(env) = serde_json::from_str::<Envelope>(raw) else {
        return invalid;
    };
    if let Some(v) = env.jsonrpc
        && serde_json::from_str::<String>(v.get()).ok().as_deref() != Some("2.0")
    {
        return invalid;
    }
    let Some(method) = env
        .method
        .and_then(|m| serde_json::from_str::<String>(m.get()).ok())
    else {
        return invalid;
    };
    let id = match env.id {
        None => None,
        Some(raw_id) => match encode_id(raw_id.get()) {
            IdCheck::Null => None,
            IdCheck::Id(s) => Some(s),
            IdCheck::Bad => return invalid,
        },
    };
    let params = match env.params {
        None => None,
        Some(p) if p.get() == "null" => None,
        Some(p) if p.get().starts_with('{') || p.get().starts_with('[') => {
            match serde_json::from_str::<Value>(p.get()) {
                Ok(v) => Some(v),
                Err(_) => return Frame::Invalid { id },
            }
        }
        Some(_) => return Frame::Invalid { id },
    };
    Frame::Call { id, method, params }
}

enum IdCheck {
    Null,
    Id(String),
    Bad,
}

fn encode_id(raw: &str) -> IdCheck {
    match raw.as_bytes().first() {
        Some(b'n') => IdCheck::Null,
        // SPDK echoes a number token verbatim.
        Some(b'-' | b'0'..=b'9') => IdCheck::Id(raw.to_owned()),
        // ... but re-encodes a string from its decoded value.
        Some(b'"') => match serde_json::from_str::<String>(raw) {
            Ok(s) => IdCheck::Id(to_json(&Value::String(s))),
            Err(_) => IdCheck::Bad,
        },
        _ => IdCheck::Bad,
    }
}

/// The reply to a successful call.
pub(crate) fn result_reply(id: Option<&str>, body: &str) -> Vec<u8> {
    match id {
        Some(id) => format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{body}}}\n").into_bytes(),
        // v24.09's skip_response path: the object is never closed and no newline follows.
        None => format!("{{\"jsonrpc\":\"2.0\",\"id\":null,\"result\":{body}").into_bytes(),
    }
}

/// The reply to a failed call; errors always go through end_response, so they are complete.
pub(crate) fn error_reply(id: Option<&str>, err: &RpcError) -> Vec<u8> {
    let message = to_json(&Value::String(err.message.clone()));
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{},\"error\":{{\"code\":{},\"message\":{message}}}}}\n",
        id.unwrap_or("null"),
        err.code
    )
    .into_bytes()
}

/// Serialises like `spdk_json_write_*`: compact, printable ASCII kept as is,
/// everything else escaped as uppercase `\uXXXX` (UTF-16 for astral planes).
pub(crate) fn to_json(v: &(impl serde::Serialize + ?Sized)) -> String {
    let mut out = Vec::with_capacity(128);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, SpdkFormatter);
    if v.serialize(&mut ser).is_err() {
        // Serialising into memory fails only on a map with non-string keys,
        // which no result has; keep the reply valid anyway.
        return "null".to_owned();
    }
    String::from_utf8(out).unwrap_or_else(|_| "null".to_owned())
}

struct SpdkFormatter;

impl serde_json::ser::Formatter for SpdkFormatter {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let bytes = fragment.as_bytes();
        let mut start = 0;
        for (i, ch) in fragment.char_indices() {
            if (' '..='~').contains(&ch) {
                continue;
            }
            writer.write_all(&bytes[start..i])?;
            let mut units = [0u16; 2];
            for unit in ch.encode_utf16(&mut units) {
                write!(writer, "\\u{unit:04X}")?;
            }
            start = i + ch.len_utf8();
        }
        writer.write_all(&bytes[start..])
    }

    fn write_char_escape<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        char_escape: serde_json::ser::CharEscape,
    ) -> io::Result<()> {
        use serde_json::ser::CharEscape::*;
        let s: &[u8] = match char_escape {
            Quote => b"\\\"",
            ReverseSolidus => b"\\\\",
            Solidus => b"/",
            Backspace => b"\\b",
            FormFeed => b"\\f",
            LineFeed => b"\\n",
            CarriageReturn => b"\\r",
            Tab => b"\\t",
            AsciiControl(byte) => return write!(writer, "\\u{:04X}", byte),
        };
        writer.write_all(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn frames_follow_spdk_rules() {
        let f = parse_frame(r#"{"method":"m","id":"x\u00e9"}"#);
        assert_eq!(
            f,
            Frame::Call {
                id: Some("\"x\\u00E9\"".into()),
                method: "m".into(),
                params: None
            }
        );
        assert_eq!(
            parse_frame(r#"[{"method":"m","id":1}]"#),
            Frame::Invalid { id: None }
        );
        assert_eq!(
            parse_frame(r#"{"method":"m","id":1,"extra":1}"#),
            Frame::Invalid { id: None }
        );
        assert_eq!(
            parse_frame(r#"{"jsonrpc":"1.0","method":"m","id":1}"#),
            Frame::Invalid { id: None }
        );
        assert_eq!(
            parse_frame(r#"{"method":"m","id":7,"params":3}"#),
            Frame::Invalid {
                id: Some("7".into())
            }
        );
        assert_eq!(
            parse_frame(r#"{"method":"m","id":null,"params":null}"#),
            Frame::Call {
                id: None,
                method: "m".into(),
                params: None
            }
        );
        assert_eq!(
            parse_frame(r#"{"method":"m","id":{}}"#),
            Frame::Invalid { id: None }
        );
    }

    #[test]
    fn replies_match_the_transcript() {
        let v = json!({"version":"SPDK v24.09"});
        assert_eq!(
            result_reply(Some("1"), &to_json(&v)),
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"version\":\"SPDK v24.09\"}}\n"
        );
        assert_eq!(
            result_reply(None, &to_json(&v)),
            b"{\"jsonrpc\":\"2.0\",\"id\":null,\"result\":{\"version\":\"SPDK v24.09\"}"
        );
        assert_eq!(
            error_reply(None, &RpcError::invalid_request()),
            b"{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32600,\"message\":\"Invalid request\"}}\n"
        );
    }

    #[test]
    fn strings_are_escaped_like_spdk() {
        assert_eq!(
            to_json(&json!("a/b\u{7f}\u{1}\n\"é😀")),
            "\"a/b\\u007F\\u0001\\n\\\"\\u00E9\\uD83D\\uDE00\""
        );
    }
}
