//! Helpers shared by the integration tests: starting emulators in-process,
//! a small JSON-RPC client, transcript parsing and shape-aware comparison.

#![allow(dead_code)] // Each test binary uses a different subset.

// A real spdk_tgt for the parity suite (shared with the other test crates;
// it uses no snap-csi code).
#[path = "../../../../tests/common/real_spdk.rs"]
pub mod real_spdk;

pub mod binary;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use snap_emu::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// An emulator served by this process until [`Emu::stop`].
pub struct Emu {
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub sysfs_root: PathBuf,
    /// The poller's count of dependent round trips.
    pub rounds: snap_emu::Rounds,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Emu {
    pub async fn start(config: Config) -> Self {
        let state_dir = config.state_dir.clone();
        let sysfs_root = config.effective_sysfs_root();
        let server = snap_emu::bind(config).await.expect("emulator binds");
        let socket = server.socket().to_owned();
        let rounds = server.rounds();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(async {
            let _ = rx.await;
        }));
        Self {
            socket,
            state_dir,
            sysfs_root,
            rounds,
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// A remote NVMe-oF target (plain `spdk_tgt`) and a DPU's SNAP, each with
    /// its own state directory under `dir`: the vendor plugin's two peers.
    pub async fn start_target_and_dpu(dir: &Path) -> (Self, Self) {
        let target_dir = dir.join("target");
        let dpu_dir = dir.join("dpu");
        std::fs::create_dir_all(&target_dir).expect("target state dir");
        std::fs::create_dir_all(&dpu_dir).expect("dpu state dir");
        let target = Self::start(Config::for_test(&target_dir).without_snap()).await;
        let dpu = Self::start(Config::for_test(&dpu_dir)).await;
        (target, dpu)
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.socket).await
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await
                .expect("server task")
                .expect("server stops cleanly");
        }
    }
}

impl Drop for Emu {
    /// A test that panics drops its emulator, and then its temporary state
    /// directory: stop the server first, or the records of its loop devices
    /// would be gone before it could detach them. The server runs on the
    /// runtime's workers, so waiting here (on the test's thread) lets it finish.
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = &self.task {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while !task.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// A JSON-RPC client that reads replies with a streaming decoder.
pub struct Client {
    stream: UnixStream,
    buf: Vec<u8>,
    next_id: u64,
}

/// The first VF of `emulation`'s PFs that has no controller, as SNAP
/// names it: a BDF without a domain.
pub async fn free_vf(c: &mut Client, emulation: &str) -> String {
    let fns = c.ok("emulation_function_list", json!({"all": true})).await;
    fns.as_array()
        .unwrap()
        .iter()
        .filter(|pf| pf["emulation_type"] == emulation)
        .flat_map(|pf| pf["vfs"].as_array().unwrap().iter())
        .find(|vf| vf.get("ctrl_id").is_none())
        .map(|vf| vf["pci_bdf"].as_str().unwrap().to_owned())
        .expect("a free VF")
}

/// What DPF sets up once for virtio-fs: the AIO fsdev `fs0` over `share`,
/// the DOCA transport, started, and the manager `mlx5_0`.
pub async fn virtio_fs_ready(c: &mut Client, share: &Path) {
    let created = c
        .ok(
            "fsdev_aio_create",
            json!({"name": "fs0", "root_path": share}),
        )
        .await;
    assert_eq!(created, json!("fs0"));
    let doca = json!({"transport_name": "DOCA"});
    c.ok("virtio_fs_transport_create", doca.clone()).await;
    c.ok("virtio_fs_transport_start", doca).await;
    c.ok(
        "virtio_fs_doca_manager_create",
        json!({"manager": "mlx5_0"}),
    )
    .await;
}

/// An emulator ready for virtio-fs devices ([`virtio_fs_ready`]: the fsdev
/// `fs0` over the fresh directory `share`), and the directory its hosts
/// mount them under.
pub struct VirtioFsFixture {
    pub emu: Emu,
    pub client: Client,
    pub virtiofs_dir: PathBuf,
    pub share: PathBuf,
    pub dir: tempfile::TempDir,
}

impl VirtioFsFixture {
    pub async fn start() -> VirtioFsFixture {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let share = dir.path().join("share");
        // Pods run as other users: they must reach the tree.
        for d in [dir.path(), &share] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let config = Config::for_test(dir.path());
        let virtiofs_dir = config.effective_virtiofs_dir();
        let emu = Emu::start(config).await;
        let mut client = emu.client().await;
        virtio_fs_ready(&mut client, &share).await;
        VirtioFsFixture {
            emu,
            client,
            virtiofs_dir,
            share,
            dir,
        }
    }

    /// [`virtio_fs_attach`]: returns the function's VUID.
    pub async fn attach(&mut self, dev: &str, tag: &str) -> String {
        virtio_fs_attach(&mut self.client, dev, tag).await
    }

    /// A host's mount of a new device `tag` over `fs0`.
    pub async fn host(&mut self, tag: &str) -> HostMount {
        self.attach(&format!("dev-{tag}"), tag).await;
        let at = self.dir.path().join("hosts").join(tag);
        HostMount::new(&self.virtiofs_dir, tag, &at)
    }
}

/// A host's mount of the virtio-fs device `tag` (its socket in `devices`)
/// at `at`, as the node makes it where a real host runs `mount -t virtiofs`;
/// unmounted when dropped.
#[derive(Debug)]
pub struct HostMount(PathBuf);

impl HostMount {
    pub fn new(devices: &Path, tag: &str, at: &Path) -> HostMount {
        Self::try_new(devices, tag, at)
            .unwrap_or_else(|e| panic!("mounting {tag} at {}: {e}", at.display()))
    }

    /// ENOENT: the host has no device with that tag.
    pub fn try_new(devices: &Path, tag: &str, at: &Path) -> Result<HostMount, nix::errno::Errno> {
        std::fs::create_dir_all(at).unwrap();
        let flags = nix::mount::MsFlags::empty();
        fuse_handoff::mount(devices, tag, at, flags, REPLY_TIMEOUT)?;
        Ok(HostMount(at.to_owned()))
    }
}

impl std::ops::Deref for HostMount {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for HostMount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// DPF's attach after [`virtio_fs_ready`]: a function, a device on it
/// serving `fs0` under `tag`, bound, started, hot-plugged. Returns the
/// function's VUID.
pub async fn virtio_fs_attach(c: &mut Client, dev: &str, tag: &str) -> String {
    let vuid = c
        .ok(
            "virtio_fs_doca_function_create",
            json!({"manager": "mlx5_0"}),
        )
        .await;
    let vuid = vuid.as_str().expect("a VUID").to_owned();
    let device = json!({"transport_name": "DOCA", "dev_name": dev, "tag": tag,
        "fsdev": "fs0", "num_request_queues": 2, "queue_size": 256, "driver_platform": "x86_64"});
    c.ok("virtio_fs_device_create", device).await;
    let bind = json!({"dev_name": dev, "manager": "mlx5_0", "vuid": vuid});
    c.ok("virtio_fs_doca_device_modify", bind).await;
    c.ok("virtio_fs_device_start", json!({"dev_name": dev}))
        .await;
    let plug = json!({"dev_name": dev, "wait_for_done": true});
    c.ok("virtio_fs_doca_device_hotplug", plug).await;
    vuid
}

impl Client {
    pub async fn connect(path: &Path) -> Self {
        let stream = UnixStream::connect(path)
            .await
            .expect("connect to emulator");
        Self {
            stream,
            buf: vec![],
            next_id: 1,
        }
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    /// Calls a method and returns its reply line as sent, for byte comparisons.
    pub async fn call_raw(&mut self, method: &str, params: Value) -> Vec<u8> {
        let id = self.next_id;
        self.next_id += 1;
        let req = json!({"jsonrpc": "2.0", "method": method, "id": id, "params": params});
        self.send_raw(&serde_json::to_vec(&req).expect("encode"))
            .await;
        // `read_value` leaves the newline that ends a reply.
        let leading = self
            .buf
            .iter()
            .take_while(|b| b.is_ascii_whitespace())
            .count();
        self.buf.drain(..leading);
        let deadline = tokio::time::Instant::now() + REPLY_TIMEOUT;
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                return self.buf.drain(..=end).collect();
            }
            self.read_more(deadline).await;
        }
    }

    /// Reads one JSON value from the stream.
    pub async fn read_value(&mut self) -> Value {
        let deadline = tokio::time::Instant::now() + REPLY_TIMEOUT;
        loop {
            let mut it = serde_json::Deserializer::from_slice(&self.buf).into_iter::<Value>();
            match it.next() {
                Some(Ok(v)) => {
                    let used = it.byte_offset();
                    self.buf.drain(..used);
                    return v;
                }
                Some(Err(e)) if !e.is_eof() => panic!("bad reply: {e}"),
                _ => {}
            }
            self.read_more(deadline).await;
        }
    }

    /// Appends what the server sent next to the buffer.
    async fn read_more(&mut self, deadline: tokio::time::Instant) {
        // On the heap: a big array here would bloat every caller's future.
        let mut chunk = vec![0u8; 65536];
        let n = tokio::time::timeout_at(deadline, self.stream.read(&mut chunk))
            .await
            .expect("reply in time")
            .expect("read");
        assert!(n > 0, "server closed the connection");
        self.buf.extend_from_slice(&chunk[..n]);
    }

    /// Calls a method; `Err((code, message))` for an error reply.
    pub async fn call(
        &mut self,
        method: &str,
        params: Option<Value>,
    ) -> Result<Value, (i64, String)> {
        let id = self.next_id;
        self.next_id += 1;
        let mut req = json!({"jsonrpc": "2.0", "method": method, "id": id});
        if let Some(p) = params {
            req["params"] = p;
        }
        self.send_raw(&serde_json::to_vec(&req).expect("encode"))
            .await;
        let reply = self.read_value().await;
        assert_eq!(reply["id"], json!(id), "reply id for {method}");
        if let Some(e) = reply.get("error") {
            return Err((
                e["code"].as_i64().expect("code"),
                e["message"].as_str().expect("message").to_owned(),
            ));
        }
        Ok(reply["result"].clone())
    }

    pub async fn ok(&mut self, method: &str, params: Value) -> Value {
        match self.call(method, Some(params.clone())).await {
            Ok(v) => v,
            Err(e) => panic!("{method} {params} failed: {e:?}"),
        }
    }

    /// Exports `bdev` as the only namespace of subsystem `nqn`, open to any
    /// host, on a TCP listener at 127.0.0.1:`port`.
    pub async fn export_over_tcp(&mut self, bdev: &str, nqn: &str, port: &str) {
        self.ok("nvmf_create_transport", json!({"trtype": "TCP"}))
            .await;
        self.ok(
            "nvmf_create_subsystem",
            json!({"nqn": nqn, "allow_any_host": true}),
        )
        .await;
        self.ok(
            "nvmf_subsystem_add_ns",
            json!({"nqn": nqn, "namespace": {"bdev_name": bdev}}),
        )
        .await;
        self.ok(
            "nvmf_subsystem_add_listener",
            json!({"nqn": nqn, "listen_address": {"trtype": "tcp", "adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": port}}),
        )
        .await;
    }

    pub async fn err(&mut self, method: &str, params: Value) -> (i64, String) {
        match self.call(method, Some(params.clone())).await {
            Ok(v) => panic!("{method} {params} unexpectedly returned {v}"),
            Err(e) => e,
        }
    }
}

/// Exposes `bdev` as a virtio-blk disk and returns its device node.
pub async fn expose_virtio_blk(emu: &Emu, c: &mut Client, bdev: &str) -> PathBuf {
    c.ok(
        "virtio_blk_controller_create",
        json!({"pf_id": 0, "vf_id": 0, "bdev": bdev, "vblk_id": "dp"}),
    )
    .await;
    let list = c.ok("emulation_function_list", json!({"all": true})).await;
    let bdf = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|pf| pf["emulation_type"] == "VBLK")
        .flat_map(|pf| pf["vfs"].as_array().unwrap().iter())
        .find(|vf| vf["ctrl_id"] == "VblkCtrl1")
        .map(|vf| vf["pci_bdf"].as_str().unwrap().to_owned())
        .expect("the controller's function");
    let dir = emu
        .sysfs_root
        .join(format!("bus/pci/devices/0000:{bdf}/virtio0/block/vda"));
    dev_node(&wait_for_disk(&dir).await.join("dev"))
}

/// Decodes the inside of a Python bytes literal (`b'...'`).
pub fn py_bytes(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 == b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        i += 2;
        match c {
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'0' => out.push(0),
            b'\\' => out.push(b'\\'),
            b'\'' => out.push(b'\''),
            b'"' => out.push(b'"'),
            b'x' => {
                let hex = std::str::from_utf8(&b[i..i + 2]).expect("hex escape");
                out.push(u8::from_str_radix(hex, 16).expect("hex escape"));
                i += 2;
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    out
}

/// Extracts `...` from a line containing `b'...'` (the last quote closes it).
pub fn bytes_literal(line: &str) -> Vec<u8> {
    let start = line.find("b'").expect("bytes literal") + 2;
    let end = line.rfind('\'').expect("closing quote");
    py_bytes(&line[start..end])
}

fn is_uuid(s: &[u8]) -> bool {
    s.len() == 36
        && s.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// Replaces every UUID in a text by a fixed placeholder of the same length,
/// so texts that differ only in random UUIDs compare equal.
pub fn mask_uuids(text: &[u8]) -> Vec<u8> {
    let mut out = text.to_vec();
    let mut i = 0;
    while i + 36 <= out.len() {
        if is_uuid(&out[i..i + 36]) {
            out[i..i + 36].copy_from_slice(b"00000000-0000-0000-0000-000000000000");
            i += 36;
        } else {
            i += 1;
        }
    }
    out
}

/// A JSON token; enough to walk a (possibly cut) compact document.
#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    Punct(u8),
    Str(String, bool), // text, complete
    Num(String),
    Lit(String),
}

pub fn tokenize(text: &str) -> Vec<Tok> {
    let b = text.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b'{' | b'}' | b'[' | b']' | b':' | b',' => {
                out.push(Tok::Punct(c));
                i += 1;
            }
            b' ' | b'\n' | b'\t' | b'\r' => i += 1,
            b'"' => {
                let mut j = i + 1;
                let mut s = Vec::new();
                let mut complete = false;
                while j < b.len() {
                    if b[j] == b'\\' && j + 1 < b.len() {
                        s.push(b[j]);
                        s.push(b[j + 1]);
                        j += 2;
                    } else if b[j] == b'"' {
                        complete = true;
                        j += 1;
                        break;
                    } else {
                        s.push(b[j]);
                        j += 1;
                    }
                }
                out.push(Tok::Str(String::from_utf8_lossy(&s).into_owned(), complete));
                i = j;
            }
            b'-' | b'0'..=b'9' => {
                let mut j = i;
                while j < b.len() && (b[j].is_ascii_digit() || b"-+.eE".contains(&b[j])) {
                    j += 1;
                }
                out.push(Tok::Num(text[i..j].to_owned()));
                i = j;
            }
            _ => {
                let mut j = i;
                while j < b.len() && b[j].is_ascii_alphabetic() {
                    j += 1;
                }
                if j == i {
                    j += 1;
                }
                out.push(Tok::Lit(text[i..j].to_owned()));
                i = j;
            }
        }
    }
    out
}

/// Compares an actual compact JSON reply with an expected one that may be cut
/// (`cut` = the expected text ends mid-document). Strings compare after masking
/// UUIDs; numbers under `random_keys` compare by shape only.
pub fn compare_prefix(
    expected: &str,
    actual: &str,
    cut: bool,
    random_keys: &[&str],
) -> Result<(), String> {
    let exp = tokenize(&String::from_utf8_lossy(&mask_uuids(expected.as_bytes())));
    let act = tokenize(&String::from_utf8_lossy(&mask_uuids(actual.as_bytes())));
    if !cut && exp.len() != act.len() {
        return Err(format!(
            "token count differs: expected {} got {}",
            exp.len(),
            act.len()
        ));
    }
    let mut last_key = String::new();
    for (i, e) in exp.iter().enumerate() {
        let a = act
            .get(i)
            .ok_or_else(|| format!("reply ends early at token {i}: expected {e:?}"))?;
        let last = i + 1 == exp.len();
        let ok = match (e, a) {
            (Tok::Str(es, true), Tok::Str(as_, true)) => es == as_,
            (Tok::Str(es, false), Tok::Str(as_, _)) if last && cut => as_.starts_with(es.as_str()),
            (Tok::Num(en), Tok::Num(an)) => {
                en == an
                    || random_keys.contains(&last_key.as_str())
                    || (last && cut && an.starts_with(en.as_str()))
            }
            (Tok::Lit(el), Tok::Lit(al)) => {
                el == al || (last && cut && al.starts_with(el.as_str()))
            }
            (Tok::Punct(x), Tok::Punct(y)) => x == y,
            _ => false,
        };
        if !ok {
            return Err(format!(
                "token {i} differs (key {last_key:?}): expected {e:?}, got {a:?}\n  expected: {expected}\n  actual:   {actual}"
            ));
        }
        if let (Tok::Str(s, true), Some(Tok::Punct(b':'))) = (e, exp.get(i + 1)) {
            last_key = s.clone();
        }
    }
    Ok(())
}

/// A TCP port nothing listens on right now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Creates a sparse file of `size` bytes.
pub fn sparse_file(path: &Path, size: u64) {
    let f = std::fs::File::create(path).expect("create");
    f.set_len(size).expect("set_len");
}

/// `losetup -a` output, for checking which files still have loop devices.
pub fn losetup_all() -> String {
    let out = std::process::Command::new("losetup")
        .arg("-a")
        .output()
        .expect("losetup");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Resolves a sysfs `dev` file (`major:minor`) to the device node.
pub fn dev_node(dev_file: &Path) -> PathBuf {
    let dev = std::fs::read_to_string(dev_file).expect("dev file");
    let dev = dev.trim();
    let link = std::fs::read_link(format!("/sys/dev/block/{dev}")).expect("dev link");
    let name = link.file_name().expect("device name");
    PathBuf::from("/dev").join(name)
}

/// How long a host may take to discover a disk after SNAP announced it.
pub const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Waits for a disk directory to appear, as a host's consumer polls sysfs
/// after a controller is resumed: the emulator attaches in the background.
/// Directories appear whole, so once it exists its `dev` is there too.
pub async fn wait_for_disk(dir: &Path) -> PathBuf {
    wait_until(&format!("{} appearing", dir.display()), || dir.exists()).await;
    dir.to_path_buf()
}

/// Waits for the first namespace (`n1`) of the first controller the
/// emulator shows on the NVMe `function` (its directory in the tree),
/// named as a host with native multipath names it (the emulator's default):
/// `(the path under the controller, the subsystem's head with its dev)`.
/// Linux adds the path before the head, so the head's `dev` is waited for.
pub async fn wait_for_nvme_disk(function: &Path) -> (PathBuf, PathBuf) {
    let name = function.file_name().unwrap().to_str().unwrap();
    let domain = u32::from_str_radix(&name[..4], 16).unwrap();
    let c = domain << 16;
    let path = function.join(format!("nvme/nvme{c}/nvme{c}c{c}n1"));
    let root = function.ancestors().nth(4).unwrap();
    let head = root.join(format!("block/nvme{c}n1"));
    wait_for_disk(&head).await;
    assert!(
        path.join("nsid").exists(),
        "{} has its path",
        head.display()
    );
    (path, head)
}

/// Waits until `done` holds, for what the emulator finishes in the background.
pub async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + DISCOVERY_TIMEOUT;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {DISCOVERY_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
