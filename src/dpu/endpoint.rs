//! One SNAP process as the attach layer uses it: its JSON-RPC client, a
//! function pool per emulation, and SPDK errors turned into
//! [`DpuError`]s that name the socket.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio::time::Instant;

use super::emulation::Emulation;
use super::error::DpuError;
use super::functions::{FunctionListing, FunctionPool};
use crate::jsonrpc::{Method, RpcClient, RpcError, code};
use crate::spdk::snap::{
    ControllerCreated, EmulationFunctionList, EmulationType, NvmeSubsystem, NvmeSubsystemList,
};

#[derive(Debug)]
pub(crate) struct SnapEndpoint {
    rpc: RpcClient,
    /// The functions each kind of them this process has just claimed.
    pools: HashMap<EmulationType, FunctionPool>,
    /// The function listing in flight, which attaches that need one join
    /// instead of asking SNAP again: in a burst of stages SNAP renders its
    /// (long) listing once rather than once per volume, and one parsed copy
    /// is held instead of one per stage. A listing is only the starting point
    /// for picking a function (see `functions`), so an older one is as good
    /// as a new one there; where a fresh one is needed, [`Self::list_functions_fresh`].
    functions: SharedListing<FunctionListing>,
    /// The latest NVMe subsystem listing, which packed stages and detaches
    /// share the same way; each only takes one asked for after it began, so
    /// it sees everything done to its volume before.
    subsystems: SharedListing<SubsystemListing>,
}

type Pending<T> = Shared<BoxFuture<'static, Result<Arc<T>, DpuError>>>;

/// One SNAP listing many attaches share, with when it was started (no
/// later than its request was sent).
struct SharedListing<T> {
    slot: Mutex<Option<(Instant, Pending<T>)>>,
}

impl<T> Default for SharedListing<T> {
    fn default() -> Self {
        SharedListing {
            slot: Mutex::new(None),
        }
    }
}

impl<T> std::fmt::Debug for SharedListing<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedListing")
    }
}

impl<T: Send + Sync + 'static> SharedListing<T> {
    /// The listing in the slot if `reusable` says so, else a new one from
    /// `start`. A joiner whose shared listing failed asks again itself, so
    /// it only ever sees its own errors and deadline.
    async fn get(
        &self,
        reusable: impl Fn(Instant, &Pending<T>) -> bool,
        start: impl Fn() -> BoxFuture<'static, Result<Arc<T>, DpuError>>,
    ) -> Result<Arc<T>, DpuError> {
        let (pending, joined) = {
            let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
            match slot.as_ref().filter(|(at, p)| reusable(*at, p)) {
                Some((_, pending)) => (pending.clone(), true),
                None => {
                    let at = Instant::now();
                    let pending = start().shared();
                    *slot = Some((at, pending.clone()));
                    (pending, false)
                }
            }
        };
        match pending.await {
            Err(_) if joined => start().await,
            result => result,
        }
    }
}

impl SnapEndpoint {
    pub fn new(socket: PathBuf) -> Self {
        SnapEndpoint {
            rpc: RpcClient::new(socket),
            pools: Emulation::ALL
                .into_iter()
                .filter_map(|e| Some((e.function_kind()?, FunctionPool::default())))
                .collect(),
            functions: SharedListing::default(),
            subsystems: SharedListing::default(),
        }
    }

    pub fn socket(&self) -> &Path {
        self.rpc.socket()
    }

    pub async fn call<M: Method>(
        &self,
        method: &M,
        deadline: Instant,
    ) -> Result<M::Output, RpcError> {
        self.rpc.call_until(method, deadline).await
    }

    /// Calls `method`; an answer with one of `tolerated` codes counts as done
    /// (e.g. -17 for a create that a crashed attempt already made).
    pub async fn call_tolerating<M: Method>(
        &self,
        what: &str,
        method: &M,
        tolerated: &[i32],
        deadline: Instant,
    ) -> Result<(), DpuError> {
        match self.call(method, deadline).await {
            Ok(_) => Ok(()),
            Err(e) if e.code().is_some_and(|c| tolerated.contains(&c)) => {
                tracing::debug!(socket = %self.socket().display(), "{what}: already done ({e})");
                Ok(())
            }
            Err(e) => Err(self.error(what, e)),
        }
    }

    /// Every emulated function: the listing in flight if there is one, else a
    /// new one.
    pub async fn list_functions(
        &self,
        deadline: Instant,
    ) -> Result<Arc<FunctionListing>, DpuError> {
        let rpc = &self.rpc;
        self.functions
            .get(
                |_, pending| pending.peek().is_none(),
                || list_functions(rpc.clone(), deadline).boxed(),
            )
            .await
    }

    /// Every NVMe subsystem, from a listing started no earlier than `since`
    /// (one in flight, or answered, or a new one): it reflects every call
    /// answered before `since`.
    pub async fn list_subsystems(
        &self,
        since: Instant,
        deadline: Instant,
    ) -> Result<Arc<SubsystemListing>, DpuError> {
        let rpc = &self.rpc;
        self.subsystems
            .get(
                |at, pending| at >= since && !matches!(pending.peek(), Some(Err(_))),
                || list_subsystems(rpc.clone(), deadline).boxed(),
            )
            .await
    }

    /// Every emulated function, asked for now.
    pub async fn list_functions_fresh(
        &self,
        deadline: Instant,
    ) -> Result<Arc<FunctionListing>, DpuError> {
        list_functions(self.rpc.clone(), deadline).await
    }

    /// Creates a controller with `create(pci_bdf)` on a free function of
    /// `emulation`, starting from `listing`; returns the controller and its BDF.
    ///
    /// A function SNAP calls busy (-16, or -17) was taken by someone else
    /// since the listing: list again and take the next one. Each function is
    /// tried at most once, so this ends even if SNAP's listing and its answers
    /// disagree.
    pub async fn create_on_free_function<F, Fut>(
        &self,
        emulation: Emulation,
        mut listing: Arc<FunctionListing>,
        what: &str,
        deadline: Instant,
        mut create: F,
    ) -> Result<(String, String), DpuError>
    where
        F: FnMut(String) -> Fut,
        Fut: Future<Output = Result<ControllerCreated, RpcError>>,
    {
        let Some((kind, pool)) = emulation
            .function_kind()
            .and_then(|k| Some((k, self.pools.get(&k)?)))
        else {
            return Err(DpuError::Internal(format!(
                "{what}: SNAP lists no {} functions in emulation_function_list",
                emulation.label()
            )));
        };
        let mut tried = HashSet::new();
        let mut fresh = false;
        loop {
            let Some(claim) = pool.claim(&listing, kind, &tried) else {
                if fresh {
                    let total = listing.iter().filter(|f| f.emulation_type == kind).count();
                    return Err(DpuError::Exhausted(format!(
                        "SNAP at {}: no free {} function for {what}: all {total} carry a controller",
                        self.socket().display(),
                        emulation.label(),
                    )));
                }
                // Our listing may predate functions freed since: ask once more.
                listing = self.list_functions_fresh(deadline).await?;
                fresh = true;
                continue;
            };
            match create(claim.detail.clone()).await {
                Ok(created) => {
                    let bdf = claim.detail.clone();
                    claim.taken();
                    return Ok((created.ctrl_id, bdf));
                }
                Err(e) if matches!(e.code(), Some(code::EBUSY | code::EEXIST)) => {
                    tracing::info!(
                        socket = %self.socket().display(),
                        function = %claim.detail,
                        "{what}: function taken meanwhile, choosing another"
                    );
                    tried.insert(claim.key.clone());
                    claim.taken();
                    listing = self.list_functions_fresh(deadline).await?;
                    fresh = true;
                }
                Err(e) if e.is_transient() => {
                    // SNAP may have carried it out: keep the function claimed.
                    claim.taken();
                    return Err(self.error(what, e));
                }
                Err(e) => return Err(self.error(what, e)),
            }
        }
    }

    /// Classifies a failed call: not reached or no answer → Unavailable (the
    /// caller may retry, every step is idempotent); a SPDK without the SNAP
    /// methods → FailedPrecondition; any other answer → Internal.
    pub fn error(&self, what: &str, e: RpcError) -> DpuError {
        classify(self.socket(), what, e)
    }
}

fn classify(socket: &Path, what: &str, e: RpcError) -> DpuError {
    let message = format!("SNAP at {}: {what}: {e}", socket.display());
    if e.is_transient() {
        DpuError::Unavailable(message)
    } else if e.is_method_not_found() {
        DpuError::FailedPrecondition(format!("{message} (is this socket a SNAP process?)"))
    } else {
        DpuError::Internal(message)
    }
}

/// One `emulation_function_list`, owning what it needs so that a shared
/// listing outlives the caller that started it.
async fn list_functions(
    rpc: RpcClient,
    deadline: Instant,
) -> Result<Arc<FunctionListing>, DpuError> {
    let list = EmulationFunctionList { all: true };
    let (functions, asked_at) = listed(&rpc, &list, "listing emulated functions", deadline).await?;
    Ok(Arc::new(FunctionListing {
        functions,
        asked_at,
    }))
}

/// One `nvme_subsystem_list`, the same way.
async fn list_subsystems(
    rpc: RpcClient,
    deadline: Instant,
) -> Result<Arc<SubsystemListing>, DpuError> {
    let list = NvmeSubsystemList {};
    let (subsystems, asked_at) = listed(&rpc, &list, "listing NVMe subsystems", deadline).await?;
    Ok(Arc::new(SubsystemListing {
        subsystems,
        asked_at,
    }))
}

/// A listing's answer and when it was asked for (no later than sent).
async fn listed<M: Method>(
    rpc: &RpcClient,
    list: &M,
    what: &str,
    deadline: Instant,
) -> Result<(M::Output, Instant), DpuError> {
    let asked_at = Instant::now();
    let answer = rpc
        .call_until(list, deadline)
        .await
        .map_err(|e| classify(rpc.socket(), what, e))?;
    Ok((answer, asked_at))
}

/// One `nvme_subsystem_list` answer and when it was asked for.
#[derive(Debug)]
pub(crate) struct SubsystemListing {
    pub subsystems: Vec<NvmeSubsystem>,
    /// Sent no earlier than this: it reflects every create answered before.
    pub asked_at: Instant,
}
