//! TLS for every omicos server and client, in one place.
//!
//! Certificates, keys and CA bundles are PEM files named in config
//! ([`TlsConfig`]). They are read again whenever one of them changes (its
//! modification time, size or inode), checked on each new handshake: cert-manager
//! and Kubernetes rotate the files in place, and the next connection sees the
//! new ones without a restart. Connections already open keep the keys they
//! were made with. A rotated set that cannot be used (a garbled file, a key
//! that does not match its certificate) keeps the last good one and logs one
//! error naming the key and the file.
//!
//! - Servers: [`ServerTls`] is what [`crate::Host`] accepts connections with
//!   (`Host::tls`). With `client_ca` it is mutual TLS: a peer without a
//!   client certificate from that CA is refused at the handshake, and a
//!   verified peer's certificates travel with each request as [`PeerInfo`],
//!   with the URI SANs of its leaf read once per connection (where an omicos
//!   part's role is written: `omicos_auth::service::ROLE_URI_PREFIX`).
//! - Clients: [`ClientTls`] gives a [`TlsConnector`] for tonic channels
//!   (`Channel::new(connector, endpoint)`); `https://` endpoints go over TLS
//!   with the current client config (with `cert`/`key`, the client
//!   certificate for mTLS), `http://` ones stay plain.
//!
//! rustls with the aws-lc-rs provider (the one the tree already builds for
//! jsonwebtoken and reqwest), given explicitly so no process default is needed.

use crate::ConfigError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How long a TLS handshake may take before the connection is dropped (a
/// peer that opens a socket and says nothing holds no task for long).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client's TCP connect may take when the caller sets no timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The TLS files of one part, as config keys (`tls.cert`, `tls.key`, ...).
/// Every field is a path to a PEM file; empty: not used.
///
/// - As a server: `cert` + `key` turn TLS on; `client_ca` also requires
///   each client to present a certificate signed by that CA (mutual TLS).
/// - As a client: `ca` verifies the servers it calls (empty: the system's
///   roots); `cert` + `key` are presented as its client certificate when a
///   server asks for one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// This part's certificate chain (PEM), leaf first.
    pub cert: String,
    /// The private key of `cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: String,
    /// The CA bundle (PEM) that servers this part calls must chain to.
    pub ca: String,
    /// The CA bundle (PEM) that clients of this part's server must present
    /// a certificate from; empty: no client certificate is asked for.
    pub client_ca: String,
    /// Under mutual TLS, whether a client certificate that names no role
    /// (no `spiffe://omicos/<role>` URI SAN) is let in as whatever part its
    /// role header says (one CA, one trust domain). Default false: such a
    /// certificate gets in only with the service secret, and the role of a
    /// certificate that names one is never taken from the header.
    pub allow_roleless_client_certs: bool,
}

impl TlsConfig {
    /// Whether no file is named at all (TLS not configured).
    pub fn is_empty(&self) -> bool {
        self.cert.is_empty()
            && self.key.is_empty()
            && self.ca.is_empty()
            && self.client_ca.is_empty()
    }

    /// Refuses a half-configured set (a cert without its key, a `client_ca`
    /// without a server certificate); `section` is the key's path (`tls`).
    pub fn validate(&self, section: &str) -> Result<(), ConfigError> {
        match (self.cert.is_empty(), self.key.is_empty()) {
            (false, true) => {
                return Err(ConfigError::key(
                    format!("{section}.key"),
                    "`cert` is set but its `key` is not",
                ));
            }
            (true, false) => {
                return Err(ConfigError::key(
                    format!("{section}.cert"),
                    "`key` is set but the `cert` it belongs to is not",
                ));
            }
            _ => {}
        }
        if !self.client_ca.is_empty() && self.cert.is_empty() {
            return Err(ConfigError::key(
                format!("{section}.cert"),
                "`client_ca` (mutual TLS) needs this server's own `cert` and `key`",
            ));
        }
        if self.allow_roleless_client_certs && self.client_ca.is_empty() {
            return Err(ConfigError::key(
                format!("{section}.allow_roleless_client_certs"),
                "is set but `client_ca` is not: it is about client certificates under mutual TLS",
            ));
        }
        Ok(())
    }

    /// The server side, read from the files now (an unreadable or garbled
    /// file is a [`ConfigError`] naming the key and the file); None without `cert`.
    pub fn server(&self, section: &str) -> Result<Option<ServerTls>, ConfigError> {
        self.validate(section)?;
        if self.cert.is_empty() {
            return Ok(None);
        }
        let files = Files::new(
            section,
            &[
                ("cert", &self.cert),
                ("key", &self.key),
                ("client_ca", &self.client_ca),
            ],
        );
        let built = build_server(&files).map_err(|e| e.config())?;
        Ok(Some(ServerTls {
            reloading: Arc::new(Reloading::new(files, built, build_server)),
            allow_roleless_client_certs: self.allow_roleless_client_certs,
        }))
    }

    /// The client side, read from the files now; None when neither `ca`
    /// nor `cert` is set (plain `http://` calls only).
    pub fn client(&self, section: &str) -> Result<Option<ClientTls>, ConfigError> {
        self.validate(section)?;
        if self.ca.is_empty() && self.cert.is_empty() {
            return Ok(None);
        }
        let files = Files::new(
            section,
            &[("cert", &self.cert), ("key", &self.key), ("ca", &self.ca)],
        );
        let built = build_client(&files).map_err(|e| e.config())?;
        Ok(Some(ClientTls(Arc::new(Reloading::new(
            files,
            built,
            build_client,
        )))))
    }
}

/// Both sides of one part's TLS, read from its files at start.
#[derive(Clone, Debug, Default)]
pub struct Tls {
    /// What its server accepts with (None: plain TCP).
    pub server: Option<ServerTls>,
    /// What its clients connect with (None: `http://` only).
    pub client: Option<ClientTls>,
}

impl Tls {
    /// Whether its server asks every client for a certificate (mutual TLS).
    pub fn mutual(&self) -> bool {
        self.server.as_ref().is_some_and(ServerTls::mutual)
    }

    /// Whether its clients present a certificate of their own.
    pub fn client_cert(&self) -> bool {
        self.client.as_ref().is_some_and(ClientTls::has_cert)
    }

    /// [`TlsConfig::allow_roleless_client_certs`], as its server took it.
    pub fn allows_roleless_client_certs(&self) -> bool {
        self.server
            .as_ref()
            .is_some_and(|s| s.allow_roleless_client_certs)
    }
}

impl TlsConfig {
    /// Both sides ([`TlsConfig::server`], [`TlsConfig::client`]), or the
    /// first file that cannot be used, as a [`ConfigError`] naming its key.
    pub fn load(&self, section: &str) -> Result<Tls, ConfigError> {
        Ok(Tls {
            server: self.server(section)?,
            client: self.client(section)?,
        })
    }
}

/// A client that trusts only the CA in `ca_file` and presents no certificate
/// (the CLI's `--ca`); an empty path: the system's roots.
pub fn client_with_ca(ca_file: &str, what: &str) -> Result<ClientTls, ConfigError> {
    flag_client((what, ca_file), None)
}

/// A command line's client (`omicos --ca --cert --key`): trusts the CA in
/// `ca_file` (empty: the system's roots) and, with `cert_file` and
/// `key_file`, presents that client certificate to a server that asks for
/// one (mutual TLS). Errors name the flags; one of the pair without the
/// other is refused.
pub fn client_with_identity(
    ca_file: &str,
    cert_file: &str,
    key_file: &str,
) -> Result<ClientTls, ConfigError> {
    match (cert_file.is_empty(), key_file.is_empty()) {
        (false, true) => {
            return Err(ConfigError::key(
                "--key",
                "--cert is given but not the --key that belongs to it",
            ));
        }
        (true, false) => {
            return Err(ConfigError::key(
                "--cert",
                "--key is given but not the --cert it belongs to",
            ));
        }
        (true, true) => return client_with_ca(ca_file, "--ca"),
        (false, false) => {}
    }
    flag_client(
        ("--ca", ca_file),
        Some([("--cert", cert_file), ("--key", key_file)]),
    )
}

/// A client from files named by flags: the CA (its entry may be empty) and
/// an optional (certificate, key) pair.
fn flag_client(
    (ca_flag, ca_file): (&str, &str),
    identity: Option<[(&str, &str); 2]>,
) -> Result<ClientTls, ConfigError> {
    let mut entries = vec![];
    let mut roles = Roles::default();
    if !ca_file.is_empty() {
        roles.ca = Some(entries.len());
        entries.push((ca_flag.to_owned(), PathBuf::from(ca_file)));
    }
    if let Some([(cert_flag, cert_file), (key_flag, key_file)]) = identity {
        roles.cert = Some(entries.len());
        entries.push((cert_flag.to_owned(), PathBuf::from(cert_file)));
        roles.key = Some(entries.len());
        entries.push((key_flag.to_owned(), PathBuf::from(key_file)));
    }
    let files = Files {
        section: String::new(),
        entries,
        roles,
    };
    let built = build_client(&files).map_err(|e| e.config())?;
    Ok(ClientTls(Arc::new(Reloading::new(
        files,
        built,
        build_client,
    ))))
}

/// The crypto provider every config here is built with.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The named files of one config section, and which of them plays which part.
#[derive(Debug)]
struct Files {
    section: String,
    /// (key name, path) of each file that is set.
    entries: Vec<(String, PathBuf)>,
    roles: Roles,
}

#[derive(Debug, Default)]
struct Roles {
    cert: Option<usize>,
    key: Option<usize>,
    ca: Option<usize>,
    client_ca: Option<usize>,
}

impl Files {
    fn new(section: &str, named: &[(&str, &String)]) -> Self {
        let mut entries = vec![];
        let mut roles = Roles::default();
        for (name, path) in named {
            if path.is_empty() {
                continue;
            }
            let slot = match *name {
                "cert" => &mut roles.cert,
                "key" => &mut roles.key,
                "ca" => &mut roles.ca,
                _ => &mut roles.client_ca,
            };
            *slot = Some(entries.len());
            entries.push((name.to_string(), PathBuf::from(path.as_str())));
        }
        Self {
            section: section.to_owned(),
            entries,
            roles,
        }
    }

    fn key_name(&self, i: usize) -> String {
        if self.section.is_empty() {
            self.entries[i].0.clone()
        } else {
            format!("{}.{}", self.section, self.entries[i].0)
        }
    }

    fn read(&self, i: usize) -> Result<Vec<u8>, FileError> {
        std::fs::read(&self.entries[i].1).map_err(|e| self.error(i, format!("cannot be read: {e}")))
    }

    fn error(&self, i: usize, message: impl Into<String>) -> FileError {
        FileError {
            key: self.key_name(i),
            path: self.entries[i].1.clone(),
            message: message.into(),
        }
    }

    /// What the files look like now: a change in any of them means a reload.
    fn stamp(&self) -> Vec<Option<Stamp>> {
        self.entries
            .iter()
            // metadata follows symlinks: Kubernetes swaps a `..data` link.
            .map(|(_, p)| std::fs::metadata(p).ok().and_then(|m| Stamp::of(&m)))
            .collect()
    }

    fn certs(&self, i: usize) -> Result<Vec<CertificateDer<'static>>, FileError> {
        let pem = self.read(i)?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.error(i, format!("is not a PEM certificate file: {e}")))?;
        if certs.is_empty() {
            return Err(self.error(i, "holds no PEM certificate"));
        }
        Ok(certs)
    }

    fn private_key(&self, i: usize) -> Result<PrivateKeyDer<'static>, FileError> {
        let pem = self.read(i)?;
        PrivateKeyDer::from_pem_slice(&pem)
            .map_err(|e| self.error(i, format!("holds no usable PEM private key: {e}")))
    }

    fn roots(&self, i: usize) -> Result<RootCertStore, FileError> {
        let mut roots = RootCertStore::empty();
        for c in self.certs(i)? {
            roots.add(c).map_err(|e| {
                self.error(i, format!("holds a CA certificate rustls refuses: {e}"))
            })?;
        }
        Ok(roots)
    }

    /// The certificate chain and its key, checked to belong together.
    fn identity(
        &self,
    ) -> Result<Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>, FileError> {
        let (Some(c), Some(k)) = (self.roles.cert, self.roles.key) else {
            return Ok(None);
        };
        let chain = self.certs(c)?;
        let key = self.private_key(k)?;
        let signer = provider()
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|e| self.error(k, format!("is not a key rustls can use: {e}")))?;
        rustls::sign::CertifiedKey::new(chain.clone(), signer)
            .keys_match()
            .map_err(|e| self.error(k, format!("does not belong to the certificate: {e}")))?;
        Ok(Some((chain, key)))
    }
}

/// What says a file changed: its modification time and size, and which
/// file it is (device, inode). The file's identity matters because file
/// times are coarse (a kernel tick, several milliseconds): a file renamed
/// into place twice within one tick, with a new content of the same size
/// (a certificate from another CA of the same shape), keeps its time and
/// size but is a new inode each time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    modified: SystemTime,
    len: u64,
    file: (u64, u64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Option<Self> {
        #[cfg(unix)]
        let file = {
            use std::os::unix::fs::MetadataExt;
            (m.dev(), m.ino())
        };
        #[cfg(not(unix))]
        let file = (0, 0);
        Some(Self {
            modified: m.modified().ok()?,
            len: m.len(),
            file,
        })
    }
}

/// A TLS file that cannot be used.
#[derive(Debug)]
struct FileError {
    key: String,
    path: PathBuf,
    message: String,
}

impl FileError {
    fn config(self) -> ConfigError {
        ConfigError::key(
            self.key,
            format!("{} {}", self.path.display(), self.message),
        )
    }
}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "config key `{}`: {} {}",
            self.key,
            self.path.display(),
            self.message
        )
    }
}

fn whole(files: &Files, e: rustls::Error) -> FileError {
    FileError {
        key: files.section.clone(),
        path: PathBuf::new(),
        message: format!("the TLS settings cannot be used: {e}"),
    }
}

fn build_server(files: &Files) -> Result<Arc<ServerConfig>, FileError> {
    let (chain, key) = files
        .identity()?
        .expect("a server is built only with cert and key");
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| whole(files, e))?;
    let builder = match files.roles.client_ca {
        Some(i) => {
            let roots = files.roots(i)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| files.error(i, format!("cannot verify clients: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| whole(files, e))?;
    // gRPC is HTTP/2; HTTP/1.1 for gRPC-web and the page on the orchestrator's port.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn build_client(files: &Files) -> Result<Arc<ClientConfig>, FileError> {
    let roots = match files.roles.ca {
        Some(i) => files.roots(i)?,
        None => {
            let mut roots = RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            roots
        }
    };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| whole(files, e))?
        .with_root_certificates(roots);
    let mut config = match files.identity()? {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| whole(files, e))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// A config built from files, built again when they change.
struct Reloading<T> {
    files: Files,
    build: fn(&Files) -> Result<Arc<T>, FileError>,
    state: Mutex<State<T>>,
}

struct State<T> {
    /// The stamp the current config was built from, or the last one that failed.
    seen: Vec<Option<Stamp>>,
    current: Arc<T>,
    /// How many times a changed set was taken (0: the one read at start).
    generation: u64,
}

impl<T> Reloading<T> {
    fn new(files: Files, built: Arc<T>, build: fn(&Files) -> Result<Arc<T>, FileError>) -> Self {
        let seen = files.stamp();
        Self {
            files,
            build,
            state: Mutex::new(State {
                seen,
                current: built,
                generation: 0,
            }),
        }
    }

    /// The config for a new connection: rebuilt first if a file changed
    /// since it was last looked at.
    fn current(&self) -> Arc<T> {
        let stamp = self.files.stamp();
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if stamp != st.seen {
            st.seen = stamp;
            match (self.build)(&self.files) {
                Ok(c) => {
                    st.current = c;
                    st.generation += 1;
                    tracing::info!(section = %self.files.section, generation = st.generation, "TLS files changed: new connections use them");
                }
                // Logged once per change of the files, not once per handshake.
                Err(e) => {
                    tracing::error!(error = %e, "TLS files changed but cannot be used: keeping the ones in use")
                }
            }
        }
        st.current.clone()
    }

    fn generation(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .generation
    }
}

/// A server's TLS: the current [`ServerConfig`], rebuilt when its files change.
#[derive(Clone)]
pub struct ServerTls {
    reloading: Arc<Reloading<ServerConfig>>,
    allow_roleless_client_certs: bool,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("files", &self.reloading.files.entries)
            .field("mutual", &self.mutual())
            .field(
                "allow_roleless_client_certs",
                &self.allow_roleless_client_certs,
            )
            .finish()
    }
}

impl ServerTls {
    /// The config for the next handshake.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.reloading.current()
    }

    /// Whether clients must present a certificate (`client_ca` is set).
    pub fn mutual(&self) -> bool {
        self.reloading.files.roles.client_ca.is_some()
    }

    /// How many rotated sets have been taken since start.
    pub fn generation(&self) -> u64 {
        self.reloading.generation()
    }

    /// Runs the handshake on an accepted connection, within [`HANDSHAKE_TIMEOUT`].
    pub async fn accept(&self, tcp: TcpStream) -> std::io::Result<ServedIo> {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.config());
        let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out")
            })??;
        Ok(ServedIo::Tls(Box::new(tls)))
    }
}

/// A client's TLS: the current [`ClientConfig`], rebuilt when its files change.
#[derive(Clone)]
pub struct ClientTls(Arc<Reloading<ClientConfig>>);

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("files", &self.0.files.entries)
            .finish()
    }
}

impl ClientTls {
    /// The config for the next connection.
    pub fn config(&self) -> Arc<ClientConfig> {
        self.0.current()
    }

    /// How many rotated sets have been taken since start.
    pub fn generation(&self) -> u64 {
        self.0.generation()
    }

    /// Whether a client certificate is presented (`cert` and `key` are set).
    pub fn has_cert(&self) -> bool {
        self.0.files.roles.cert.is_some()
    }

    /// A connector for tonic channels: `https://` over TLS with this
    /// config, `http://` plain; the server's name is the URI's host.
    pub fn connector(&self) -> TlsConnector {
        TlsConnector {
            tls: Some(self.clone()),
            server_name: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

/// Connects tonic channels: TCP (with `TCP_NODELAY`), then TLS for
/// `https://` URIs with the [`ClientTls`]'s config of the moment, so a
/// rotated client certificate or CA applies to every new connection.
#[derive(Clone, Debug)]
pub struct TlsConnector {
    tls: Option<ClientTls>,
    server_name: Option<String>,
    connect_timeout: Duration,
}

impl TlsConnector {
    /// A connector that refuses `https://` (no TLS configured) and connects `http://` plain.
    pub fn plain() -> Self {
        Self {
            tls: None,
            server_name: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }

    /// Verifies the server as `name` rather than the URI's host (a runner
    /// reached at a resolved address is still checked against its DNS name).
    pub fn with_server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// Bounds the TCP connect and the TLS handshake.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    async fn connect(self, uri: http::Uri) -> Result<ClientIo, BoxError> {
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") | None => false,
            Some(other) => return Err(format!("`{uri}`: unsupported scheme {other}").into()),
        };
        let host = uri
            .host()
            .ok_or_else(|| format!("`{uri}` has no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let timeout = self.connect_timeout;
        let tcp = tokio::time::timeout(timeout, TcpStream::connect((host.as_str(), port)))
            .await
            .map_err(|_| format!("connecting to {host}:{port} timed out after {timeout:?}"))??;
        let _ = tcp.set_nodelay(true);
        if !https {
            return Ok(ClientIo::Plain(tcp));
        }
        let Some(tls) = self.tls else {
            return Err(
                format!("`{uri}` is https but no TLS is configured for this client").into(),
            );
        };
        let name = self.server_name.unwrap_or(host);
        let server_name = ServerName::try_from(name.clone())
            .map_err(|e| format!("`{name}` is not a valid TLS server name: {e}"))?;
        let connector = tokio_rustls::TlsConnector::from(tls.config());
        let stream = tokio::time::timeout(timeout, connector.connect(server_name, tcp))
            .await
            .map_err(|_| format!("TLS handshake with {name} timed out after {timeout:?}"))?
            .map_err(|e| TlsHandshakeError {
                server: name,
                source: e,
            })?;
        Ok(ClientIo::Tls(Box::new(stream)))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A TLS handshake with a server failed (an unknown CA, a wrong name, a
/// refused client certificate); says which server.
#[derive(Debug, thiserror::Error)]
#[error("TLS handshake with {server} failed: {source}")]
pub struct TlsHandshakeError {
    /// The name the server was verified as.
    pub server: String,
    /// What rustls said.
    #[source]
    pub source: std::io::Error,
}

impl tower::Service<http::Uri> for TlsConnector {
    type Response = hyper_util::rt::TokioIo<ClientIo>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let me = self.clone();
        Box::pin(async move { me.connect(uri).await.map(hyper_util::rt::TokioIo::new) })
    }
}

/// A client connection, plain or TLS.
#[derive(Debug)]
pub enum ClientIo {
    /// `http://`.
    Plain(TcpStream),
    /// `https://`.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// A server connection, plain or TLS; what [`crate::Host`] serves on.
#[derive(Debug)]
pub enum ServedIo {
    /// Without TLS.
    Plain(TcpStream),
    /// After a TLS handshake.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// Who is on the other end of a served connection; tonic puts it in every
/// request's extensions ([`PeerInfo::of`]).
#[derive(Clone, Debug, Default)]
pub struct PeerInfo {
    /// The peer's address.
    pub remote_addr: Option<SocketAddr>,
    /// The client certificate chain the handshake verified against
    /// `client_ca` (None: plain, or TLS without client certificates).
    pub client_certs: Option<Arc<[CertificateDer<'static>]>>,
    /// The URI subject alternative names of the verified client
    /// certificate (its leaf), read once when the connection was accepted;
    /// empty without one.
    pub client_uris: Arc<[String]>,
}

impl PeerInfo {
    /// The peer of the connection a request came on, if the server was a [`crate::Host`].
    pub fn of<B>(req: &http::Request<B>) -> Option<&PeerInfo> {
        req.extensions().get::<PeerInfo>()
    }

    /// Whether the peer proved itself with a client certificate from the configured CA.
    pub fn verified_client(&self) -> bool {
        self.client_certs.as_ref().is_some_and(|c| !c.is_empty())
    }
}

impl tonic::transport::server::Connected for ServedIo {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        match self {
            Self::Plain(s) => PeerInfo {
                remote_addr: s.peer_addr().ok(),
                client_certs: None,
                client_uris: Arc::default(),
            },
            Self::Tls(s) => {
                let (tcp, conn) = s.get_ref();
                // rustls exposes the peer's chain only once the verifier accepted it.
                let certs = conn.peer_certificates();
                PeerInfo {
                    remote_addr: tcp.peer_addr().ok(),
                    client_uris: certs
                        .and_then(|c| c.first())
                        .map(|leaf| uri_sans(leaf.as_ref()))
                        .unwrap_or_default()
                        .into(),
                    client_certs: certs.map(|c| Arc::from(c.to_vec())),
                }
            }
        }
    }
}

/// The URI subject alternative names of a DER certificate; none when it
/// has no SAN extension or cannot be parsed (the verifier already accepted
/// it, so that is a certificate that names no URI).
pub fn uri_sans(der: &[u8]) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return vec![];
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return vec![];
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(u) => Some((*u).to_owned()),
            _ => None,
        })
        .collect()
}

macro_rules! delegate_io {
    ($t:ty) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<std::io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
                }
            }
        }

        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<std::io::Result<usize>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
                }
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> Poll<std::io::Result<usize>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
                }
            }

            fn is_write_vectored(&self) -> bool {
                match self {
                    Self::Plain(s) => s.is_write_vectored(),
                    Self::Tls(s) => s.is_write_vectored(),
                }
            }

            fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_flush(cx),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
                }
            }

            fn poll_shutdown(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<std::io::Result<()>> {
                match self.get_mut() {
                    Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
                    Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
                }
            }
        }
    };
}

delegate_io!(ServedIo);
delegate_io!(ClientIo);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_configured_sets_name_the_missing_key() {
        let only_cert = TlsConfig {
            cert: "/x/tls.crt".into(),
            ..Default::default()
        };
        let e = only_cert.validate("tls").unwrap_err();
        assert_eq!(e.key_path(), Some("tls.key"));
        let mutual_without_cert = TlsConfig {
            client_ca: "/x/ca.crt".into(),
            ..Default::default()
        };
        assert_eq!(
            mutual_without_cert.validate("tls").unwrap_err().key_path(),
            Some("tls.cert")
        );
        let roleless_without_mtls = TlsConfig {
            cert: "/x/tls.crt".into(),
            key: "/x/tls.key".into(),
            allow_roleless_client_certs: true,
            ..Default::default()
        };
        assert_eq!(
            roleless_without_mtls
                .validate("tls")
                .unwrap_err()
                .key_path(),
            Some("tls.allow_roleless_client_certs")
        );
        assert!(TlsConfig::default().server("tls").unwrap().is_none());
        assert!(TlsConfig::default().client("tls").unwrap().is_none());
    }

    #[test]
    fn a_file_renamed_into_place_is_a_change_even_with_the_same_time_and_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, "CA one").unwrap();
        let named = path.display().to_string();
        let files = Files::new("tls", &[("ca", &named)]);
        let before = files.stamp();
        // What a rotation within one tick of the file clock looks like.
        let next = dir.path().join("ca.crt.new");
        std::fs::write(&next, "CA two").unwrap();
        let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::fs::File::options()
            .write(true)
            .open(&next)
            .unwrap()
            .set_modified(modified)
            .unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_ne!(files.stamp(), before);
    }

    #[test]
    fn uri_sans_of_what_is_no_certificate_are_none() {
        assert!(uri_sans(b"not a certificate").is_empty());
        assert!(uri_sans(&[]).is_empty());
    }

    #[test]
    fn a_missing_or_garbled_file_is_a_config_error_naming_key_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let garbled = dir.path().join("tls.crt");
        std::fs::write(&garbled, "not a certificate").unwrap();
        let cfg = TlsConfig {
            cert: garbled.display().to_string(),
            key: dir.path().join("missing.key").display().to_string(),
            ..Default::default()
        };
        let e = cfg.server("runner_tls").unwrap_err();
        assert_eq!(e.key_path(), Some("runner_tls.cert"));
        assert!(e.to_string().contains("tls.crt"), "{e}");
        std::fs::write(&garbled, "").unwrap();
        let cfg = TlsConfig {
            ca: dir.path().join("nope.pem").display().to_string(),
            ..Default::default()
        };
        let e = cfg.client("tls").unwrap_err();
        assert_eq!(e.key_path(), Some("tls.ca"));
        assert!(
            e.to_string().contains("nope.pem") && e.to_string().contains("cannot be read"),
            "{e}"
        );
    }
}
