//! [`HostLocator`]: where the host finds a volume the DPU exposed, one
//! variant per emulation. It knows how to find itself in sysfs and how to
//! describe itself in a message, so the node asks it rather than matching
//! on emulations. It crosses the DPU agent link (`dpu/wire.rs`) and is kept
//! in the node's per-volume records as JSON (`{"kind": "nvme", ...}`): a new
//! variant is a new `kind`, and the existing ones keep their fields.

use super::sysfs::{BlockDevice, HostError, Sysfs};

/// Where the host finds the attached volume: a function and the identity
/// of the volume's disk on it, never a kernel name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HostLocator {
    Nvme {
        /// Host PCI address, without domain (`"26:00.1"`) on the first DPU's
        /// domain 0, with it on another (`"0001:26:00.1"`).
        bdf: String,
        nsid: u32,
        /// Namespace UUID when known (verifies a reused function).
        uuid: Option<String>,
        /// The controller's serial, when the subsystem is the volume's own:
        /// it identifies the namespace where the host's kernel lists no
        /// UUID (`Sysfs::find_nvme_namespace`). Records written before it
        /// existed have none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        serial: Option<String>,
    },
    VirtioBlk {
        bdf: String,
        serial: String,
    },
    /// A filesystem device: no disk, the host mounts it by its tag.
    VirtioFs {
        tag: String,
    },
}

impl HostLocator {
    /// The volume's block device, if the host shows it ready now; a
    /// filesystem device has none.
    pub fn find(&self, sysfs: &Sysfs) -> Result<Option<BlockDevice>, HostError> {
        match self {
            HostLocator::Nvme {
                bdf,
                nsid,
                uuid,
                serial,
            } => sysfs.find_nvme_namespace(bdf, *nsid, uuid.as_deref(), serial.as_deref()),
            HostLocator::VirtioBlk { bdf, serial } => sysfs.find_virtio_blk(bdf, serial),
            HostLocator::VirtioFs { .. } => Ok(None),
        }
    }

    /// The locator as a host with several DPUs sees it: SNAP gives a
    /// function's address without a domain, and each DPU's functions appear
    /// in the domain the node's configuration gives it. Domain 0 keeps the
    /// address as SNAP gave it, as records of a one-DPU node hold it.
    pub fn in_pci_domain(self, domain: u16) -> HostLocator {
        let with_domain = |bdf: String| match domain {
            0 => bdf,
            _ if bdf.matches(':').count() >= 2 => bdf,
            _ => format!("{domain:04x}:{bdf}"),
        };
        match self {
            HostLocator::Nvme {
                bdf,
                nsid,
                uuid,
                serial,
            } => HostLocator::Nvme {
                bdf: with_domain(bdf),
                nsid,
                uuid,
                serial,
            },
            HostLocator::VirtioBlk { bdf, serial } => HostLocator::VirtioBlk {
                bdf: with_domain(bdf),
                serial,
            },
            fs @ HostLocator::VirtioFs { .. } => fs,
        }
    }

    /// The tag a filesystem device is mounted by; `None` for a disk.
    pub fn tag(&self) -> Option<&str> {
        match self {
            HostLocator::VirtioFs { tag } => Some(tag),
            HostLocator::Nvme { .. } | HostLocator::VirtioBlk { .. } => None,
        }
    }
}

/// The function and the identity the host checks, for messages.
impl std::fmt::Display for HostLocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostLocator::Nvme {
                bdf, nsid, uuid, ..
            } => write!(
                f,
                "function {bdf}, NSID {nsid}, UUID {}",
                uuid.as_deref().unwrap_or("not checked")
            ),
            HostLocator::VirtioBlk { bdf, serial } => {
                write!(f, "function {bdf}, serial {serial:?}")
            }
            HostLocator::VirtioFs { tag } => write!(f, "virtio-fs tag {tag:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_of_every_kind_keep_their_json() {
        // Records written by earlier nodes hold exactly these.
        let nvme: HostLocator = serde_json::from_str(
            r#"{"kind":"nvme","bdf":"26:00.1","nsid":1,"uuid":"6aaea650-8ef7-5653-a05a-0aea9d997ec8"}"#,
        )
        .unwrap();
        assert_eq!(
            nvme.to_string(),
            "function 26:00.1, NSID 1, UUID 6aaea650-8ef7-5653-a05a-0aea9d997ec8"
        );
        let unchecked: HostLocator =
            serde_json::from_str(r#"{"kind":"nvme","bdf":"26:00.1","nsid":2,"uuid":null}"#)
                .unwrap();
        assert_eq!(
            unchecked.to_string(),
            "function 26:00.1, NSID 2, UUID not checked"
        );
        let virtio: HostLocator = serde_json::from_str(
            r#"{"kind":"virtio_blk","bdf":"27:00.2","serial":"sc-6aaea6508ef75653a"}"#,
        )
        .unwrap();
        assert_eq!(
            virtio.to_string(),
            "function 27:00.2, serial \"sc-6aaea6508ef75653a\""
        );
        let fs: HostLocator = serde_json::from_str(
            r#"{"kind":"virtio_fs","tag":"sc-6aaea6508ef75653a05a0aea9d997ec8"}"#,
        )
        .unwrap();
        assert_eq!(
            fs.to_string(),
            "virtio-fs tag \"sc-6aaea6508ef75653a05a0aea9d997ec8\""
        );
        assert_eq!(
            nvme.clone().in_pci_domain(0),
            nvme,
            "domain 0 keeps the records of one-DPU nodes"
        );
        assert_eq!(
            virtio.clone().in_pci_domain(0x1a).to_string(),
            "function 001a:27:00.2, serial \"sc-6aaea6508ef75653a\""
        );
        assert_eq!(fs.clone().in_pci_domain(1), fs);
        for locator in [nvme, unchecked, virtio, fs] {
            let json = serde_json::to_string(&locator).unwrap();
            assert_eq!(serde_json::from_str::<HostLocator>(&json).unwrap(), locator);
        }
    }
}
