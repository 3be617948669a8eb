//! [`Placing`]: the DPUs each volume's stages tried that its record does
//! not name, written down before each is tried, so that what they may hold
//! is known after a crash ([`super::placement`] decides and clears).

use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::NodeError;
use crate::json_dir::JsonDir;

/// The DPUs each volume's stages tried that its record does not name: a
/// file per volume, while there are any (none on a host with one DPU).
#[derive(Debug, Clone)]
pub(super) struct Placing {
    dir: JsonDir,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Tried {
    volume_id: String,
    dpus: Vec<String>,
}

impl Placing {
    pub(super) fn open(dir: &Path) -> io::Result<Placing> {
        Ok(Placing {
            dir: JsonDir::open(dir)?,
        })
    }

    pub(super) fn tried(&self, volume_id: &str) -> Result<Vec<String>, NodeError> {
        let tried: Option<Tried> = self
            .dir
            .load(volume_id)
            .map_err(|e| NodeError::state("reading the DPUs a stage tried", e))?;
        Ok(tried.map(|t| t.dpus).unwrap_or_default())
    }

    pub(super) fn keep(&self, volume_id: &str, dpus: Vec<String>) -> Result<(), NodeError> {
        let kept = match dpus.is_empty() {
            true => self.dir.remove(volume_id),
            false => self.dir.store(
                volume_id,
                &Tried {
                    volume_id: volume_id.to_string(),
                    dpus,
                },
            ),
        };
        kept.map_err(|e| NodeError::state("writing the DPUs a stage tried", e))
    }

    /// `dpu` is about to be tried (last in the list).
    pub(super) fn trying(&self, volume_id: &str, dpu: &str) -> Result<(), NodeError> {
        let mut dpus = self.tried(volume_id)?;
        if dpus.last().is_some_and(|d| d == dpu) {
            return Ok(());
        }
        dpus.retain(|d| d != dpu);
        dpus.push(dpu.to_string());
        self.keep(volume_id, dpus)
    }

    pub(super) fn forget(&self, volume_id: &str, dpu: &str) -> Result<Vec<String>, NodeError> {
        let mut dpus = self.tried(volume_id)?;
        let before = dpus.len();
        dpus.retain(|d| d != dpu);
        if dpus.len() != before {
            self.keep(volume_id, dpus.clone())?;
        }
        Ok(dpus)
    }

    /// Every volume with DPUs to clear, for a restart.
    pub(super) fn all(&self) -> Vec<(String, Vec<String>)> {
        match self.dir.all::<Tried>() {
            Ok(all) => all
                .into_iter()
                .filter_map(|t| match t {
                    Ok(t) => Some((t.volume_id, t.dpus)),
                    Err((path, e)) => {
                        tracing::warn!(path = %path.display(), "cannot read which DPUs a stage tried: {e}");
                        None
                    }
                })
                .collect(),
            Err(e) => {
                tracing::warn!("cannot list which DPUs stages tried: {e}");
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dpus_tried_are_kept_in_order_until_each_is_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let placing = Placing::open(dir.path()).unwrap();
        assert!(placing.tried("pvc-1").unwrap().is_empty());
        placing.trying("pvc-1", "bf3-a").unwrap();
        placing.trying("pvc-1", "bf3-b").unwrap();
        // A retry on the first again moves it last: the one to continue on.
        placing.trying("pvc-1", "bf3-a").unwrap();
        assert_eq!(placing.tried("pvc-1").unwrap(), ["bf3-b", "bf3-a"]);
        // A restart finds it with its volume id.
        let reopened = Placing::open(dir.path()).unwrap();
        assert_eq!(
            reopened.all(),
            [(
                "pvc-1".to_string(),
                vec!["bf3-b".to_string(), "bf3-a".to_string()]
            )]
        );
        assert_eq!(placing.forget("pvc-1", "bf3-a").unwrap(), ["bf3-b"]);
        assert_eq!(
            placing.forget("pvc-1", "bf3-b").unwrap(),
            Vec::<String>::new()
        );
        assert!(placing.all().is_empty(), "no file once none is left");
    }
}
