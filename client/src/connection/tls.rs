//! TLS for the connection layer (rustls with ring), as envoyproxy/ratelimit's settings mean it:
//! the system's roots plus an optional private CA (`REDIS_TLS_CACERT` adds to the system pool;
//! a system store that cannot be read is skipped, as Go's `x509.SystemCertPool` error is), a
//! client certificate and key (mTLS), and "verify the chain but not the host name"
//! (`REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`: every other check stays: the chain to a trusted
//! root, the dates, the key usage). A certificate problem comes back as
//! [`ErrorKind::Tls`](super::ErrorKind::Tls) with what was wrong.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::{ConfigError, Error, ErrorKind};

/// TLS settings: [`TlsConfig::default`] verifies servers against the system's roots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsConfig {
    ca_file: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
    skip_hostname_verification: bool,
}

impl TlsConfig {
    pub fn new() -> TlsConfig {
        TlsConfig::default()
    }

    /// A PEM file of CA certificates trusted besides the system's (a private CA).
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// A client certificate (PEM, with its chain) and its private key (PEM): mTLS.
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((cert.into(), key.into()));
        self
    }

    /// Verify the server's chain but not that it names the host dialed (servers known by
    /// address, or announced by Sentinel by IP).
    pub fn skip_hostname_verification(mut self, skip: bool) -> Self {
        self.skip_hostname_verification = skip;
        self
    }

    fn read(path: &Path, what: &str) -> Result<Vec<u8>, ConfigError> {
        std::fs::read(path).map_err(|e| ConfigError(format!("cannot read the TLS {what} {}: {e}", path.display())))
    }

    fn certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
        let pem = TlsConfig::read(path, what)?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ConfigError(format!("the TLS {what} {} is not valid PEM: {e}", path.display())))?;
        if certs.is_empty() {
            return Err(ConfigError(format!("the TLS {what} {} holds no certificate", path.display())));
        }
        Ok(certs)
    }

    /// The rustls configuration: reads and parses every file now (a configuration error names
    /// the file).
    pub(crate) fn build(&self) -> Result<Connector, ConfigError> {
        // ring: the workspace's provider (Cargo.toml); rustls 0.23.48 deprecates its default
        // set only for lacking post-quantum key exchange.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        // The system's roots, as far as they can be read (errors skipped, like Go's).
        for c in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(c);
        }
        if let Some(ca) = &self.ca_file {
            for c in TlsConfig::certs(ca, "CA certificate file")? {
                roots.add(c).map_err(|e| {
                    ConfigError(format!("the TLS CA certificate file {} has a bad certificate: {e}", ca.display()))
                })?;
            }
        }
        if roots.is_empty() {
            return Err(ConfigError(
                "TLS: no trusted root certificates (the system has none readable): give a CA certificate file".into(),
            ));
        }
        let roots = Arc::new(roots);
        let verifier = WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| ConfigError(format!("TLS: {e}")))?;
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ConfigError(format!("TLS: {e}")))?;
        let builder = if self.skip_hostname_verification {
            builder.dangerous().with_custom_certificate_verifier(Arc::new(ChainOnly(verifier)))
        } else {
            builder.with_webpki_verifier(verifier)
        };
        let config = match &self.client_cert {
            Some((cert, key)) => {
                let chain = TlsConfig::certs(cert, "client certificate file")?;
                let pem = TlsConfig::read(key, "client key file")?;
                let key_der = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
                    ConfigError(format!("the TLS client key file {} holds no usable private key: {e}", key.display()))
                })?;
                builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                    ConfigError(format!(
                        "the TLS client certificate {} and key {} do not make a pair: {e}",
                        cert.display(),
                        key.display()
                    ))
                })?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(Connector {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            has_client_cert: self.client_cert.is_some(),
        })
    }
}

/// Every check but the host name (`REDIS_TLS_SKIP_HOSTNAME_VERIFICATION`): rustls's verifier
/// checks the chain (to a trusted root, dates, usage) before the name, so a name mismatch is
/// the only error that means the rest passed.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            r => r,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// A built TLS configuration.
pub(crate) struct Connector {
    connector: tokio_rustls::TlsConnector,
    has_client_cert: bool,
}

impl Connector {
    /// The TLS handshake over `tcp`, verifying the certificate for `host`.
    pub(crate) async fn handshake(
        &self,
        host: &str,
        tcp: tokio::net::TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, Error> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| Error::new(ErrorKind::Tls, format!("'{host}' cannot be a TLS server name: {e}")))?;
        self.connector.connect(name, tcp).await.map_err(|e| {
            let detail = rustls_error(&e).map(|r| name_problem(r, host, self.has_client_cert));
            Error::new(ErrorKind::Tls, detail.unwrap_or_else(|| format!("handshake with {host} failed: {e}")))
        })
    }
}

fn rustls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur: Option<&'a (dyn std::error::Error + 'static)> = Some(e);
    while let Some(x) = cur {
        if let Some(r) = rustls_in(x) {
            return Some(r);
        }
        cur = x.source();
    }
    None
}

/// A rustls error that is `e`, or that `e` wraps: an IO error's payload, or the shared error
/// redis-rs keeps (its `source()` is the `Arc`, whose own source skips the IO error's payload).
fn rustls_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    if let Some(r) = e.downcast_ref::<rustls::Error>() {
        return Some(r);
    }
    if let Some(io) = e.downcast_ref::<std::io::Error>() {
        return io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    }
    if let Some(shared) = e.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>() {
        let inner: &(dyn std::error::Error + 'static) = &**shared;
        return rustls_in(inner);
    }
    None
}

/// What a rustls error means, in the operator's words.
fn name_problem(e: &rustls::Error, host: &str, has_client_cert: bool) -> String {
    use rustls::AlertDescription as A;
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer => format!(
                "the certificate of {host} is not signed by a trusted CA (unknown issuer: check the CA \
                 certificate file)"
            ),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => format!(
                "the certificate of {host} is not valid for the name '{host}' ({c:?}; skip host name \
                 verification verifies the chain only)"
            ),
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                format!("the certificate of {host} has expired")
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                format!("the certificate of {host} is not valid yet")
            }
            other => format!("the certificate of {host} was refused: {other:?}"),
        },
        rustls::Error::AlertReceived(
            a @ (A::CertificateRequired | A::BadCertificate | A::UnknownCA | A::HandshakeFailure),
        ) if !has_client_cert || *a != A::HandshakeFailure => {
            if has_client_cert {
                format!("{host} refused our client certificate (alert {a:?}: is it signed by a CA the server trusts?)")
            } else {
                format!("{host} requires a client certificate (alert {a:?}): set a client certificate and key")
            }
        }
        rustls::Error::AlertReceived(a) => format!("{host} ended the TLS handshake (alert {a:?})"),
        rustls::Error::InvalidMessage(m) => {
            format!("{host} does not speak TLS on this port ({m:?})")
        }
        other => format!("TLS with {host} failed: {other}"),
    }
}

/// A TLS problem inside a redis-rs error (an alert the server sent after the handshake, as
/// TLS 1.3 servers do when they refuse a client certificate), named; `None` if not TLS.
pub(crate) fn describe(e: &redis::RedisError) -> Option<String> {
    match rustls_error(e) {
        Some(r) => Some(name_problem(r, "the server", true)),
        None => flattened(&e.to_string()).map(|r| name_problem(&r, "the server", true)),
    }
}

/// The rustls error in a message that carries it only as text: redis-rs's cluster client
/// keeps its nodes' connection errors as strings ("Failed to create initial connections - Io:
/// invalid peer certificate: UnknownIssuer").
fn flattened(text: &str) -> Option<rustls::Error> {
    use rustls::AlertDescription as A;
    if let Some((_, rest)) = text.split_once("invalid peer certificate: ") {
        let c = [
            ("UnknownIssuer", CertificateError::UnknownIssuer),
            ("NotValidForName", CertificateError::NotValidForName),
            ("certificate not valid for name", CertificateError::NotValidForName),
            ("Expired", CertificateError::Expired),
            ("certificate expired", CertificateError::Expired),
            ("NotValidYet", CertificateError::NotValidYet),
            ("certificate not valid yet", CertificateError::NotValidYet),
        ]
        .into_iter()
        .find(|(name, _)| rest.starts_with(name))
        .map(|(_, c)| c)
        .unwrap_or_else(|| CertificateError::Other(rustls::OtherError(Arc::new(Text(rest.to_string())))));
        return Some(rustls::Error::InvalidCertificate(c));
    }
    let (_, rest) = text.split_once("received fatal alert: ")?;
    [
        ("CertificateRequired", A::CertificateRequired),
        ("BadCertificate", A::BadCertificate),
        ("UnknownCA", A::UnknownCA),
    ]
    .into_iter()
    .find(|(name, _)| rest.starts_with(name))
    .map(|(_, a)| rustls::Error::AlertReceived(a))
}

/// A message as an error (for [`CertificateError::Other`]).
#[derive(Debug)]
struct Text(String);

impl std::fmt::Display for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Text {}

/// redis-rs's cluster client with the layer's TLS settings (redis-rs makes the cluster's
/// connections itself). Its rustls setup differs from [`TlsConfig::build`]'s in one way: with a
/// CA file it trusts that CA alone.
pub(crate) fn cluster_client(
    urls: &[String],
    wants_tls: bool,
    tls: Option<&TlsConfig>,
    auth: &Option<(Option<String>, String)>,
    connect_timeout: Duration,
) -> Result<redis::cluster::ClusterClient, ConfigError> {
    let urls: Vec<String> =
        if wants_tls { urls.iter().map(|u| u.replacen("redis://", "rediss://", 1)).collect() } else { urls.to_vec() };
    let mut b = redis::cluster::ClusterClientBuilder::new(urls.clone())
        .connection_timeout(connect_timeout)
        // As before this layer (redirects are followed through retries).
        .retries(2)
        .min_retry_wait(5)
        .max_retry_wait(100);
    if let Some((user, pass)) = auth {
        if let Some(u) = user {
            b = b.username(u);
        }
        b = b.password(pass);
    }
    if let Some(t) = tls.filter(|_| wants_tls) {
        t.build()?; // the same files, checked the same way
        let root_cert = t.ca_file.as_deref().map(|p| TlsConfig::read(p, "CA certificate file")).transpose()?;
        let client_tls = match &t.client_cert {
            Some((c, k)) => Some(redis::ClientTlsConfig {
                client_cert: TlsConfig::read(c, "client certificate file")?,
                client_key: TlsConfig::read(k, "client key file")?,
            }),
            None => None,
        };
        b = b
            .certs(redis::TlsCertificates { client_tls, root_cert })
            .danger_accept_invalid_hostnames(t.skip_hostname_verification);
    }
    b.build().map_err(|e| ConfigError(format!("invalid Redis Cluster nodes {urls:?}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// redis-rs's cluster client keeps its nodes' errors as text: the problem is still named.
    #[test]
    fn a_certificate_problem_carried_as_text_is_named() {
        let named = |text: &str| flattened(text).map(|r| name_problem(&r, "the server", true));
        let e = named("Failed to create initial connections - Io: invalid peer certificate: UnknownIssuer").unwrap();
        assert!(e.contains("not signed by a trusted CA"), "{e}");
        let e = named("Io: invalid peer certificate: NotValidForName").unwrap();
        assert!(e.contains("not valid for the name"), "{e}");
        let e = named("Io: invalid peer certificate: Expired").unwrap();
        assert!(e.contains("has expired"), "{e}");
        let e = named("Io: invalid peer certificate: BadSignature").unwrap();
        assert!(e.contains("was refused") && e.contains("BadSignature"), "{e}");
        let e = named("Io: received fatal alert: CertificateRequired").unwrap();
        assert!(e.contains("client certificate"), "{e}");
        assert!(named("Io: Connection refused (os error 111)").is_none());
    }
}
