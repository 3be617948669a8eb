//! CreateDevice of an NVMe-oF volume: one path, one
//! `bdev_nvme_attach_controller`; several (its context lists
//! `extra_paths`), every path's attach at once and then the bdev's policy,
//! two dependent round trips whatever their number. Each path's attach
//! and the keeper of a multipath device's paths are [`crate::paths`].

use futures::future::join_all;
use snap_csi::spdk::nvme::BdevNvmeSetMultipathPolicy;
use tokio::time::Instant;
use tonic::Status;

use crate::backend::{Kind, NvmfTarget};
use crate::errors::Failure;
use crate::names::{device_name, object_name};
use crate::paths::{self, is_attached_already};
use crate::service::SpdkPlugin;

/// How a multipath device spreads its I/O: one current path, the next
/// available one taking over when it is lost (and giving it back when it
/// returns: SPDK's auto failback). Failover, not bandwidth, is what a second
/// path is for here; `active_active` would also spread one volume's I/O
/// over both listeners of the same target, gaining nothing on a target
/// whose paths share its cores and disks. SPDK v24.09's default, set
/// explicitly so that a SNAP built with another default behaves the same.
pub const MULTIPATH_POLICY: &str = "active_passive";

impl SpdkPlugin {
    pub(crate) async fn create_nvmf(
        &self,
        volume_id: &str,
        target: &NvmfTarget,
        deadline: Instant,
    ) -> Result<String, Status> {
        if target.is_multipath() {
            return self.create_multipath(volume_id, target, deadline).await;
        }
        let controller = object_name(Kind::Nvmf, volume_id);
        let device = device_name(Kind::Nvmf, volume_id);
        let what = format!(
            "attaching NVMe-oF controller {controller} to {} {}:{} {}",
            target.trtype, target.traddr, target.trsvcid, target.subnqn
        );
        let attach = paths::attach(&controller, target, &target.paths()[0]);
        match self.spdk().call_until(&attach, deadline).await {
            Ok(bdevs) if bdevs.contains(&device) => {
                tracing::info!(%volume_id, %device, "NVMe-oF controller attached");
                Ok(device)
            }
            Ok(bdevs) => Err(self
                .no_namespace_1(volume_id, &what, &bdevs, deadline)
                .await),
            Err(e) if e.is_already_attached() => {
                tracing::debug!(%volume_id, %device, "NVMe-oF controller already attached");
                Ok(device)
            }
            Err(e) => Err(Failure::attach(what, e).into()),
        }
    }

    /// A device that is not there would fail later in SNAP with a far worse
    /// message: leaves nothing attached on a refusal.
    async fn no_namespace_1(
        &self,
        volume_id: &str,
        what: &str,
        bdevs: &[String],
        deadline: Instant,
    ) -> Status {
        if let Err(status) = self.delete_object(Kind::Nvmf, volume_id, deadline).await {
            return status;
        }
        Status::failed_precondition(format!(
            "{what}: the subsystem has no namespace 1 (SPDK made bdevs {bdevs:?})"
        ))
    }

    /// A multipath device: every path attached at once (the first to connect
    /// makes the controller and its bdev, the others join it; a path there
    /// already answers -114 or -17), then the bdev's policy: two dependent
    /// round trips, whatever the number of paths, also for a retry. It is
    /// made when one path at least is attached: the others are left to the
    /// keeper ([`crate::paths`]), which attaches them once they answer.
    async fn create_multipath(
        &self,
        volume_id: &str,
        target: &NvmfTarget,
        deadline: Instant,
    ) -> Result<String, Status> {
        let controller = object_name(Kind::Nvmf, volume_id);
        let device = device_name(Kind::Nvmf, volume_id);
        let paths = target.paths();
        let listed = paths
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let what = format!(
            "attaching NVMe-oF controller {controller} to {} {} over {listed}",
            target.trtype, target.subnqn
        );
        let attaches: Vec<_> = paths
            .iter()
            .map(|path| paths::attach_path(&controller, target, path))
            .collect();
        let results = join_all(attaches.iter().map(|a| self.spdk().call_until(a, deadline))).await;
        let mut up = 0;
        let mut down = vec![];
        for (path, result) in paths.iter().zip(results) {
            match result {
                Ok(bdevs) if !bdevs.contains(&device) => {
                    return Err(self
                        .no_namespace_1(volume_id, &what, &bdevs, deadline)
                        .await);
                }
                Ok(_) => up += 1,
                Err(e) if is_attached_already(&e) => up += 1,
                Err(e) => down.push((path, e)),
            }
        }
        if up == 0 {
            let failures = down
                .iter()
                .map(|(path, e)| format!("{path}: {e}"))
                .collect::<Vec<_>>()
                .join("; ");
            // A path that may come back (nothing answers there now) makes
            // the whole retryable; else the first path's refusal says why.
            let statuses: Vec<Status> = down
                .into_iter()
                .map(|(_, e)| Status::from(Failure::attach(what.clone(), e)))
                .collect();
            let status = statuses
                .iter()
                .find(|s| s.code() == tonic::Code::Unavailable)
                .unwrap_or(&statuses[0]);
            return Err(Status::new(
                status.code(),
                format!(
                    "{} (no path could be attached: {failures})",
                    status.message()
                ),
            ));
        }
        let policy = BdevNvmeSetMultipathPolicy {
            name: device.clone(),
            policy: MULTIPATH_POLICY.into(),
            selector: None,
            rr_min_io: None,
        };
        match self.spdk().call_until(&policy, deadline).await {
            Ok(_) => {}
            Err(e) if e.is_no_such_device() => {
                return Err(Status::failed_precondition(format!(
                    "{what}: SPDK has no bdev {device}, though its paths answered \
                     \"already attached\": another controller holds them ({e})"
                )));
            }
            Err(e) => {
                return Err(Failure::snap(
                    format!("setting multipath policy {MULTIPATH_POLICY} of {device}"),
                    e,
                )
                .into());
            }
        }
        self.keep_paths_of(&controller, volume_id, target);
        for (path, e) in &down {
            tracing::warn!(%volume_id, %device, %path,
                "path not attached, left to the keeper (every {:?}): {e}", paths::PERIOD);
        }
        tracing::info!(%volume_id, %device, paths = up, of = paths.len(),
            "NVMe-oF multipath device attached");
        Ok(device)
    }
}
