//! Mutual TLS for the link between the node and its DPU agent (split mode).
//!
//! Each end has a certificate, its key, and the CA that signs the other
//! end's certificate, as PEM files (cert-manager's Secret, mounted). Each
//! accepts exactly one peer name: the agent only the host it serves (a DNS
//! name in the client certificate, [`verify`]), the node only the DPU it
//! expects (the server name it verifies). No certificate, another CA, an
//! expired certificate or another name fail the handshake, and each side
//! logs one line saying why.
//!
//! The files are looked at again before each new connection (at most once a
//! second, [`Reloading`]), so a rotation takes effect without a restart: the
//! agent's next handshake uses the new files, and the node moves its next
//! calls to a new connection. A connection is authenticated when it is made;
//! calls in flight keep theirs. Files caught half-rotated (a key that does
//! not match its certificate) are not used: the last good settings stay
//! until the files load again.
//!
//! - [`listen`]: the agent's listener, yielding authenticated connections.
//! - [`connect`]: the node's side of a handshake.

pub mod connect;
pub mod listen;
mod verify;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::time::Instant;

/// How often at most the files are looked at for a change.
const RECHECK: Duration = Duration::from_secs(1);

/// HTTP/2 is all either end speaks.
const ALPN_H2: &[u8] = b"h2";

/// Where one end's certificate, key and trusted CA live.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsFiles {
    /// This end's certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA certificate(s) that sign the peer's certificate (PEM).
    pub ca: PathBuf,
}

/// cert-manager's Secret keys, where the manifests mount the Secret.
impl Default for TlsFiles {
    fn default() -> Self {
        TlsFiles {
            cert: "/etc/snap-csi/tls/tls.crt".into(),
            key: "/etc/snap-csi/tls/tls.key".into(),
            ca: "/etc/snap-csi/tls/ca.crt".into(),
        }
    }
}

/// Why TLS settings could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {}: {message}", path.display())]
    Read { path: PathBuf, message: String },
    #[error("{}: holds no certificate", .0.display())]
    NoCertificate(PathBuf),
    #[error("{0:?} is not a DNS name a certificate can carry")]
    BadName(String),
    #[error("TLS settings: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("TLS settings: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// The contents of [`TlsFiles`].
#[derive(Debug)]
pub struct Material {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    pub roots: Arc<RootCertStore>,
}

impl TlsFiles {
    pub fn load(&self) -> Result<Material, TlsError> {
        let read_error = |path: &Path| {
            let path = path.to_path_buf();
            move |e: rustls_pki_types::pem::Error| TlsError::Read {
                path,
                message: e.to_string(),
            }
        };
        let chain = CertificateDer::pem_file_iter(&self.cert)
            .map_err(read_error(&self.cert))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(read_error(&self.cert))?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate(self.cert.clone()));
        }
        let key = PrivateKeyDer::from_pem_file(&self.key).map_err(read_error(&self.key))?;
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(&self.ca).map_err(read_error(&self.ca))? {
            roots.add(ca.map_err(read_error(&self.ca))?)?;
        }
        if roots.is_empty() {
            return Err(TlsError::NoCertificate(self.ca.clone()));
        }
        Ok(Material {
            chain,
            key,
            roots: Arc::new(roots),
        })
    }

    /// What the files look like now, to notice a change without reading them.
    fn stamp(&self) -> Stamp {
        [&self.cert, &self.key, &self.ca].map(|path| {
            // Kubernetes swaps a mounted Secret's files by a symlink:
            // metadata follows it to the new file.
            std::fs::metadata(path).ok().map(|m| {
                use std::os::unix::fs::MetadataExt;
                (m.dev(), m.ino(), m.len(), m.modified().ok())
            })
        })
    }
}

type Stamp = [Option<(u64, u64, u64, Option<SystemTime>)>; 3];

/// The one crypto provider both ends use.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A name a peer's certificate must carry.
pub fn peer_name(name: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(name.to_string()).map_err(|_| TlsError::BadName(name.to_string()))
}

/// The agent's settings: its certificate, and only clients whose
/// certificate `host` signed by the CA.
pub fn server_config(
    host: ServerName<'static>,
) -> impl Fn(&Material) -> Result<rustls::ServerConfig, TlsError> + Send + Sync + 'static {
    move |material| {
        let verifier =
            verify::HostOnly::new(Arc::clone(&material.roots), host.clone(), provider())?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(Arc::new(verifier))
            .with_single_cert(material.chain.clone(), material.key.clone_key())?;
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(config)
    }
}

/// The node's settings: its certificate, and servers signed by the CA (the
/// name is checked per connection, see [`connect`]).
pub fn client_config(material: &Material) -> Result<rustls::ClientConfig, TlsError> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(Arc::clone(&material.roots))
        .with_client_auth_cert(material.chain.clone(), material.key.clone_key())?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}

type Build<T> = Box<dyn Fn(&Material) -> Result<T, TlsError> + Send + Sync>;

/// TLS settings that follow their files.
pub struct Reloading<T> {
    files: TlsFiles,
    build: Build<T>,
    state: Mutex<State<T>>,
}

struct State<T> {
    config: Arc<T>,
    /// Counts reloads, so a holder of connections can tell settings changed.
    generation: u64,
    /// The files as last looked at (loaded or not).
    stamp: Stamp,
    checked: Instant,
}

impl<T> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl<T> Reloading<T> {
    /// Loads the files now: bad files at start are a configuration error.
    pub fn new(
        files: TlsFiles,
        build: impl Fn(&Material) -> Result<T, TlsError> + Send + Sync + 'static,
    ) -> Result<Self, TlsError> {
        let stamp = files.stamp();
        let config = Arc::new(build(&files.load()?)?);
        Ok(Reloading {
            files,
            build: Box::new(build),
            state: Mutex::new(State {
                config,
                generation: 0,
                stamp,
                checked: Instant::now(),
            }),
        })
    }

    /// The settings for a new connection, and their generation.
    pub fn current(&self) -> (u64, Arc<T>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.checked.elapsed() >= RECHECK {
            state.checked = Instant::now();
            let stamp = self.files.stamp();
            if stamp != state.stamp {
                state.stamp = stamp;
                match self.files.load().and_then(|m| (self.build)(&m)) {
                    Ok(config) => {
                        state.config = Arc::new(config);
                        state.generation += 1;
                        crate::metrics::observe_tls_reload(&self.files.cert, "ok");
                        tracing::info!(cert = %self.files.cert.display(), "TLS files changed: new connections use them");
                    }
                    Err(e) => {
                        crate::metrics::observe_tls_reload(&self.files.cert, "unusable");
                        tracing::warn!(
                            cert = %self.files.cert.display(),
                            "TLS files changed but cannot be used ({e}); keeping the previous ones until they change again"
                        )
                    }
                }
            }
        }
        (state.generation, Arc::clone(&state.config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate for `name` signed by a fresh CA, as (cert, key, ca) PEM.
    fn issued(name: &str) -> (String, String, String) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = rcgen::CertifiedIssuer::self_signed(ca, ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        (cert.pem(), key.serialize_pem(), ca.pem())
    }

    fn write(files: &TlsFiles, (cert, key, ca): &(String, String, String)) {
        std::fs::write(&files.cert, cert).unwrap();
        std::fs::write(&files.key, key).unwrap();
        std::fs::write(&files.ca, ca).unwrap();
    }

    #[test]
    fn changed_files_are_used_and_half_rotated_ones_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
            ca: dir.path().join("ca.crt"),
        };
        let first = issued("node-1");
        write(&files, &first);
        let settings = Reloading::new(files.clone(), client_config).unwrap();
        assert_eq!(settings.current().0, 0);

        // The new certificate is in place, its key not yet.
        let second = issued("node-1");
        std::fs::write(&files.cert, &second.0).unwrap();
        std::thread::sleep(RECHECK);
        assert_eq!(
            settings.current().0,
            0,
            "a key that does not match is not used"
        );

        std::fs::write(&files.key, &second.1).unwrap();
        std::thread::sleep(RECHECK);
        assert_eq!(settings.current().0, 1, "the complete new files are");
        assert_eq!(settings.current().0, 1, "and only once");
    }

    #[test]
    fn missing_or_empty_files_are_a_configuration_error() {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
            ca: dir.path().join("ca.crt"),
        };
        let error = files.load().unwrap_err();
        assert!(error.to_string().contains("tls.crt"), "{error}");
        write(&files, &issued("node-1"));
        std::fs::write(&files.ca, "").unwrap();
        let error = files.load().unwrap_err();
        assert!(error.to_string().contains("ca.crt"), "{error}");
        assert!(peer_name("not a name!").is_err());
    }
}
