//! Certificates for tests of the DPU link, made fresh per test with rcgen:
//! a CA, and certificates it signs for a DNS name, for the server (the
//! agent) or the client (the node) side, valid now or long expired, written
//! as the PEM files cert-manager's Secrets hold.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, date_time_ymd,
};
use snap_csi::tls::TlsFiles;

/// Which end a certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Agent,
    Node,
}

/// A test CA and the directory its files go to.
pub struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
    name: String,
}

impl Pki {
    /// A new CA called `name`, writing into `dir` (created).
    pub fn new(dir: &Path, name: &str) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let pki = Pki {
            ca,
            dir: dir.to_path_buf(),
            name: name.to_string(),
        };
        std::fs::write(pki.ca_file(), pki.ca.pem()).unwrap();
        pki
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.crt", self.name))
    }

    /// Files for `role` with a certificate naming `dns_name`, trusting this CA.
    pub fn issue(&self, role: Role, dns_name: &str) -> TlsFiles {
        self.issue_with(role, dns_name, |_| {})
    }

    /// Files for `role` with a certificate that expired long ago.
    pub fn issue_expired(&self, role: Role, dns_name: &str) -> TlsFiles {
        self.issue_with(role, dns_name, |params| {
            params.not_before = date_time_ymd(2000, 1, 1);
            params.not_after = date_time_ymd(2001, 1, 1);
        })
    }

    fn issue_with(
        &self,
        role: Role,
        dns_name: &str,
        adjust: impl FnOnce(&mut CertificateParams),
    ) -> TlsFiles {
        let mut params = CertificateParams::new(vec![dns_name.to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, dns_name);
        params.extended_key_usages = vec![match role {
            Role::Agent => ExtendedKeyUsagePurpose::ServerAuth,
            Role::Node => ExtendedKeyUsagePurpose::ClientAuth,
        }];
        adjust(&mut params);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let stem = self.dir.join(format!(
            "{}-{}-{dns_name}",
            self.name,
            match role {
                Role::Agent => "agent",
                Role::Node => "node",
            }
        ));
        let files = TlsFiles {
            cert: stem.with_extension("crt"),
            key: stem.with_extension("key"),
            ca: self.ca_file(),
        };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }
}

/// Replaces `to`'s certificate, key and CA with `from`'s, the way a Secret
/// volume rotates: each file renamed into place, never half-written.
pub fn rotate(from: &TlsFiles, to: &TlsFiles) {
    for (source, target) in [
        (&from.cert, &to.cert),
        (&from.key, &to.key),
        (&from.ca, &to.ca),
    ] {
        let staged = target.with_extension("rotating");
        std::fs::copy(source, &staged).unwrap();
        std::fs::rename(&staged, target).unwrap();
    }
}
