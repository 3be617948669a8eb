//! An emulator running inside another program, for tests of other crates.
//!
//! It runs on its own thread and runtime, so that dropping the handle (also
//! when a test panics) can stop it and wait until it has detached its loop
//! devices, whatever runtime the test itself uses, and before the caller
//! removes the directory holding its records.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use anyhow::Context;
use tokio::sync::oneshot;

use crate::config::Config;
use crate::poller::Rounds;

/// A running in-process emulator; stops when dropped.
#[derive(Debug)]
pub struct InProcess {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
    socket: PathBuf,
    sysfs_root: PathBuf,
    virtiofs_dir: PathBuf,
    rounds: Rounds,
}

impl InProcess {
    /// Starts an emulator with `config`; it listens when this returns.
    pub async fn start(config: Config) -> anyhow::Result<InProcess> {
        let socket = config.socket.clone();
        let sysfs_root = config.effective_sysfs_root();
        let virtiofs_dir = config.effective_virtiofs_dir();
        let (stop, stopped) = oneshot::channel::<()>();
        let (bound, listening) = oneshot::channel::<anyhow::Result<Rounds>>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                match crate::server::bind(config).await {
                    Ok(server) => {
                        let _ = bound.send(Ok(server.rounds()));
                        server
                            .serve(async move {
                                let _ = stopped.await;
                            })
                            .await
                    }
                    Err(e) => {
                        let _ = bound.send(Err(e));
                        Ok(())
                    }
                }
            })
        });
        let mut running = InProcess {
            stop: Some(stop),
            thread: Some(thread),
            socket,
            sysfs_root,
            virtiofs_dir,
            rounds: Rounds::default(),
        };
        match listening.await {
            Ok(Ok(rounds)) => {
                running.rounds = rounds;
                Ok(running)
            }
            Ok(Err(e)) => {
                running.shutdown()?;
                Err(e)
            }
            // The thread ended before binding: its result says why.
            Err(_) => {
                running.shutdown()?;
                anyhow::bail!("the emulator thread ended before it listened")
            }
        }
    }

    /// The JSON-RPC socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The root of the sysfs-shaped tree the host side writes.
    pub fn sysfs_root(&self) -> &Path {
        &self.sysfs_root
    }

    /// Where the host's virtio-fs devices are, a socket per tag: a host
    /// here mounts one with `fuse_handoff::mount(<it>, tag, ...)` where a
    /// real one mounts `-t virtiofs <tag>` (see
    /// [`Config::effective_virtiofs_dir`]).
    pub fn virtiofs_dir(&self) -> &Path {
        &self.virtiofs_dir
    }

    /// The dependent round trips clients have made so far, counted by the
    /// poller (0 without a poll period; see [`Rounds`]).
    pub fn rounds(&self) -> u64 {
        self.rounds.get()
    }

    /// Stops the emulator and waits until it has cleaned up.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown()
    }

    /// Stops the emulator and starts another with `config`, as a process
    /// restarted on its state directory would be.
    pub async fn restart(&mut self, config: Config) -> anyhow::Result<()> {
        self.shutdown()?;
        // The stopped emulator's state-directory lock goes with its last
        // descriptor, and a child another thread of this process forked just
        // then holds a copy until it execs (close-on-exec): wait for that.
        let patience = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        *self = loop {
            match InProcess::start(config.clone()).await {
                Err(e)
                    if format!("{e:#}").contains(crate::server::STATE_DIR_BUSY)
                        && tokio::time::Instant::now() < patience =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                started => break started?,
            }
        };
        Ok(())
    }

    fn shutdown(&mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .map_err(|_| anyhow::anyhow!("emulator thread panicked"))?
                .context("emulator"),
            None => Ok(()),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            eprintln!("emulator shutdown: {e:#}");
        }
    }
}
