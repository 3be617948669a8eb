//! Choosing a free emulated function, safely under concurrency.
//!
//! SNAP's `emulation_function_list` is the truth: a function is free when it
//! carries no controller. Two attaches in this process that read the same
//! listing would pick the same free function, so each emulation type has a
//! [`FunctionPool`] that remembers, for a short while, the functions this
//! process has just claimed. The pool is a hint layered on SNAP's answer, not
//! a second source of truth: SNAP refuses a controller on a busy function
//! (-16/-17), and the attach then lists again and takes the next one. That
//! covers other processes and anything the hint gets wrong.
//!
//! The pool's lock is held only while picking (no I/O), never across the
//! create call, so attaches of different volumes create their controllers in
//! parallel: one SNAP round trip each instead of a queue of them.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::emulation::Emulation;
use crate::spdk::snap::{EmulationFunction, EmulationType};

/// How long a claim outlives its create call. A listing read before a
/// claim's create finished may still show the function free; attach
/// deadlines are far shorter than this, so no listing in use is older.
const CLAIM_MEMORY: Duration = Duration::from_secs(600);

/// What `pci_bdf` reads before the host enumerated a hot-plugged function;
/// such a function cannot be addressed by BDF nor found by the host.
const UNENUMERATED_BDF: &str = "00:00.0";

/// One `emulation_function_list` answer and when it was asked for.
#[derive(Debug, Clone)]
pub(crate) struct FunctionListing {
    pub functions: Vec<EmulationFunction>,
    /// Sent no earlier than this: it reflects every create answered before.
    pub asked_at: Instant,
}

/// One PF or VF, flattened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListedFunction {
    pub emulation_type: EmulationType,
    pub pci_bdf: String,
    pub vhca_id: u32,
    pub vuid: String,
    pub ctrl_id: Option<String>,
}

impl FunctionListing {
    /// PFs and their VFs, in SNAP's order.
    pub fn iter(&self) -> impl Iterator<Item = ListedFunction> + '_ {
        self.functions.iter().flat_map(|pf| {
            let own = ListedFunction {
                emulation_type: pf.emulation_type,
                pci_bdf: pf.pci_bdf.clone(),
                vhca_id: pf.vhca_id,
                vuid: pf.vuid.clone(),
                ctrl_id: pf.ctrl_id.clone(),
            };
            std::iter::once(own).chain(pf.vfs.iter().map(|vf| ListedFunction {
                emulation_type: pf.emulation_type,
                pci_bdf: vf.pci_bdf.clone(),
                vhca_id: vf.vhca_id,
                vuid: vf.vuid.clone(),
                ctrl_id: vf.ctrl_id.clone(),
            }))
        })
    }

    /// The host address of the function carrying controller `ctrl_id`
    /// (matched by name, or by the vhca the controller reports).
    pub fn bdf_of(&self, emulation: Emulation, ctrl_id: &str, vhca_id: u32) -> Option<String> {
        let kind = emulation.function_kind()?;
        let mine = || self.iter().filter(|f| f.emulation_type == kind);
        mine()
            .find(|f| f.ctrl_id.as_deref() == Some(ctrl_id))
            .or_else(|| mine().find(|f| f.vhca_id == vhca_id))
            .map(|f| f.pci_bdf)
    }

    fn free(&self, kind: EmulationType) -> impl Iterator<Item = ListedFunction> + '_ {
        self.iter().filter(move |f| {
            f.emulation_type == kind && f.ctrl_id.is_none() && f.pci_bdf != UNENUMERATED_BDF
        })
    }
}

#[derive(Debug, Clone, Copy)]
enum Hold {
    /// A create call on the object is in flight.
    Creating,
    /// The object was made (or SNAP said it exists) at this time.
    Taken(Instant),
}

/// Objects this process has just claimed for a create call, keyed by `K`:
/// the hint layered on a SNAP listing that keeps concurrent attaches that
/// read the same listing from picking the same free slot. Used for
/// emulated functions ([`FunctionPool`]) and for the namespace slots of
/// pool subsystems (`packed`).
#[derive(Debug)]
pub(crate) struct Claims<K> {
    holds: Mutex<HashMap<K, Hold>>,
}

impl<K> Default for Claims<K> {
    fn default() -> Self {
        Claims {
            holds: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone> Claims<K> {
    /// Claims the first of `candidates` (free in a listing asked for at
    /// `asked_at`) that no other caller here has claimed since; the detail
    /// travels with the claim.
    pub fn claim_first<T>(
        &self,
        asked_at: Instant,
        candidates: impl IntoIterator<Item = (K, T)>,
    ) -> Option<Claim<'_, K, T>> {
        let mut holds = self.lock();
        let now = Instant::now();
        holds.retain(|_, hold| match hold {
            Hold::Creating => true,
            Hold::Taken(at) => now.duration_since(*at) < CLAIM_MEMORY,
        });
        let (key, detail) = candidates
            .into_iter()
            .find(|(key, _)| match holds.get(key) {
                None => true,
                Some(Hold::Creating) => false,
                // The listing already reflects an object made before it was asked for.
                Some(Hold::Taken(at)) => *at < asked_at,
            })?;
        holds.insert(key.clone(), Hold::Creating);
        Some(Claim {
            claims: self,
            key,
            detail,
            settled: false,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Hold>> {
        // A panic while holding the map leaves it consistent (single inserts).
        self.holds.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The functions of one emulation type this process has just claimed, by vuid.
pub(crate) type FunctionPool = Claims<String>;

impl FunctionPool {
    /// Claims the first function of `kind` that `listing` shows free, that no
    /// other attach here has claimed since, and that is not in `skip`; the
    /// claim's detail is the function's BDF.
    pub fn claim(
        &self,
        listing: &FunctionListing,
        kind: EmulationType,
        skip: &HashSet<String>,
    ) -> Option<Claim<'_, String, String>> {
        self.claim_first(
            listing.asked_at,
            listing
                .free(kind)
                .filter(|f| !skip.contains(&f.vuid))
                .map(|f| (f.vuid, f.pci_bdf)),
        )
    }
}

/// An object picked for one create call. Dropped without [`Claim::taken`]
/// (the create failed and made nothing), it is released.
#[derive(Debug)]
pub(crate) struct Claim<'a, K: Eq + Hash + Clone, T> {
    claims: &'a Claims<K>,
    pub key: K,
    pub detail: T,
    settled: bool,
}

impl<K: Eq + Hash + Clone, T> Claim<'_, K, T> {
    /// The object exists now, or may (an unanswered create), or SNAP said it
    /// does: listings asked before now may be stale.
    pub fn taken(mut self) {
        self.claims
            .lock()
            .insert(self.key.clone(), Hold::Taken(Instant::now()));
        self.settled = true;
    }
}

impl<K: Eq + Hash + Clone, T> Drop for Claim<'_, K, T> {
    fn drop(&mut self) {
        if !self.settled {
            self.claims.lock().remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::spdk::snap::EmulationVf;

    use super::*;

    fn listing(free: &[bool]) -> FunctionListing {
        let function = |i: usize, busy: bool| (format!("26:00.{i}"), format!("VUID{i}"), busy);
        let all: Vec<_> = free
            .iter()
            .enumerate()
            .map(|(i, f)| function(i, !f))
            .collect();
        let (pf, vfs) = all.split_first().unwrap();
        FunctionListing {
            functions: vec![EmulationFunction {
                hotplugged: false,
                emulation_type: EmulationType::Nvme,
                pf_index: Some(0),
                pci_bdf: pf.0.clone(),
                vhca_id: 2,
                vuid: pf.1.clone(),
                ctrl_id: pf.2.then(|| "busy".to_string()),
                vfs: vfs
                    .iter()
                    .enumerate()
                    .map(|(i, (bdf, vuid, busy))| EmulationVf {
                        vf_index: Some(i as u32),
                        pci_bdf: bdf.clone(),
                        vhca_id: 3 + i as u32,
                        vuid: vuid.clone(),
                        ctrl_id: busy.then(|| "busy".to_string()),
                    })
                    .collect(),
            }],
            asked_at: Instant::now(),
        }
    }

    #[test]
    fn concurrent_claims_on_one_listing_get_different_functions() {
        let pool = FunctionPool::default();
        let listing = listing(&[true, false, true, true]);
        let none = HashSet::new();
        let a = pool.claim(&listing, EmulationType::Nvme, &none).unwrap();
        let b = pool.claim(&listing, EmulationType::Nvme, &none).unwrap();
        let c = pool.claim(&listing, EmulationType::Nvme, &none).unwrap();
        assert_eq!(
            [&a.detail, &b.detail, &c.detail],
            ["26:00.0", "26:00.2", "26:00.3"]
        );
        assert!(pool.claim(&listing, EmulationType::Nvme, &none).is_none());
        assert!(
            pool.claim(&listing, EmulationType::VirtioBlk, &none)
                .is_none()
        );
    }

    #[test]
    fn a_failed_create_releases_its_function_and_a_taken_one_stays_claimed_for_old_listings() {
        let pool = FunctionPool::default();
        let old = listing(&[true, true]);
        let none = HashSet::new();
        let a = pool.claim(&old, EmulationType::Nvme, &none).unwrap();
        drop(a);
        let a = pool.claim(&old, EmulationType::Nvme, &none).unwrap();
        assert_eq!(a.detail, "26:00.0");
        a.taken();
        let b = pool.claim(&old, EmulationType::Nvme, &none).unwrap();
        assert_eq!(
            b.detail, "26:00.1",
            "the old listing cannot show the new controller"
        );
        b.taken();
        // A listing asked for after the creates shows SNAP's truth again.
        std::thread::sleep(Duration::from_millis(2));
        let fresh = listing(&[true, true]);
        assert_eq!(
            pool.claim(&fresh, EmulationType::Nvme, &none)
                .unwrap()
                .detail,
            "26:00.0"
        );
    }

    #[test]
    fn skipped_and_unenumerated_functions_are_never_claimed() {
        let pool = FunctionPool::default();
        let mut listing = listing(&[true, true]);
        listing.functions[0].pci_bdf = UNENUMERATED_BDF.into();
        let skip: HashSet<String> = ["VUID1".to_string()].into();
        assert!(pool.claim(&listing, EmulationType::Nvme, &skip).is_none());
    }

    #[test]
    fn controllers_are_found_by_name_or_vhca() {
        let mut listing = listing(&[true, false]);
        listing.functions[0].vfs[0].ctrl_id = Some("NVMeCtrl7".into());
        assert_eq!(
            listing.bdf_of(Emulation::Nvme, "NVMeCtrl7", 0),
            Some("26:00.1".to_string())
        );
        assert_eq!(
            listing.bdf_of(Emulation::Nvme, "other", 2),
            Some("26:00.0".to_string())
        );
        assert_eq!(listing.bdf_of(Emulation::VirtioBlk, "NVMeCtrl7", 3), None);
        assert_eq!(listing.iter().count(), 2);
    }
}
