//! SNAP's model of what it emulates: the PCI functions a BlueField offers its
//! host (static NVMe and virtio-blk PFs with their VFs, plus PFs hot-plugged
//! at run time), and the controllers placed on them: a function carries at
//! most one, and a controller's name is unique across the emulations.
//!
//! Addresses are deterministic so tests and demos can name them: every PF owns
//! one bus of the configured ones, from 0x26 on or a guest's root ports
//! (NVMe PFs first, then virtio-blk PFs, then hot-plugged PFs on the first
//! free bus), the PF is function 0 and its VFs
//! follow as `26:00.1` .. `26:00.7`, `26:01.0`, ... `pci_bdf` carries no PCI
//! domain, as in SNAP. A hot-plugged PF reads `00:00.0` until the host has
//! enumerated it (its controller was hot-plugged).

use std::collections::HashMap;

use crate::config::FunctionLayout;
use crate::host::FunctionKind;
use crate::rpc::{EBUSY, EEXIST, EINVAL, ENODEV, ENOSPC, RpcError};
use crate::snap_api::{Emulation, FunctionView, emulation_type};

/// The kind of PCI function an emulation's functions are on the host.
pub(crate) fn host_kind(e: Emulation) -> FunctionKind {
    match e {
        Emulation::Nvme => FunctionKind::Nvme,
        Emulation::VirtioBlk => FunctionKind::VirtioBlk,
        Emulation::VirtioFs => FunctionKind::VirtioFs,
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Function {
    pub emulation: Emulation,
    pub pf_index: u32,
    pub vf_index: Option<u32>,
    /// The host-side address, `None` while a hot-plugged PF is not enumerated.
    pub bdf: Option<String>,
    pub vhca_id: u32,
    pub vuid: String,
    pub hotplugged: bool,
    pub ctrl_id: Option<String>,
    /// The PF's bus, also for a hot-plugged PF that is not enumerated yet.
    bus: u32,
}

impl Function {
    pub fn is_pf(&self) -> bool {
        self.vf_index.is_none()
    }

    /// The PCI address SNAP's answers give it, plugged or not: `0000:` and
    /// its BDF, whatever the host's domain (`--pci-domain`) is.
    pub fn pci_address(&self) -> String {
        let bdf = format_bdf(self.bus, self.vf_index.map_or(0, |v| v + 1));
        format!("0000:{bdf}")
    }

    /// What `emulation_function_list` prints for an unenumerated function.
    pub fn listed_bdf(&self) -> &str {
        self.bdf.as_deref().unwrap_or("00:00.0")
    }

    /// The function as SNAP's answers show it.
    pub fn view(&self) -> FunctionView<'_> {
        FunctionView {
            hotplugged: self.hotplugged,
            emulation: self.emulation,
            pf_index: self.pf_index,
            vf_index: self.vf_index,
            pci_bdf: self.listed_bdf(),
            vhca_id: self.vhca_id,
            vuid: &self.vuid,
            ctrl_id: self.ctrl_id.as_deref(),
        }
    }
}

/// How a SNAP request names a function.
#[derive(Debug, Default, Clone)]
pub(crate) struct Selector {
    pub pci_bdf: Option<String>,
    pub vuid: Option<String>,
    pub pf_id: Option<u32>,
    pub vf_id: Option<u32>,
    pub vhca_id: Option<u32>,
}

pub(crate) fn format_bdf(bus: u32, index: u32) -> String {
    format!("{:02x}:{:02x}.{:x}", bus, index / 8, index % 8)
}

fn make_vuid(e: Emulation, pf_index: u32, vf_index: Option<u32>) -> String {
    // Shaped like a BlueField's: board serial, emulation, PF address, VF number (1-based).
    let pf = format!("MT2400XZ0EMU{}S{pf_index}D0F0", emulation_type(e));
    match vf_index {
        Some(v) => format!("{pf}VF{}", v + 1),
        None => pf,
    }
}

#[derive(Debug)]
pub(crate) struct Functions {
    list: Vec<Function>,
    next_vhca: u32,
    /// The buses PFs take, in order.
    buses: Vec<u32>,
}

impl Functions {
    /// The static functions of `layout`, their PFs on `buses` (which must
    /// have one for each, [`crate::Config`] checks).
    pub fn new(layout: FunctionLayout, buses: Vec<u32>) -> Self {
        let mut fns = Self {
            list: vec![],
            // vhca 0 and 1 belong to the DPU's own ECPFs.
            next_vhca: 2,
            buses,
        };
        let mut free = fns.buses.clone().into_iter();
        let groups = [
            (Emulation::Nvme, layout.nvme_pfs, layout.nvme_vfs_per_pf),
            (
                Emulation::VirtioBlk,
                layout.virtio_blk_pfs,
                layout.virtio_blk_vfs_per_pf,
            ),
        ];
        let mut pfs = vec![];
        for (emulation, count, vfs) in groups {
            for pf_index in 0..count {
                let bus = free.next().expect("a bus for every static PF");
                pfs.push((emulation, pf_index, bus, vfs));
                fns.push(
                    emulation,
                    pf_index,
                    None,
                    bus,
                    Some(format_bdf(bus, 0)),
                    false,
                );
            }
        }
        // VFs are numbered after every PF, as SR-IOV enables them later.
        for (emulation, pf_index, bus, vfs) in pfs {
            for vf in 0..vfs {
                fns.push(
                    emulation,
                    pf_index,
                    Some(vf),
                    bus,
                    Some(format_bdf(bus, vf + 1)),
                    false,
                );
            }
        }
        fns
    }

    fn push(
        &mut self,
        emulation: Emulation,
        pf_index: u32,
        vf_index: Option<u32>,
        bus: u32,
        bdf: Option<String>,
        hotplugged: bool,
    ) -> &Function {
        let f = Function {
            emulation,
            pf_index,
            vf_index,
            bdf,
            vhca_id: self.next_vhca,
            vuid: make_vuid(emulation, pf_index, vf_index),
            hotplugged,
            ctrl_id: None,
            bus,
        };
        self.next_vhca += 1;
        self.list.push(f);
        &self.list[self.list.len() - 1]
    }

    pub fn iter(&self) -> impl Iterator<Item = &Function> {
        self.list.iter()
    }

    pub fn get(&self, vuid: &str) -> Option<&Function> {
        self.list.iter().find(|f| f.vuid == vuid)
    }

    /// Every function by VUID, for a caller that looks up many.
    pub fn by_vuid(&self) -> HashMap<&str, &Function> {
        self.list.iter().map(|f| (f.vuid.as_str(), f)).collect()
    }

    pub fn get_mut(&mut self, vuid: &str) -> Option<&mut Function> {
        self.list.iter_mut().find(|f| f.vuid == vuid)
    }

    /// Resolves a selector to one function of the given emulation.
    pub fn select(&self, emulation: Emulation, s: &Selector) -> Result<&Function, RpcError> {
        let ways = [
            s.pci_bdf.is_some(),
            s.vuid.is_some(),
            s.pf_id.is_some(),
            s.vhca_id.is_some(),
        ];
        if ways.iter().filter(|w| **w).count() != 1 || (s.vf_id.is_some() && s.pf_id.is_none()) {
            return Err(RpcError::errno(EINVAL));
        }
        let mut mine = self.list.iter().filter(|f| f.emulation == emulation);
        let found = if let Some(bdf) = &s.pci_bdf {
            mine.find(|f| f.bdf.as_deref() == Some(bdf.as_str()))
        } else if let Some(vuid) = &s.vuid {
            mine.find(|f| &f.vuid == vuid)
        } else if let Some(vhca) = s.vhca_id {
            mine.find(|f| f.vhca_id == vhca)
        } else {
            mine.find(|f| Some(f.pf_index) == s.pf_id && f.vf_index == s.vf_id)
        };
        found.ok_or(RpcError::errno(ENODEV))
    }

    /// Adds a hot-plug PF; the host will not see it before it is plugged.
    pub fn create_hotplug(&mut self, emulation: Emulation) -> Result<&Function, RpcError> {
        let used: Vec<u32> = self
            .list
            .iter()
            .filter(|f| f.is_pf())
            .map(|f| f.bus)
            .collect();
        let bus = self
            .buses
            .iter()
            .copied()
            .find(|b| !used.contains(b))
            .ok_or(RpcError::errno(ENOSPC))?;
        let pf_index = self
            .list
            .iter()
            .filter(|f| f.emulation == emulation && f.is_pf())
            .map(|f| f.pf_index + 1)
            .max()
            .unwrap_or(0);
        Ok(self.push(emulation, pf_index, None, bus, None, true))
    }

    /// The address a hot-plugged PF gets when the host enumerates it.
    pub fn enumerate(&mut self, vuid: &str) -> Option<String> {
        let f = self.get_mut(vuid)?;
        let bdf = format_bdf(f.bus, 0);
        f.bdf = Some(bdf.clone());
        Some(bdf)
    }

    pub fn remove(&mut self, vuid: &str) {
        self.list.retain(|f| f.vuid != vuid);
    }

    /// Whether a controller of any emulation has this name: every
    /// controller sits on a function, which names it.
    fn ctrl_name_taken(&self, name: &str) -> bool {
        self.list.iter().any(|f| f.ctrl_id.as_deref() == Some(name))
    }

    /// Where a new controller goes and what it is called: the selected
    /// function, which must not carry a controller yet, and the requested
    /// name (unique across the emulations) or SNAP's next default one,
    /// `prefix` and the next of `next` free. Returns the function's VUID
    /// and the controller's name; the function carries it from now on.
    pub fn place_ctrl(
        &mut self,
        e: Emulation,
        sel: &Selector,
        name: Option<String>,
        prefix: &str,
        next: &mut u32,
    ) -> Result<(String, String), RpcError> {
        let f = self.select(e, sel)?;
        if f.ctrl_id.is_some() {
            return Err(RpcError::errno(EBUSY));
        }
        let vuid = f.vuid.clone();
        let ctrl_id = match name {
            Some(name) if self.ctrl_name_taken(&name) => return Err(RpcError::errno(EEXIST)),
            Some(name) => name,
            None => loop {
                let name = format!("{prefix}{next}");
                *next += 1;
                if !self.ctrl_name_taken(&name) {
                    break name;
                }
            },
        };
        if let Some(f) = self.get_mut(&vuid) {
            f.ctrl_id = Some(ctrl_id.clone());
        }
        Ok((vuid, ctrl_id))
    }

    /// The controller on function `vuid` is gone.
    pub fn clear_ctrl(&mut self, vuid: &str) {
        if let Some(f) = self.get_mut(vuid) {
            f.ctrl_id = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn default_layout_is_deterministic() {
        let f = Functions::new(FunctionLayout::default(), Config::new("s", "d").buses());
        let bdfs: Vec<&str> = f.iter().map(|f| f.listed_bdf()).collect();
        assert_eq!(bdfs.len(), 34);
        assert_eq!(&bdfs[..2], ["26:00.0", "27:00.0"]);
        assert_eq!(
            &bdfs[2..11],
            [
                "26:00.1", "26:00.2", "26:00.3", "26:00.4", "26:00.5", "26:00.6", "26:00.7",
                "26:01.0", "26:01.1"
            ]
        );
        assert_eq!(bdfs[17], "26:02.0");
        assert_eq!(bdfs[18], "27:00.1");
        let vhca: Vec<u32> = f.iter().map(|f| f.vhca_id).collect();
        assert_eq!(vhca, (2..36).collect::<Vec<_>>());
        let vf = f.iter().nth(2).unwrap();
        assert_eq!(vf.vuid, "MT2400XZ0EMUNVMES0D0F0VF1");
        assert_eq!(vf.vf_index, Some(0));
    }

    #[test]
    fn selectors_resolve_one_function() {
        let f = Functions::new(FunctionLayout::default(), Config::new("s", "d").buses());
        let by_bdf = Selector {
            pci_bdf: Some("26:00.1".into()),
            ..Default::default()
        };
        assert_eq!(
            f.select(Emulation::Nvme, &by_bdf).unwrap().vf_index,
            Some(0)
        );
        assert_eq!(
            f.select(Emulation::VirtioBlk, &by_bdf).unwrap_err().code,
            -19
        );
        let by_pf = Selector {
            pf_id: Some(0),
            vf_id: Some(15),
            ..Default::default()
        };
        assert_eq!(
            f.select(Emulation::VirtioBlk, &by_pf)
                .unwrap()
                .bdf
                .as_deref(),
            Some("27:02.0")
        );
        assert_eq!(
            f.select(Emulation::Nvme, &Selector::default())
                .unwrap_err()
                .code,
            -22
        );
    }

    #[test]
    fn hotplug_pfs_take_the_next_free_bus() {
        let mut f = Functions::new(FunctionLayout::default(), Config::new("s", "d").buses());
        let (vuid, pf_index) = {
            let h = f.create_hotplug(Emulation::Nvme).unwrap();
            (h.vuid.clone(), h.pf_index)
        };
        assert_eq!(pf_index, 1);
        assert_eq!(f.get(&vuid).unwrap().listed_bdf(), "00:00.0");
        assert_eq!(f.enumerate(&vuid).as_deref(), Some("28:00.0"));
        f.remove(&vuid);
        assert!(f.get(&vuid).is_none());
    }
}
