//! The UNIX-socket server: startup and shutdown, and one task per connection,
//! or the optional RPC poller (`poller`) serving them all.
//!
//! With `poll_period` set the server behaves like SPDK's RPC poller: a
//! connection's bytes are only read on a tick, and every request complete at
//! that tick is answered within it. A client that waits for each reply pays
//! about one period per call; 64 pipelined calls cost about one period in all.
//! (Real SPDK also defers sending a reply to the next poll, which is why its
//! default 4 ms period measures as ~8 ms per sequential call; use 8000 µs to
//! reproduce that figure, or `reply_on_next_tick` to defer as SPDK does.)

use std::fs::File;
use std::future::Future;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use json_framing::JsonFramer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::bdev::lvol_disk::stores_dir;
use crate::bdev::registry::files_dir;
use crate::config::Config;
use crate::dispatch::{self, answer_framed};
use crate::faults::Faults;
use crate::framing::{self, READ_CHUNK};
use crate::host::{GuestHost, Host, HostSide};
use crate::poller::{self, Rounds};
use crate::registry::Shared;
use crate::snap::Snap;
use crate::snap::model::{Functions, host_kind};

/// An emulator whose socket is bound and whose host side is ready; nothing is
/// served until [`Server::serve`].
#[derive(Debug)]
pub struct Server {
    listener: UnixListener,
    shared: Arc<Shared>,
    socket: PathBuf,
    poll_period: Option<Duration>,
    reply_on_next_tick: bool,
    rounds: Rounds,
    faults: Faults,
    /// Held for the life of the server: one emulator per state directory.
    _lock: File,
}

/// Removes a socket file left by a process that is gone. A live socket (one
/// that accepts a connection) or anything that is not a socket is refused.
fn remove_stale_socket(path: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!("{} is in use by a running server", path.display());
            }
            std::fs::remove_file(path)
                .with_context(|| format!("removing stale socket {}", path.display()))
        }
        Ok(_) => bail!("{} exists and is not a socket", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("checking {}", path.display())),
    }
}

/// Removes our own socket at shutdown (if it is still a socket).
fn remove_own_socket(path: &Path) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
        && let Err(e) = std::fs::remove_file(path)
    {
        tracing::warn!("cannot remove {}: {e}", path.display());
    }
}

/// Why a start fails while another emulator holds the state directory.
pub(crate) const STATE_DIR_BUSY: &str = "another emulator is using the state directory";

/// Prepares an emulator: state directory, host side (which cleans up after a
/// previous run), emulated PCI functions, and the bound socket.
pub async fn bind(config: Config) -> anyhow::Result<Server> {
    config.validate()?;
    let state_dir = &config.state_dir;
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating state directory {}", state_dir.display()))?;
    let lock = File::create(state_dir.join("snap-emu.lock"))?;
    lock.try_lock()
        .map_err(|_| anyhow::anyhow!("{STATE_DIR_BUSY} {}", state_dir.display()))?;

    // Fail before touching anything if another server owns the socket.
    remove_stale_socket(&config.socket)?;

    // The host side goes first: it detaches loop devices that a killed run
    // left on files we are about to remove.
    let host = if config.snap {
        let host: Arc<dyn Host> = match config.guest.clone() {
            Some(guest) => {
                let host_dir = config.host_dir();
                let host = tokio::task::spawn_blocking(move || GuestHost::open(&guest, &host_dir))
                    .await
                    .context("opening the guest host")?
                    .context("opening the guest host")?;
                Arc::new(host)
            }
            None => {
                let sysfs = config.effective_sysfs_root();
                let host_dir = config.host_dir();
                let (names, faults) = (config.host_names(), config.faults.clone());
                let host = tokio::task::spawn_blocking(move || {
                    HostSide::open(&sysfs, names, &host_dir).map(|h| h.with_faults(faults))
                })
                .await
                .context("opening the host side")?
                .context("opening the host side")?;
                let host = Arc::new(host);
                config.faults.register_host(&host);
                host
            }
        };
        Some(host)
    } else {
        // A plain target needs no host side, but a SNAP run on this state
        // directory may have died with loop devices attached.
        let host_dir = config.host_dir();
        if host_dir.exists() {
            let sysfs = config.effective_sysfs_root();
            let names = config.host_names();
            tokio::task::spawn_blocking(move || {
                HostSide::open(&sysfs, names, &host_dir).and_then(|h| h.shutdown())
            })
            .await
            .context("cleaning up an earlier SNAP run")?
            .context("cleaning up an earlier SNAP run")?;
        }
        None
    };
    let files = files_dir(state_dir);
    if files.exists() {
        std::fs::remove_dir_all(&files)
            .with_context(|| format!("removing leftovers in {}", files.display()))?;
    }
    std::fs::create_dir_all(&files)?;

    let snap = if config.snap {
        let functions = Functions::new(config.functions, config.buses());
        let (functions, host) = tokio::task::spawn_blocking(move || {
            if let Some(host) = &host {
                for f in functions.iter() {
                    if let Some(bdf) = &f.bdf {
                        host.add_function(bdf, host_kind(f.emulation))
                            .with_context(|| format!("adding PCI function {bdf}"))?;
                    }
                }
            }
            anyhow::Ok((functions, host))
        })
        .await??;
        Some(Snap::new(functions, host, config.data_path))
    } else {
        None
    };

    let snap_enabled = snap.is_some();
    let stores = stores_dir(state_dir);
    let shared = Shared::new(dispatch::families(files.clone(), stores, snap), files);
    // Before the socket exists: whoever waits for it finds the state made.
    if let Some(path) = &config.json_config {
        load_json_config(&shared, path)
            .await
            .with_context(|| format!("loading {}", path.display()))?;
    }
    let listener = UnixListener::bind(&config.socket)
        .with_context(|| format!("binding {}", config.socket.display()))?;
    tracing::info!(
        socket = %config.socket.display(),
        snap = snap_enabled,
        "snap-emu listening"
    );
    Ok(Server {
        listener,
        shared,
        socket: config.socket,
        poll_period: config.poll_period,
        reply_on_next_tick: config.reply_on_next_tick,
        rounds: Rounds::default(),
        faults: config.faults,
        _lock: lock,
    })
}

impl Server {
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The dependent round trips clients made so far (counted with a poll
    /// period only; see `poller`).
    pub fn rounds(&self) -> Rounds {
        self.rounds.clone()
    }

    /// Serves until `shutdown` completes, then detaches every loop device,
    /// removes the backing files and the socket.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
        // With a poll period, one task serves every connection tick by tick.
        let start_poller = || {
            self.poll_period.map(|period| {
                let (to_poller, incoming) = mpsc::unbounded_channel();
                let task = tokio::spawn(poller::poll(
                    self.shared.clone(),
                    period,
                    self.reply_on_next_tick,
                    self.rounds.clone(),
                    self.faults.clone(),
                    incoming,
                ));
                (task, to_poller)
            })
        };
        let mut polled = start_poller();

        let mut conns = JoinSet::new();
        tokio::pin!(shutdown);
        // `None` while down for a live update (see `faults`).
        let mut listener = Some(self.listener);
        loop {
            let Some(accepting) = &listener else {
                tokio::select! {
                    _ = &mut shutdown => break,
                    _ = self.faults.update_ended() => {}
                }
                listener = Some(
                    UnixListener::bind(&self.socket)
                        .with_context(|| format!("binding {} again", self.socket.display()))?,
                );
                tracing::info!(socket = %self.socket.display(), "live update done: listening again");
                self.faults.set_down(false);
                continue;
            };
            tokio::select! {
                _ = &mut shutdown => break,
                accepted = accepting.accept() => match accepted {
                    Ok((stream, _)) => match &polled {
                        Some((_, to_poller)) => {
                            let _ = to_poller.send(stream);
                        }
                        None => {
                            let faults = self.faults.clone();
                            conns.spawn(serve_connection(self.shared.clone(), stream, faults));
                        }
                    },
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                _ = self.faults.update_begun() => {
                    // The old process goes away: its connections close with
                    // their calls unanswered, and its socket with it.
                    conns.shutdown().await;
                    if let Some((task, _)) = polled.take() {
                        task.abort();
                        let _ = task.await;
                    }
                    polled = start_poller();
                    listener = None;
                    remove_own_socket(&self.socket);
                    tracing::info!(socket = %self.socket.display(), "live update: down, state kept");
                    self.faults.set_down(true);
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
        conns.shutdown().await;
        if let Some((task, _)) = polled {
            task.abort();
            let _ = task.await;
        }
        let mut state = self.shared.state.clone().lock_owned().await;
        if tokio::task::spawn_blocking(move || state.shutdown())
            .await
            .is_err()
        {
            tracing::error!("shutdown of the emulator state failed");
        }
        drop(listener);
        remove_own_socket(&self.socket);
        tracing::info!("snap-emu stopped");
        Ok(())
    }
}

/// `spdk_tgt --json`: every call of every subsystem's `config`, in the
/// file's order; the first error stops the start, as SPDK's does.
async fn load_json_config(shared: &Arc<Shared>, path: &Path) -> anyhow::Result<()> {
    #[derive(serde::Deserialize)]
    struct SavedConfig {
        subsystems: Vec<Subsystem>,
    }
    #[derive(serde::Deserialize)]
    struct Subsystem {
        subsystem: String,
        config: Option<Vec<Call>>,
    }
    #[derive(serde::Deserialize)]
    struct Call {
        method: String,
        params: Option<serde_json::Value>,
    }
    let saved: SavedConfig = serde_json::from_slice(&std::fs::read(path)?)?;
    for subsystem in saved.subsystems {
        for (i, call) in subsystem.config.into_iter().flatten().enumerate() {
            let mut request = serde_json::json!({"jsonrpc": "2.0", "id": i, "method": call.method});
            if let Some(params) = call.params {
                request["params"] = params;
            }
            let reply: serde_json::Value =
                serde_json::from_slice(&dispatch::answer(shared, &request.to_string()).await)?;
            if let Some(error) = reply.get("error") {
                bail!("{} {}: {error}", subsystem.subsystem, call.method);
            }
        }
    }
    Ok(())
}

/// Binds and serves until `shutdown` completes.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    bind(config).await?.serve(shutdown).await
}

/// Answers a connection's requests as they arrive.
async fn serve_connection(shared: Arc<Shared>, mut stream: UnixStream, faults: Faults) {
    let mut framer = JsonFramer::new(framing::REQUEST_LIMITS);
    let mut chunk = vec![0u8; READ_CHUNK];
    loop {
        let eof = match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => true,
            Ok(n) => {
                framer.extend(&chunk[..n]);
                false
            }
        };
        let (out, fatal) = answer_framed(&shared, &faults, &mut framer).await;
        if !out.is_empty() && stream.write_all(&out).await.is_err() {
            return;
        }
        if fatal || eof {
            // A parse error cannot be recovered from in a stream: close, as SPDK does.
            return;
        }
    }
}
