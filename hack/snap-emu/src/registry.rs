//! The families of methods the dispatcher routes to, and the rules between
//! them.
//!
//! A family (the aio, malloc and null modules; crypto with the accel
//! keyring; lvol; the bdev_nvme initiator; the NVMe-oF target; QoS; iostat;
//! `bdev_get_bdevs`; SNAP) owns its state and answers its own methods
//! ([`Family`]); [`Shared::route`] finds the family of a method. What a
//! family must know of the others goes through SPDK's bdev layer, as in
//! SPDK: the registry of bdevs every family sees ([`Bdevs`]), and the
//! callbacks of a family that makes bdevs ([`BdevModule`], SPDK's
//! `fn_table`) or uses them ([`BdevUser`], SPDK's descriptor events), which
//! [`Cx`] runs across all of them:
//!
//! - hot remove ([`Cx::unregister`]): what is built on a bdev goes first
//!   (a crypto vbdev, an lvol store's lvols), then its users let go of it
//!   (SNAP takes its disks off the host, the target drops its namespaces,
//!   an lvol store goes), then its module frees it (its file, its claim);
//! - a resize reaches the users ([`Cx::resized`]), so the host sees it;
//! - after every call a module may examine the bdevs (a crypto vbdev whose
//!   base has appeared);
//! - what a bdev's I/O passes ([`Cx::volume_of`]), whether a user holds it
//!   open for writing or holds I/O channels of it, what the host counted on
//!   it, and its `driver_specific`.
//!
//! One lock over [`State`] serialises the calls, as SPDK's single RPC
//! thread does.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Weak};

use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::bdev::registry::{Bdev, Bdevs};
use crate::datapath::volume::Volume;
use crate::fsdev::registry::{Fsdev, Fsdevs};
use crate::host::BlockStat;
use crate::rpc::{RpcError, RpcResult};

/// What a family answers a call with.
pub(crate) type Answer = Result<Reply, RpcError>;

/// A call's result.
pub(crate) enum Reply {
    /// A result, serialised by the dispatcher.
    Value(Value),
    /// A result serialised already (listings too large to build as a
    /// `Value` first).
    Json(String),
    /// The rest of the call, finished outside the lock: it waits for
    /// another process (an NVMe-oF target, which may be this one) or for
    /// time.
    Later(Pin<Box<dyn Future<Output = RpcResult> + Send>>),
}

impl From<Value> for Reply {
    fn from(value: Value) -> Self {
        Self::Value(value)
    }
}

/// A family of methods with the state they act on.
pub(crate) trait Family: BdevModule + BdevUser + Any + Send + fmt::Debug {
    /// The methods it answers, as `rpc_get_methods` lists them.
    fn methods(&self) -> Vec<&'static str>;

    /// Methods it answers that `rpc_get_methods` leaves out: the
    /// emulator's own knobs, which no SNAP has.
    fn unlisted(&self) -> Vec<&'static str> {
        Vec::new()
    }

    /// Methods that only read the state: answered on the RPC task, since a
    /// trip to the blocking pool would cost more than they do.
    fn reads(&self) -> Vec<&'static str> {
        Vec::new()
    }

    /// Answers `method`, one of its own, under the state's lock.
    fn call(&mut self, method: &str, params: Option<Value>, cx: &mut Cx<'_>) -> Answer;

    /// Graceful shutdown: listeners stop, connections close, the host side
    /// lets go of its disks.
    fn shutdown(&mut self) {}

    /// `SPDK_FSDEV_EVENT_REMOVE`: `fsdev` is going; its users let go of it.
    fn fsdev_removed(&mut self, _fsdev: &Fsdev) {}
}

/// What the bdev layer asks of a module that makes bdevs (SPDK's
/// `fn_table` and examine). Every module is asked about every bdev and
/// answers for its own.
pub(crate) trait BdevModule {
    /// The bdevs it built on `bdev` (a crypto vbdev on its base, an lvol
    /// store's lvols), which go before `bdev` does.
    fn built_on(&self, _bdev: &Bdev, _bdevs: &Bdevs) -> Vec<String> {
        Vec::new()
    }

    /// `destruct`: `bdev` has left the registry; the module that made it
    /// frees what it held (its file, its record, its claim on a base).
    fn destruct(&mut self, _bdev: &Bdev, _bdevs: &mut Bdevs) {}

    /// `dump_info_json`: the `driver_specific` of a bdev of this module.
    fn dump(&self, _bdev: &Bdev) -> Option<Value> {
        None
    }

    /// Its part of a bdev's I/O beyond the bytes at its backing (a cipher,
    /// a remote target).
    fn io_path(&self, _bdev: &Bdev, _bdevs: &Bdevs, _volume: &mut Volume) -> Result<(), RpcError> {
        Ok(())
    }

    /// SPDK's examine, after every call: bdevs may have appeared (the base
    /// a pending vbdev waits for).
    fn examine(&mut self, _bdevs: &mut Bdevs) {}
}

/// What the bdev layer tells a family that uses bdevs (SPDK's descriptor
/// events), and what it asks of it.
pub(crate) trait BdevUser {
    /// `SPDK_BDEV_EVENT_REMOVE`: `bdev` is going; let go of it.
    fn release(&mut self, _bdev: &Bdev, _bdevs: &mut Bdevs) {}

    /// `SPDK_BDEV_EVENT_RESIZE`: `bdev` has a new size.
    fn resized(&mut self, _bdev: &Bdev, _bdevs: &Bdevs) {}

    /// Whether it holds `bdev` open for writing, which a claim cannot take.
    fn writes(&self, _bdev: &str) -> bool {
        false
    }

    /// The SPDK thread on which it holds an I/O channel of `bdev`, if any
    /// (what `bdev_nvme_get_io_paths` lists by thread).
    fn io_channel(&self, _bdev: &str) -> Option<&'static str> {
        None
    }

    /// The kernel's counters of the host disks that show `bdev` directly
    /// (what passes the data path is counted there).
    fn host_io(&self, _bdev: &str) -> BlockStat {
        BlockStat::default()
    }
}

/// What a call sees besides its own family: the bdevs, and every other
/// family through the bdev layer's callbacks.
pub(crate) struct Cx<'a> {
    pub bdevs: &'a mut Bdevs,
    /// The fsdev layer's registry.
    pub fsdevs: &'a mut Fsdevs,
    /// The families registered before and after the one called.
    before: &'a mut [Box<dyn Family>],
    after: &'a mut [Box<dyn Family>],
    shared: &'a Weak<Shared>,
}

impl Cx<'_> {
    /// The shared state, for work that outlives the call (a listener, the
    /// rest of a call that waits outside the lock).
    pub(crate) fn shared(&self) -> Weak<Shared> {
        self.shared.clone()
    }

    fn others(&self) -> impl Iterator<Item = &dyn Family> {
        self.before
            .iter()
            .chain(self.after.iter())
            .map(|f| f.as_ref())
    }

    /// Runs `f` on every family in the order of their registration, `me`
    /// (the family called) in its place.
    fn each(&mut self, me: &mut dyn Family, mut f: impl FnMut(&mut dyn Family, &mut Bdevs)) {
        for other in self.before.iter_mut() {
            f(other.as_mut(), self.bdevs);
        }
        f(me, self.bdevs);
        for other in self.after.iter_mut() {
            f(other.as_mut(), self.bdevs);
        }
    }

    /// Removes a bdev after everything built on it, as SPDK's hot remove
    /// does, which is why deleting a claimed bdev succeeds: the bdevs built
    /// on it go first, its users let go, then its module frees it. `me` is
    /// the family making the call, which may be one of those.
    pub(crate) fn unregister(&mut self, me: &mut dyn Family, name: &str) {
        let Some(bdev) = self.bdevs.get(name).cloned() else {
            return;
        };
        let mut built_on = Vec::new();
        self.each(me, |f, bdevs| built_on.extend(f.built_on(&bdev, bdevs)));
        for name in built_on {
            self.unregister(me, &name);
        }
        self.each(me, |f, bdevs| f.release(&bdev, bdevs));
        self.bdevs.remove(&bdev.name);
        self.each(me, |f, bdevs| f.destruct(&bdev, bdevs));
    }

    /// Unregisters an fsdev (`spdk_fsdev_unregister`): its users let go of
    /// it first, in every family.
    pub(crate) fn unregister_fsdev(&mut self, me: &mut dyn Family, name: &str) {
        let Some(fsdev) = self.fsdevs.remove(name) else {
            return;
        };
        self.each(me, |f, _| f.fsdev_removed(&fsdev));
    }

    /// Tells the users of a bdev that its size changed.
    pub(crate) fn resized(&mut self, me: &mut dyn Family, name: &str) {
        let Some(bdev) = self.bdevs.get(name).cloned() else {
            return;
        };
        self.each(me, |f, bdevs| f.resized(&bdev, bdevs));
    }

    /// Whether another family holds `bdev` open for writing.
    pub(crate) fn writes(&self, bdev: &str) -> bool {
        self.others().any(|f| f.writes(bdev))
    }

    /// The threads holding I/O channels of `bdev`: its users', and those of
    /// every bdev built on it (whose channels hold one of it), in the order
    /// the families were registered.
    pub(crate) fn io_channels(&self, bdev: &Bdev) -> Vec<&'static str> {
        let mut threads: Vec<&'static str> = self
            .others()
            .filter_map(|f| f.io_channel(&bdev.name))
            .collect();
        let above: Vec<String> = self
            .others()
            .flat_map(|f| f.built_on(bdev, self.bdevs))
            .collect();
        for name in above {
            if let Some(b) = self.bdevs.get(&name) {
                threads.extend(self.io_channels(b));
            }
        }
        let mut seen = Vec::new();
        threads.retain(|t| {
            let new = !seen.contains(t);
            seen.push(t);
            new
        });
        threads
    }

    /// The kernel's counters of the host disks showing `bdev` directly.
    pub(crate) fn host_io(&self, bdev: &str) -> BlockStat {
        let mut total = BlockStat::default();
        for f in self.others() {
            total.add(&f.host_io(bdev));
        }
        total
    }

    /// `driver_specific` of `bdev`, from its module.
    pub(crate) fn driver_specific(&self, bdev: &Bdev) -> Value {
        self.others()
            .find_map(|f| f.dump(bdev))
            .unwrap_or_else(|| json!({}))
    }

    /// What the data path serves for `bdev`: its bytes, the bdevs it
    /// passes, and what its module adds (a crypto bdev's cipher, -ENODEV
    /// if its key is gone; an NVMe-oF namespace's target).
    pub(crate) fn volume_of(&self, bdev: &Bdev) -> Result<Volume, RpcError> {
        let mut volume = self.bdevs.volume(bdev);
        for f in self.others() {
            f.io_path(bdev, self.bdevs, &mut volume)?;
        }
        Ok(volume)
    }
}

/// Where a method goes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Route {
    family: usize,
    /// A pure read (see [`Family::reads`]).
    pub read: bool,
}

/// What connections, listeners and tasks share: the state behind its lock,
/// and the routes, which never change.
#[derive(Debug)]
pub(crate) struct Shared {
    pub state: Arc<Mutex<State>>,
    routes: HashMap<&'static str, Route>,
    /// What `rpc_get_methods` lists of the families' methods.
    listed: Vec<&'static str>,
}

impl Shared {
    /// The state of `families`, registered in this order (the order the
    /// bdev layer's callbacks visit them in); `files_dir` holds the files
    /// the modules make and goes at shutdown.
    pub(crate) fn new(families: Vec<Box<dyn Family>>, files_dir: PathBuf) -> Arc<Self> {
        let mut routes = HashMap::new();
        let mut listed = Vec::new();
        for (i, f) in families.iter().enumerate() {
            let methods = f.methods();
            let reads = f.reads();
            listed.extend(methods.iter().copied());
            for method in methods.into_iter().chain(f.unlisted()) {
                let route = Route {
                    family: i,
                    read: reads.contains(&method),
                };
                let clash = routes.insert(method, route);
                assert!(clash.is_none(), "{method} is registered twice");
            }
        }
        Arc::new_cyclic(|me| Shared {
            state: Arc::new(Mutex::new(State {
                bdevs: Bdevs::default(),
                fsdevs: Fsdevs::default(),
                families,
                me: me.clone(),
                files_dir,
                shut_down: false,
            })),
            routes,
            listed,
        })
    }

    pub(crate) fn route(&self, method: &str) -> Option<Route> {
        self.routes.get(method).copied()
    }

    /// The families' methods `rpc_get_methods` lists.
    pub(crate) fn listed(&self) -> &[&'static str] {
        &self.listed
    }
}

/// Every family's state and the bdevs.
#[derive(Debug)]
pub(crate) struct State {
    pub bdevs: Bdevs,
    fsdevs: Fsdevs,
    families: Vec<Box<dyn Family>>,
    me: Weak<Shared>,
    files_dir: PathBuf,
    shut_down: bool,
}

impl State {
    /// Answers a call its route leads to; then the modules examine what
    /// it registered.
    pub(crate) fn call(&mut self, route: Route, method: &str, params: Option<Value>) -> Answer {
        let (before, rest) = self.families.split_at_mut(route.family);
        let (me, after) = rest
            .split_first_mut()
            .expect("a route leads to a registered family");
        let mut cx = Cx {
            bdevs: &mut self.bdevs,
            fsdevs: &mut self.fsdevs,
            before,
            after,
            shared: &self.me,
        };
        let answer = me.call(method, params, &mut cx);
        for f in &mut self.families {
            f.examine(&mut self.bdevs);
        }
        answer
    }

    /// The family of type `T` with what it sees of the rest, for work of
    /// that family outside a call (a connection to its listener, the rest
    /// of a call).
    pub(crate) fn family<T: Family>(&mut self) -> Option<(&mut T, Cx<'_>)> {
        let i = self
            .families
            .iter()
            .position(|f| (f.as_ref() as &dyn Any).is::<T>())?;
        let (before, rest) = self.families.split_at_mut(i);
        let (me, after) = rest.split_first_mut()?;
        let me = (me.as_mut() as &mut dyn Any).downcast_mut::<T>()?;
        let cx = Cx {
            bdevs: &mut self.bdevs,
            fsdevs: &mut self.fsdevs,
            before,
            after,
            shared: &self.me,
        };
        Some((me, cx))
    }

    /// Graceful shutdown: every family's, then the modules' files go.
    pub(crate) fn shutdown(&mut self) {
        self.shut_down = true;
        for f in &mut self.families {
            f.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.files_dir);
    }
}

impl Drop for State {
    /// A server dropped without a graceful shutdown (its future cancelled, a
    /// test panicking) still must not leave loop devices behind.
    fn drop(&mut self) {
        if !self.shut_down {
            self.shutdown();
        }
    }
}
