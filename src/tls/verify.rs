//! The agent's check of a client: WebPKI's (a certificate is required,
//! chains to the CA, is within its validity, is for client auth), then the
//! name: the certificate must name the host this agent serves. Checked in the
//! handshake, so a refused node never gets as far as a call.

use std::sync::Arc;

use rustls::client::verify_server_name;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

#[derive(Debug)]
pub(super) struct HostOnly {
    webpki: Arc<dyn ClientCertVerifier>,
    host: ServerName<'static>,
}

impl HostOnly {
    pub fn new(
        roots: Arc<RootCertStore>,
        host: ServerName<'static>,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, rustls::server::VerifierBuilderError> {
        let webpki = WebPkiClientVerifier::builder_with_provider(roots, provider).build()?;
        Ok(HostOnly { webpki, host })
    }
}

impl ClientCertVerifier for HostOnly {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.webpki.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .webpki
            .verify_client_cert(end_entity, intermediates, now)?;
        // The same name check a client makes of a server, on the client's
        // certificate: its DNS names must include the host.
        verify_server_name(&ParsedCertificate::try_from(end_entity)?, &self.host)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}
