//! A JSON-RPC 2.0 client for SPDK and SNAP over a UNIX socket.
//!
//! jsonrpsee's client core does the bookkeeping (ids, matching replies to
//! calls, many calls in flight from many tasks over one connection); we supply
//! the transport ([`transport`]), which frames replies as a stream of JSON
//! values because SPDK guarantees no delimiter ([`framing`]).
//!
//! Every call has a deadline. A connection that breaks or closes fails the
//! calls in flight with [`RpcError::Disconnected`] and is replaced by a new one
//! on the next call; calls are never resent behind the caller's back, since a
//! call that was in flight may have been carried out.

mod error;
mod framing;
mod transport;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use jsonrpsee::core::client::{ClientBuilder, ClientT, Error as ClientError};
use jsonrpsee::core::traits::ToRpcParams;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio::sync::Mutex;
use tokio::time::Instant;

pub use error::{RpcError, code};
pub use framing::{FramingError, JsonFramer};

/// A JSON-RPC method with typed params (the implementing type) and result.
pub trait Method: Serialize + Sync {
    /// The method name on the wire.
    const NAME: &'static str;
    /// What the `result` member decodes into.
    type Output: DeserializeOwned;
}

/// Used when a call does not say how long it may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Bounds how many calls may wait for the background task at once; beyond it
/// callers queue, they do not fail.
const MAX_IN_FLIGHT: usize = 4096;

/// A cheap-to-clone handle to one SPDK/SNAP socket, shared by many tasks.
#[derive(Debug, Clone)]
pub struct RpcClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    socket: PathBuf,
    default_timeout: Duration,
    connection: Mutex<Option<Arc<jsonrpsee::core::client::Client>>>,
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
                connection: Mutex::new(None),
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
        let params = Params::encode(M::NAME, method)?;
        self.request(M::NAME, params, deadline).await
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
            Some(value) => Params::encode(method, value)?,
            None => Params(None),
        };
        self.request(method, params, deadline).await
    }

    async fn request<R: DeserializeOwned>(
        &self,
        method: &str,
        params: Params,
        deadline: Instant,
    ) -> Result<R, RpcError> {
        let started = Instant::now();
        let result = self.request_once(method, params, deadline).await;
        let outcome = match &result {
            Ok(_) => "ok".to_string(),
            Err(RpcError::Server { code, .. }) => code.to_string(),
            Err(RpcError::Timeout { .. }) => "timeout".to_string(),
            Err(RpcError::Connect { .. }) => "connect".to_string(),
            Err(RpcError::Disconnected { .. }) => "disconnected".to_string(),
            Err(RpcError::InvalidReply { .. }) => "invalid_reply".to_string(),
            Err(RpcError::InvalidParams { .. }) => "invalid_params".to_string(),
        };
        crate::metrics::observe_outbound("snap", method, &outcome, started.elapsed());
        result
    }

    async fn request_once<R: DeserializeOwned>(
        &self,
        method: &str,
        params: Params,
        deadline: Instant,
    ) -> Result<R, RpcError> {
        let started = Instant::now();
        let timeout = || RpcError::Timeout {
            method: method.to_string(),
            after: started.elapsed(),
        };
        let client = tokio::time::timeout_at(deadline, self.connection())
            .await
            .map_err(|_| timeout())??;
        match tokio::time::timeout_at(deadline, client.request::<R, _>(method, params)).await {
            Err(_) => Err(timeout()),
            Ok(Ok(result)) => Ok(result),
            Ok(Err(e)) => {
                let error = classify(method, e);
                if matches!(error, RpcError::Disconnected { .. }) {
                    self.forget(&client).await;
                }
                Err(error)
            }
        }
    }

    /// The live connection, opening a new one if there is none or it died.
    async fn connection(&self) -> Result<Arc<jsonrpsee::core::client::Client>, RpcError> {
        let mut slot = self.inner.connection.lock().await;
        if let Some(client) = slot.as_ref().filter(|c| c.is_connected()) {
            return Ok(Arc::clone(client));
        }
        let (sender, receiver) =
            transport::connect(&self.inner.socket)
                .await
                .map_err(|source| RpcError::Connect {
                    socket: self.inner.socket.clone(),
                    source,
                })?;
        let client = Arc::new(
            ClientBuilder::default()
                // Our own per-call deadline governs; this only backstops it.
                .request_timeout(Duration::from_secs(24 * 3600))
                .max_concurrent_requests(MAX_IN_FLIGHT)
                .build_with_tokio(sender, receiver),
        );
        *slot = Some(Arc::clone(&client));
        Ok(client)
    }

    /// Drops `client` if it is still the cached connection, so the next call
    /// reconnects even if the background task has not noticed the break yet.
    async fn forget(&self, client: &Arc<jsonrpsee::core::client::Client>) {
        let mut slot = self.inner.connection.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, client)) {
            *slot = None;
        }
    }
}

/// Encoded params; absent when they would be `{}` or `null`, because some
/// SPDK methods reject any params (`spdk_get_version`) or treat an empty
/// object differently from none (`bdev_lvol_get_lvstores` answers -22).
struct Params(Option<Box<RawValue>>);

impl Params {
    fn encode<T: Serialize + ?Sized>(method: &str, value: &T) -> Result<Self, RpcError> {
        let raw = serde_json::value::to_raw_value(value).map_err(|e| RpcError::InvalidParams {
            method: method.to_string(),
            reason: e.to_string(),
        })?;
        Ok(match raw.get() {
            "{}" | "null" => Params(None),
            _ => Params(Some(raw)),
        })
    }
}

impl ToRpcParams for Params {
    fn to_rpc_params(self) -> Result<Option<Box<RawValue>>, serde_json::Error> {
        Ok(self.0)
    }
}

fn classify(method: &str, error: ClientError) -> RpcError {
    let method = method.to_string();
    match error {
        ClientError::Call(object) => RpcError::Server {
            method,
            code: object.code(),
            message: object.message().to_string(),
        },
        ClientError::RestartNeeded(reason) => RpcError::Disconnected {
            method,
            reason: reason.to_string(),
        },
        ClientError::Transport(reason) => RpcError::Disconnected {
            method,
            reason: reason.to_string(),
        },
        ClientError::ServiceDisconnect => RpcError::Disconnected {
            method,
            reason: "client background task stopped".to_string(),
        },
        ClientError::RequestTimeout => RpcError::Timeout {
            method,
            after: Duration::ZERO,
        },
        other => RpcError::InvalidReply {
            method,
            reason: other.to_string(),
        },
    }
}
