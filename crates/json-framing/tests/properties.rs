//! Properties of the framer over generated streams: valid messages come back
//! exactly however the stream is cut, and no input, however hostile, panics
//! it or makes it hold more than one value's limit.

use json_framing::{FramingError, JsonFramer, Limits};
use proptest::prelude::*;
use serde_json::{Value, json};

/// Any JSON value, with strings that stress the scanner (quotes, escapes,
/// brackets, control characters and non-ASCII).
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(Value::from),
        any::<String>().prop_map(Value::from),
        "[\"\\\\{}\\[\\]:,a\u{e9}\u{1f600}\n\t]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            prop::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// JSON-RPC replies as SPDK writes them: compact or pretty (whitespace inside
/// the value), separated by nothing, a newline or other JSON whitespace.
fn reply_stream() -> impl Strategy<Value = (Vec<String>, Vec<u8>)> {
    let reply = (any::<u32>(), any_json(), any::<bool>()).prop_map(|(id, result, pretty)| {
        let reply = json!({"jsonrpc": "2.0", "id": id, "result": result});
        if pretty {
            serde_json::to_string_pretty(&reply).unwrap()
        } else {
            reply.to_string()
        }
    });
    prop::collection::vec((reply, "[ \t\r\n]{0,3}"), 1..4).prop_map(|parts| {
        let mut stream = Vec::new();
        let mut replies = Vec::new();
        for (reply, gap) in parts {
            stream.extend_from_slice(reply.as_bytes());
            stream.extend_from_slice(gap.as_bytes());
            replies.push(reply);
        }
        (replies, stream)
    })
}

/// Feeds `chunks` one at a time, taking every value after each; stops at
/// the first error. Checks the memory bound on the way.
fn feed<'a>(
    framer: &mut JsonFramer,
    limits: Limits,
    chunks: impl IntoIterator<Item = &'a [u8]>,
) -> (Vec<Vec<u8>>, Option<FramingError>) {
    let mut frames = Vec::new();
    for chunk in chunks {
        framer.extend(chunk);
        loop {
            match framer.next_value() {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(error) => return (frames, Some(error)),
            }
        }
        // Waiting for more is only ever waiting inside one value under the limit.
        assert!(
            framer.pending() <= limits.max_message_bytes,
            "{} bytes held",
            framer.pending()
        );
    }
    (frames, None)
}

/// Cuts `bytes` into pieces of the given sizes (cycled), the last one whatever is left.
fn chunked<'a>(bytes: &'a [u8], sizes: &'a [usize]) -> impl Iterator<Item = &'a [u8]> {
    let mut rest = bytes;
    let mut sizes = sizes.iter().cycle();
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let take = sizes
            .next()
            .copied()
            .unwrap_or(rest.len())
            .clamp(1, rest.len());
        let (head, tail) = rest.split_at(take);
        rest = tail;
        Some(head)
    })
}

proptest! {
    // A failure prints its minimal input; no regression file beside a test crate.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn valid_replies_split_at_every_byte_come_back_exactly((replies, stream) in reply_stream()) {
        let limits = Limits::default();
        for cut in 0..=stream.len() {
            let mut framer = JsonFramer::new(limits);
            let (frames, error) = feed(&mut framer, limits, [&stream[..cut], &stream[cut..]]);
            prop_assert!(error.is_none(), "cut at {}: {:?}", cut, error);
            let frames: Vec<String> =
                frames.into_iter().map(|f| String::from_utf8(f).unwrap()).collect();
            prop_assert_eq!(&frames, &replies, "cut at {}", cut);
            prop_assert_eq!(framer.pending(), 0);
        }
    }

    #[test]
    fn valid_replies_in_any_chunking_come_back_exactly(
        (replies, stream) in reply_stream(),
        sizes in prop::collection::vec(1usize..64, 1..8),
    ) {
        let limits = Limits::default();
        let mut framer = JsonFramer::new(limits);
        let (frames, error) = feed(&mut framer, limits, chunked(&stream, &sizes));
        prop_assert!(error.is_none(), "{:?}", error);
        let frames: Vec<String> =
            frames.into_iter().map(|f| String::from_utf8(f).unwrap()).collect();
        prop_assert_eq!(frames, replies);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_frames_are_json_from_the_input(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..2048),
            // Mostly JSON's own bytes, so the scanner goes deep into values.
            prop::collection::vec(
                prop::sample::select(b"{}[]\",:\\ \n0123456789.eE+-truefalsn\xff\x00".to_vec()),
                0..2048,
            ),
        ],
        sizes in prop::collection::vec(1usize..300, 1..8),
    ) {
        let limits = Limits { max_message_bytes: 256, max_depth: 8 };
        let mut framer = JsonFramer::new(limits);
        let (frames, _) = feed(&mut framer, limits, chunked(&bytes, &sizes));
        let mut rest = &bytes[..];
        for frame in frames {
            prop_assert!(serde_json::from_slice::<Value>(&frame).is_ok());
            // Each frame is the input's next bytes after JSON whitespace.
            let skip = rest.iter().take_while(|b| b" \t\r\n".contains(b)).count();
            prop_assert!(rest[skip..].starts_with(&frame));
            rest = &rest[skip + frame.len()..];
        }
    }

    #[test]
    fn deep_nesting_hits_the_depth_limit(
        extra in 1usize..200,
        object in any::<bool>(),
        closed in any::<bool>(),
        sizes in prop::collection::vec(1usize..100, 1..8),
    ) {
        let limits = Limits { max_message_bytes: 1 << 20, max_depth: 32 };
        let depth = limits.max_depth + extra;
        let (open, close) = if object { (r#"{"a":"#, "}") } else { ("[", "]") };
        let mut stream = format!(r#"{{"id":1,"result":{}"#, open.repeat(depth - 1));
        if closed {
            stream += &close.repeat(depth);
        }
        let mut framer = JsonFramer::new(limits);
        let (frames, error) = feed(&mut framer, limits, chunked(stream.as_bytes(), &sizes));
        prop_assert!(frames.is_empty());
        prop_assert!(
            matches!(error, Some(FramingError::TooDeep { offset: 0, limit: 32 })),
            "{:?}", error
        );
    }

    #[test]
    fn oversize_strings_hit_the_size_limit(
        length in 1024usize..8192,
        filler in prop::sample::select(vec!["x", "\\\"", "\\\\", "\u{e9}", "}]"]),
        closed in any::<bool>(),
        sizes in prop::collection::vec(1usize..700, 1..8),
    ) {
        let limits = Limits { max_message_bytes: 1024, max_depth: 8 };
        let mut stream = format!(r#"{{"id":1,"result":"{}"#, filler.repeat(length / filler.len()));
        if closed {
            stream += "\"}";
        }
        let mut framer = JsonFramer::new(limits);
        let (frames, error) = feed(&mut framer, limits, chunked(stream.as_bytes(), &sizes));
        prop_assert!(frames.is_empty());
        prop_assert!(
            matches!(error, Some(FramingError::TooLarge { offset: 0, limit: 1024 })),
            "{:?}", error
        );
    }
}

/// The real limit against a real-sized attack: an endless string sent in
/// socket-sized reads is refused once it passes 64 MiB, having never held
/// more than that, in one pass (the time is printed for the record, not
/// asserted).
#[test]
fn an_endless_string_at_the_default_limit_is_refused_in_linear_time() {
    let limits = Limits::default();
    let mut framer = JsonFramer::new(limits);
    let chunk = vec![b'a'; 64 * 1024];
    framer.extend(br#"{"jsonrpc":"2.0","id":1,"result":""#);
    let started = std::time::Instant::now();
    let mut fed = 0usize;
    let error = loop {
        match framer.next_value() {
            Ok(None) => {}
            Ok(Some(frame)) => panic!("a frame of {} bytes", frame.len()),
            Err(error) => break error,
        }
        assert!(framer.pending() <= limits.max_message_bytes + chunk.len());
        framer.extend(&chunk);
        fed += chunk.len();
    };
    eprintln!(
        "refused after {} MiB in {:?}: {error}",
        fed >> 20,
        started.elapsed()
    );
    assert!(matches!(error, FramingError::TooLarge { .. }), "{error}");
    assert!(fed <= limits.max_message_bytes + chunk.len());
}
