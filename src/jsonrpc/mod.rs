//! A JSON-RPC 2.0 client for SPDK and SNAP over a UNIX socket.
//!
//! One connection carries many calls in flight from many tasks
//! ([`connection`]): requests queued while the previous write was going out
//! leave together in one write, and replies, which may come in any order and
//! any chunking (SPDK guarantees no delimiter, [`JsonFramer`]), are matched to
//! their callers by id. The envelopes are a few serde structs ([`wire`]).
//!
//! Every call has a deadline; a call that passes it is forgotten, and a late
//! reply to it is ignored. A connection that breaks or closes, or sends a reply
//! that no call can own, fails the calls in flight with
//! [`RpcError::Disconnected`] and is replaced by a new one on the next call;
//! calls are never resent behind the caller's back, since a call that was in
//! flight may have been carried out. A reply that is malformed or has the
//! wrong shape for its method fails only its own call
//! ([`RpcError::InvalidReply`]) when its id can be read.

mod connection;
mod error;
#[cfg(test)]
mod test_server;
mod wire;

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio::time::Instant;

use connection::Connection;
pub use error::{RpcError, code};
pub use json_framing::{FramingError, JsonFramer};

/// A JSON-RPC method with typed params (the implementing type) and result.
pub trait Method: Serialize + Sync {
    /// The method name on the wire.
    const NAME: &'static str;
    /// What the `result` member decodes into.
    type Output: DeserializeOwned;
}

/// Used when a call does not say how long it may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A cheap-to-clone handle to one SPDK/SNAP socket, shared by many tasks.
#[derive(Debug, Clone)]
pub struct RpcClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    socket: PathBuf,
    default_timeout: Duration,
    /// Read on every call, so a plain lock held for a clone of the `Arc`.
    live: RwLock<Option<Arc<Connection>>>,
    /// Held while connecting, so that callers arriving meanwhile wait for
    /// that connection instead of opening their own.
    connecting: tokio::sync::Mutex<()>,
}

impl RpcClient {
    /// A client for the socket at `socket`; it connects on first use.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self::with_timeout(socket, DEFAULT_TIMEOUT)
    }

    /// Like [`RpcClient::new`] with a different default per-call timeout.
    pub fn with_timeout(socket: impl Into<PathBuf>, default_timeout: Duration) -> Self {
        RpcClient {
            inner: Arc::new(Inner {
                socket: socket.into(),
                default_timeout,
                live: RwLock::new(None),
                connecting: tokio::sync::Mutex::new(()),
            }),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.inner.socket
    }

    /// Calls `method` with the default timeout.
    pub async fn call<M: Method>(&self, method: &M) -> Result<M::Output, RpcError> {
        self.call_until(method, Instant::now() + self.inner.default_timeout)
            .await
    }

    /// Calls `method`, giving up at `deadline`.
    pub async fn call_until<M: Method>(
        &self,
        method: &M,
        deadline: Instant,
    ) -> Result<M::Output, RpcError> {
        let params = encode_params(M::NAME, method)?;
        self.request(Cow::Borrowed(M::NAME), params.as_deref(), deadline)
            .await
    }

    /// Calls a method by name with untyped params (`None` sends no params);
    /// for tools that pass through whatever the user typed.
    pub async fn call_raw(
        &self,
        method: &str,
        params: Option<&serde_json::Value>,
        deadline: Instant,
    ) -> Result<serde_json::Value, RpcError> {
        let params = match params {
            Some(value) => encode_params(method, value)?,
            None => None,
        };
        self.request(Cow::Owned(method.to_string()), params.as_deref(), deadline)
            .await
    }

    async fn request<R: DeserializeOwned>(
        &self,
        method: Cow<'static, str>,
        params: Option<&RawValue>,
        deadline: Instant,
    ) -> Result<R, RpcError> {
        let started = Instant::now();
        let result = tokio::time::timeout_at(deadline, self.request_once(&method, params))
            .await
            .unwrap_or_else(|_| {
                Err(RpcError::Timeout {
                    method: method.to_string(),
                    after: started.elapsed(),
                })
            });
        crate::metrics::observe_outbound_static(
            "snap",
            method,
            outcome(&result),
            started.elapsed(),
        );
        result
    }

    async fn request_once<R: DeserializeOwned>(
        &self,
        method: &str,
        params: Option<&RawValue>,
    ) -> Result<R, RpcError> {
        let connection = self.connection().await?;
        let frame = connection.send(method, params)?.reply(method).await?;
        wire::decode_reply(method, &frame)
    }

    /// The live connection, opening a new one if there is none or it broke.
    async fn connection(&self) -> Result<Arc<Connection>, RpcError> {
        if let Some(connection) = self.live() {
            return Ok(connection);
        }
        let _connecting = self.inner.connecting.lock().await;
        if let Some(connection) = self.live() {
            return Ok(connection);
        }
        let connection = Arc::new(Connection::open(&self.inner.socket).await.map_err(
            |source| RpcError::Connect {
                socket: self.inner.socket.clone(),
                source,
            },
        )?);
        *self
            .inner
            .live
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&connection));
        Ok(connection)
    }

    fn live(&self) -> Option<Arc<Connection>> {
        self.inner
            .live
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|connection| !connection.is_broken())
            .cloned()
    }
}

/// The metrics label of a call's outcome; static except for server codes.
fn outcome<R>(result: &Result<R, RpcError>) -> Cow<'static, str> {
    match result {
        Ok(_) => "ok".into(),
        Err(RpcError::Server { code, .. }) => code.to_string().into(),
        Err(RpcError::Timeout { .. }) => "timeout".into(),
        Err(RpcError::Connect { .. }) => "connect".into(),
        Err(RpcError::Disconnected { .. }) => "disconnected".into(),
        Err(RpcError::InvalidReply { .. }) => "invalid_reply".into(),
        Err(RpcError::InvalidParams { .. }) => "invalid_params".into(),
    }
}

/// Encoded params; absent when they would be `{}` or `null`, because some
/// SPDK methods reject any params (`spdk_get_version`) or treat an empty
/// object differently from none (`bdev_lvol_get_lvstores` answers -22).
fn encode_params<T: Serialize + ?Sized>(
    method: &str,
    value: &T,
) -> Result<Option<Box<RawValue>>, RpcError> {
    let raw = serde_json::value::to_raw_value(value).map_err(|e| RpcError::InvalidParams {
        method: method.to_string(),
        reason: e.to_string(),
    })?;
    Ok(match raw.get() {
        "{}" | "null" => None,
        _ => Some(raw),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use serde_json::{Value, json};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixStream;

    use super::test_server::serve;
    use super::*;

    impl RpcClient {
        fn pending_calls(&self) -> usize {
            let live = self.inner.live.read().unwrap();
            live.as_ref().map_or(0, |c| c.pending_calls())
        }
    }

    /// The next `n` requests on `stream`, `None` at EOF.
    async fn read_requests(
        stream: &mut UnixStream,
        framer: &mut JsonFramer,
        n: usize,
    ) -> Option<Vec<Value>> {
        let mut requests = Vec::new();
        let mut chunk = [0u8; 4096];
        while requests.len() < n {
            match framer.next_value().unwrap() {
                Some(value) => requests.push(serde_json::from_slice(&value).unwrap()),
                None => match stream.read(&mut chunk).await.unwrap() {
                    0 => return None,
                    read => framer.extend(&chunk[..read]),
                },
            }
        }
        Some(requests)
    }

    async fn reply(stream: &mut UnixStream, request: &Value, body: Value) {
        let mut reply = json!({"jsonrpc": "2.0", "id": request["id"]});
        reply
            .as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        stream
            .write_all(reply.to_string().as_bytes())
            .await
            .unwrap();
    }

    fn soon(ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms)
    }

    #[tokio::test]
    async fn timed_out_calls_leave_nothing_behind_and_late_replies_are_ignored() {
        let server = serve(|_, mut stream| async move {
            let mut framer = JsonFramer::default();
            // Sit on three requests past their deadline, then answer them late.
            let late = read_requests(&mut stream, &mut framer, 3).await.unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            for request in &late {
                reply(&mut stream, request, json!({"result": "late"})).await;
            }
            while let Some(requests) = read_requests(&mut stream, &mut framer, 1).await {
                reply(&mut stream, &requests[0], json!({"result": "on time"})).await;
            }
        });
        let client = RpcClient::new(&server.socket);
        let calls = (0..3).map(|_| client.call_raw("spdk_get_version", None, soon(100)));
        for result in futures::future::join_all(calls).await {
            assert!(
                matches!(result, Err(RpcError::Timeout { .. })),
                "{result:?}"
            );
        }
        assert_eq!(client.pending_calls(), 0);
        tokio::time::sleep(Duration::from_millis(400)).await;
        let answer = client
            .call_raw("spdk_get_version", None, soon(2000))
            .await
            .unwrap();
        assert_eq!(answer, "on time");
        assert_eq!(server.connections.load(Ordering::SeqCst), 1);
        assert_eq!(client.pending_calls(), 0);
    }

    #[tokio::test]
    async fn error_objects_and_params_reach_the_caller_as_sent() {
        let server = serve(|_, mut stream| async move {
            let mut framer = JsonFramer::default();
            while let Some(requests) = read_requests(&mut stream, &mut framer, 1).await {
                let request = &requests[0];
                // Echo the params (absent stays absent) in the error's message.
                let message = request
                    .get("params")
                    .map_or("none".into(), Value::to_string);
                let code = request["id"].as_i64().unwrap() as i32 * 2 - 19;
                let body = json!({"error": {"code": code, "message": message}});
                reply(&mut stream, request, body).await;
            }
        });
        let client = RpcClient::new(&server.socket);
        for (params, sent, code) in [
            (Some(json!({})), "none", -19),
            (None, "none", -17),
            (Some(json!(null)), "none", -15),
            (Some(json!({"name": "Nvme0"})), r#"{"name":"Nvme0"}"#, -13),
        ] {
            let error = client
                .call_raw("bdev_nvme_get_controllers", params.as_ref(), soon(2000))
                .await
                .unwrap_err();
            match error {
                RpcError::Server {
                    method,
                    code: got,
                    message,
                } => {
                    assert_eq!(method, "bdev_nvme_get_controllers");
                    assert_eq!((got, message.as_str()), (code, sent));
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_null_result_is_a_result() {
        let server = serve(|_, mut stream| async move {
            let mut framer = JsonFramer::default();
            while let Some(requests) = read_requests(&mut stream, &mut framer, 1).await {
                reply(&mut stream, &requests[0], json!({"result": null})).await;
            }
        });
        let client = RpcClient::new(&server.socket);
        let result = client.call_raw("x", None, soon(2000)).await.unwrap();
        assert_eq!(result, Value::Null);
    }

    #[tokio::test]
    async fn many_tasks_share_one_connection_with_replies_out_of_order() {
        const CALLS: usize = 200;
        let server = serve(|_, mut stream| async move {
            let mut framer = JsonFramer::default();
            let requests = read_requests(&mut stream, &mut framer, CALLS)
                .await
                .unwrap();
            let ids: std::collections::HashSet<_> =
                requests.iter().map(|r| r["id"].as_u64().unwrap()).collect();
            assert_eq!(ids.len(), CALLS, "ids must be unique");
            // Answer in reverse, each reply echoing its request's params.
            for request in requests.iter().rev() {
                reply(&mut stream, request, json!({"result": request["params"]})).await;
            }
            tokio::time::sleep(Duration::from_secs(3600)).await;
        });
        let client = RpcClient::new(&server.socket);
        let tasks: Vec<_> = (0..CALLS)
            .map(|n| {
                let client = client.clone();
                tokio::spawn(async move {
                    let params = json!({ "n": n });
                    let result = client.call_raw("echo", Some(&params), soon(5000)).await;
                    (params, result)
                })
            })
            .collect();
        for task in tasks {
            let (params, result) = task.await.unwrap();
            assert_eq!(result.unwrap(), params);
        }
        assert_eq!(server.connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_reply_to_an_id_never_sent_breaks_the_connection() {
        let server = serve(|_, mut stream| async move {
            let mut framer = JsonFramer::default();
            while let Some(requests) = read_requests(&mut stream, &mut framer, 1).await {
                let body = json!({"result": true});
                let request = &requests[0];
                let stray = json!({"id": request["id"].as_u64().unwrap() + 1000});
                if request["method"] == "stray" {
                    reply(&mut stream, &stray, body).await;
                } else {
                    reply(&mut stream, request, body).await;
                }
            }
        });
        let client = RpcClient::new(&server.socket);
        let error = client
            .call_raw("stray", None, soon(2000))
            .await
            .unwrap_err();
        assert!(matches!(error, RpcError::Disconnected { .. }), "{error:?}");
        assert!(error.to_string().contains("never sent"), "{error}");
        assert!(client.call_raw("fine", None, soon(2000)).await.is_ok());
        assert_eq!(server.connections.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn dropping_the_last_client_closes_the_connection() {
        let (closed, is_closed) = tokio::sync::oneshot::channel::<()>();
        let closed = std::sync::Mutex::new(Some(closed));
        let server = serve(move |_, mut stream| {
            let closed = closed.lock().unwrap().take();
            async move {
                let mut framer = JsonFramer::default();
                while let Some(requests) = read_requests(&mut stream, &mut framer, 1).await {
                    reply(&mut stream, &requests[0], json!({"result": 1})).await;
                }
                // EOF says only that the client stopped writing; a write
                // fails once its reading side is gone too. (A late reply, so
                // that a reader still running would keep reading.)
                let late = json!({"jsonrpc": "2.0", "id": 0, "result": 1}).to_string();
                while stream.write_all(late.as_bytes()).await.is_ok() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let _ = closed.unwrap().send(());
            }
        });
        let client = RpcClient::new(&server.socket);
        let clone = client.clone();
        clone.call_raw("x", None, soon(2000)).await.unwrap();
        drop(client);
        drop(clone);
        tokio::time::timeout(Duration::from_secs(5), is_closed)
            .await
            .expect("the connection outlived the client")
            .unwrap();
    }
}
