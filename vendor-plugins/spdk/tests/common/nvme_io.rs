//! Reads and writes a volume's bytes as a host would, through an SPDK that
//! attaches to the volume's NVMe-oF subsystem over NVMe/TCP and sends raw
//! NVMe read and write commands (`bdev_nvme_send_cmd`). Real SPDK only: the
//! emulator's fabrics link is not NVMe/TCP and it has no such method.

use base64::Engine;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use serde_json::{Value, json};
use snap_csi::jsonrpc::RpcClient;
use snap_csi::spdk::bdev::BdevGetBdevs;
use snap_csi::spdk::nvme::{BdevNvmeAttachController, BdevNvmeDetachController};
use tokio::time::Instant;

use super::TIMEOUT;

const READ: u8 = 0x02;
const WRITE: u8 = 0x01;
/// The controller name used while a transfer lasts.
const CONTROLLER: &str = "io";

/// URL-safe base64 as SPDK takes it: padded (its decoder wants padding).
/// What it writes back is decoded padded or not.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// An NVMe-oF subsystem's namespace 1, as an initiator reaches it.
pub struct Remote<'a> {
    pub initiator: RpcClient,
    pub traddr: &'a str,
    pub trsvcid: &'a str,
    pub subnqn: &'a str,
}

impl Remote<'_> {
    /// `len` bytes at `offset`.
    pub async fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let session = self.attach(CONTROLLER).await;
        let data = session.read(offset, len).await;
        session.detach().await;
        data
    }

    /// `bytes` at `offset` (the blocks around them read first and kept).
    pub async fn write(&self, offset: u64, bytes: &[u8]) {
        let session = self.attach(CONTROLLER).await;
        session.write(offset, bytes).await;
        session.detach().await;
    }

    /// Attaches the subsystem as controller `name` for many transfers until
    /// [`Session::detach`]. [`Remote::read`] and [`Remote::write`] attach
    /// for one, so each is a fresh connection as a new host's would be.
    pub async fn attach(&self, name: &str) -> Session<'_> {
        let bdevs = self
            .initiator
            .call(&BdevNvmeAttachController {
                name: name.into(),
                trtype: "tcp".into(),
                traddr: self.traddr.into(),
                adrfam: Some("ipv4".into()),
                trsvcid: Some(self.trsvcid.into()),
                subnqn: Some(self.subnqn.into()),
                hostnqn: None,
                ctrlr_loss_timeout_sec: None,
                reconnect_delay_sec: None,
            })
            .await
            .unwrap();
        let bdev = &self
            .initiator
            .call(&BdevGetBdevs {
                name: Some(bdevs[0].clone()),
                timeout: None,
            })
            .await
            .unwrap()[0];
        Session {
            initiator: &self.initiator,
            name: name.to_string(),
            bdev: bdev.name.clone(),
            block_size: u64::from(bdev.block_size),
        }
    }
}

/// An attached subsystem's namespace 1.
pub struct Session<'a> {
    initiator: &'a RpcClient,
    name: String,
    /// The initiator's bdev of the namespace.
    bdev: String,
    block_size: u64,
}

impl Session<'_> {
    /// `len` bytes at `offset`.
    pub async fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let (first, blocks) = span(offset, len, self.block_size);
        let data = self.transfer(READ, first, blocks, None).await;
        let start = (offset - first * self.block_size) as usize;
        data[start..start + len].to_vec()
    }

    /// `bytes` at `offset` (the blocks around them read first and kept).
    pub async fn write(&self, offset: u64, bytes: &[u8]) {
        let (first, blocks) = span(offset, bytes.len(), self.block_size);
        let mut data = self.transfer(READ, first, blocks, None).await;
        let start = (offset - first * self.block_size) as usize;
        data[start..start + bytes.len()].copy_from_slice(bytes);
        self.transfer(WRITE, first, blocks, Some(&data)).await;
    }

    /// Whole blocks at block `first`, nothing read first.
    pub async fn write_blocks(&self, first: u64, data: &[u8]) {
        assert_eq!(data.len() as u64 % self.block_size, 0, "whole blocks");
        let blocks = (data.len() as u64 / self.block_size) as u32;
        self.transfer(WRITE, first, blocks, Some(data)).await;
    }

    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// The namespace's size as the initiator's bdev has it now.
    pub async fn size(&self) -> u64 {
        let query = BdevGetBdevs {
            name: Some(self.bdev.clone()),
            timeout: None,
        };
        self.initiator.call(&query).await.unwrap()[0].num_blocks * self.block_size
    }

    pub async fn detach(self) {
        self.initiator
            .call(&BdevNvmeDetachController { name: self.name })
            .await
            .unwrap();
    }

    /// Whole blocks at block `first`, as [`Session::write_blocks`], waiting
    /// at most `within` for the command: the failed command's reply, or
    /// SPDK's error, instead of a panic.
    pub async fn try_write_blocks(
        &self,
        first: u64,
        data: &[u8],
        within: std::time::Duration,
    ) -> Result<(), String> {
        assert_eq!(data.len() as u64 % self.block_size, 0, "whole blocks");
        let blocks = (data.len() as u64 / self.block_size) as u32;
        self.try_transfer(WRITE, first, blocks, Some(data), within)
            .await
            .map(drop)
    }

    /// One NVMe I/O command on namespace 1; returns what a read read.
    async fn transfer(&self, opcode: u8, first: u64, blocks: u32, data: Option<&[u8]>) -> Vec<u8> {
        self.try_transfer(opcode, first, blocks, data, TIMEOUT)
            .await
            .unwrap_or_else(|error| panic!("{error}"))
    }

    async fn try_transfer(
        &self,
        opcode: u8,
        first: u64,
        blocks: u32,
        data: Option<&[u8]>,
        within: std::time::Duration,
    ) -> Result<Vec<u8>, String> {
        let mut params = json!({
            "name": self.name,
            "cmd_type": "io",
            "cmdbuf": BASE64.encode(command(opcode, first, blocks)),
            "timeout_ms": within.as_millis() as u64,
        });
        match data {
            // Without data_len: SPDK would check it against a length it
            // derives from the padded text, two bytes too long.
            Some(data) => {
                params["data_direction"] = json!("h2c");
                params["data"] = json!(BASE64.encode(data));
            }
            None => {
                params["data_direction"] = json!("c2h");
                params["data_len"] = json!(u64::from(blocks) * self.block_size);
            }
        }
        let reply = self
            .initiator
            .call_raw(
                "bdev_nvme_send_cmd",
                Some(&params),
                Instant::now() + within + TIMEOUT,
            )
            .await
            .map_err(|error| format!("NVMe command {opcode:#x}: {error}"))?;
        let completion = BASE64.decode(reply["cpl"].as_str().unwrap()).unwrap();
        // Completion dword 3's upper half: phase tag, then the status field.
        let status = u16::from_le_bytes([completion[14], completion[15]]) >> 1;
        if status != 0 {
            return Err(format!("NVMe command {opcode:#x} failed: {reply}"));
        }
        Ok(match reply.get("data").and_then(Value::as_str) {
            Some(text) => BASE64.decode(text).unwrap(),
            None => vec![],
        })
    }
}

/// The first block and the number of blocks holding `len` bytes at `offset`.
fn span(offset: u64, len: usize, block_size: u64) -> (u64, u32) {
    let first = offset / block_size;
    let last = (offset + len as u64 - 1) / block_size;
    (first, (last - first + 1) as u32)
}

/// A 64-byte NVMe submission queue entry for a read or write of namespace 1.
fn command(opcode: u8, first: u64, blocks: u32) -> [u8; 64] {
    let mut cmd = [0u8; 64];
    cmd[0] = opcode;
    cmd[4..8].copy_from_slice(&1u32.to_le_bytes());
    // CDW10-11: starting LBA; CDW12: number of blocks, 0-based.
    cmd[40..48].copy_from_slice(&first.to_le_bytes());
    cmd[48..52].copy_from_slice(&(blocks - 1).to_le_bytes());
    cmd
}
