//! Certificates for TLS tests, made on the spot with rcgen: CAs, leaf
//! certificates for `localhost` and `127.0.0.1` signed by them (usable as
//! server and as client certificates), PEM files written the way
//! Kubernetes rotates a mounted Secret (a new file renamed into place), and
//! a raw TLS client that reports the certificate a server presented.

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A certificate authority.
pub struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// Its certificate, PEM.
    pub pem: String,
}

/// A certificate and its key.
pub struct Leaf {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PEM (PKCS#8).
    pub key_pem: String,
    /// The certificate, DER.
    pub der: Vec<u8>,
    /// Its serial number.
    pub serial: u64,
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn new(name: &str) -> Ca {
        let key = rcgen::KeyPair::generate().expect("CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("CA certificate");
        Ca {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A certificate for `localhost` and `127.0.0.1`, common name `name`,
    /// serial `serial`, for both server and client authentication; it names
    /// no omicos role.
    pub fn leaf(&self, name: &str, serial: u64) -> Leaf {
        self.leaf_with_uris(name, serial, &[])
    }

    /// [`Ca::leaf`] for an omicos part in `role` (`runner`, `orchestrator`,
    /// ...): its certificate also names the role as the URI SAN
    /// `spiffe://omicos/<role>`.
    pub fn part(&self, role: &str, serial: u64) -> Leaf {
        self.leaf_with_uris(role, serial, &[&format!("spiffe://omicos/{role}")])
    }

    /// [`Ca::leaf`] with these URI subject alternative names besides the DNS and IP ones.
    pub fn leaf_with_uris(&self, name: &str, serial: u64, uris: &[&str]) -> Leaf {
        self.leaf_for(name, serial, &["localhost", "127.0.0.1"], uris)
    }

    /// A certificate for exactly `names` (DNS names, wildcards such as
    /// `*.svc.example` included, or IP addresses) and the URI SANs `uris`,
    /// for both server and client authentication: what a cert-manager
    /// Certificate with these `dnsNames`/`ipAddresses` and `uris` issues.
    pub fn leaf_for(&self, name: &str, serial: u64, names: &[&str], uris: &[&str]) -> Leaf {
        let key = rcgen::KeyPair::generate().expect("leaf key");
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("leaf params");
        for u in uris {
            params.subject_alt_names.push(rcgen::SanType::URI(
                rcgen::string::Ia5String::try_from(*u).expect("a URI in IA5"),
            ));
        }
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.serial_number = Some(rcgen::SerialNumber::from(serial));
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
            serial,
        }
    }

    /// Writes the CA certificate to `dir/name`; returns the path.
    pub fn write(&self, dir: &Path, name: &str) -> String {
        let p = dir.join(name);
        replace(&p, &self.pem);
        p.display().to_string()
    }
}

impl Leaf {
    /// Writes `dir/<stem>.crt` and `dir/<stem>.key`; returns their paths.
    pub fn write(&self, dir: &Path, stem: &str) -> (String, String) {
        let (c, k) = (
            dir.join(format!("{stem}.crt")),
            dir.join(format!("{stem}.key")),
        );
        replace(&c, &self.cert_pem);
        replace(&k, &self.key_pem);
        (c.display().to_string(), k.display().to_string())
    }
}

/// Replaces `path` with `text`: written beside it, then renamed over it, so
/// a reader sees the old file or the new one, never half of one.
pub fn replace(path: &Path, text: &str) {
    let tmp: PathBuf = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// The serial number of a DER certificate.
pub fn serial_of(der: &[u8]) -> u64 {
    let (_, cert) = x509_parser::parse_x509_certificate(der).expect("a certificate");
    cert.raw_serial()
        .iter()
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// The common name of a DER certificate's subject.
pub fn subject_of(der: &[u8]) -> String {
    let (_, cert) = x509_parser::parse_x509_certificate(der).expect("a certificate");
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// Opens a TLS connection to `addr` as a client trusting `ca_pem`,
/// presenting `client` when given, and sends an HTTP/2 preface and reads a
/// little: a server refuses a client certificate only after the TLS 1.3
/// handshake, and that refusal arrives on the first read. Ok: the DER of
/// the certificate the server presented; Err: why the connection failed.
pub async fn served_cert(
    addr: SocketAddr,
    ca_pem: &str,
    client: Option<&Leaf>,
) -> Result<Vec<u8>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("CA PEM")).expect("CA");
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots);
    let mut config = match client {
        Some(l) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from(l.der.clone())],
                PrivateKeyDer::from_pem_slice(l.key_pem.as_bytes()).expect("key"),
            )
            .expect("client cert"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let mut tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let served = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .ok_or("no server certificate")?;
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = [0u8; 9];
    // The server's SETTINGS frame, or the alert that refuses us.
    match tokio::time::timeout(std::time::Duration::from_secs(5), tls.read(&mut buf)).await {
        Ok(Ok(n)) if n > 0 => Ok(served),
        Ok(Ok(_)) => Err("closed by the server".into()),
        Ok(Err(e)) => Err(format!("refused: {e}")),
        Err(_) => Err("no answer within 5 s".into()),
    }
}

/// `GET path` over HTTP/1.1 and TLS (ALPN `http/1.1`, what a browser
/// fetching the page speaks), trusting `ca_pem`; the whole response as text.
pub async fn https_get(addr: SocketAddr, ca_pem: &str, path: &str) -> Result<String, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("CA PEM")).expect("CA");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(|e| format!("write: {e}"))?;
    let mut out = Vec::new();
    // A server may close without close_notify once it has answered.
    let _ =
        tokio::time::timeout(std::time::Duration::from_secs(5), tls.read_to_end(&mut out)).await;
    Ok(String::from_utf8_lossy(&out).into_owned())
}
