//! TLS on a service's listener and on its clients, from PEM files, and [`Access`]: who
//! may reach a service and how.
//!
//! With a `client_ca_file` a listener serves mutual TLS: the handshake refuses a client
//! without a certificate that chains to the CA, and the [guard](crate::ServiceSet::add_for)
//! names the caller by the certificate's URI SAN (a SPIFFE ID its callers list). A service
//! token is still accepted beside it, so a deployment can move from one to the other.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentloop_auth::{Callers, CallersConfig};
use agentloop_proto::client::ClientTls;
use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// Largest PEM file read, in bytes.
const MAX_PEM_BYTES: u64 = 1024 * 1024;
/// Longest TLS handshake a listener waits for.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS on a listener (`server_tls`): its certificate chain and key, and for mutual TLS
/// the CA its callers' client certificates must chain to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    /// The listener's certificate chain (PEM).
    pub cert_file: PathBuf,
    /// Its private key (PEM).
    pub key_file: PathBuf,
    /// The CA of client certificates (PEM); set, a client without one is refused in the
    /// handshake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ca_file: Option<PathBuf>,
}

impl ServerTls {
    /// The listener's TLS configuration, its files read.
    ///
    /// # Errors
    ///
    /// A message naming the key and the file that cannot be read.
    pub fn load(&self) -> Result<ServerTlsConfig, String> {
        let cert = read_pem("server_tls.cert_file", &self.cert_file)?;
        let key = read_pem("server_tls.key_file", &self.key_file)?;
        let mut config = ServerTlsConfig::new()
            .identity(Identity::from_pem(cert, key))
            .timeout(HANDSHAKE_TIMEOUT);
        if let Some(ca) = &self.client_ca_file {
            let ca = read_pem("server_tls.client_ca_file", ca)?;
            config = config.client_ca_root(Certificate::from_pem(ca));
        }
        Ok(config)
    }
}

/// TLS of a service's clients (`client_tls`): the CA its servers' certificates chain to,
/// and for mutual TLS its own certificate and key. Endpoints are then `https://`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTlsFiles {
    /// The servers' CA (PEM).
    pub ca_file: PathBuf,
    /// This service's client certificate (PEM), for servers that ask for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
}

impl ClientTlsFiles {
    /// The files read, for [`agentloop_proto::client::ClientConfig::with_tls`].
    ///
    /// # Errors
    ///
    /// A message naming the key and the file that cannot be read, or a certificate
    /// without its key (or the other way round).
    pub fn load(&self) -> Result<ClientTls, String> {
        let ca = read_pem("client_tls.ca_file", &self.ca_file)?;
        let identity = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => Some((
                read_pem("client_tls.cert_file", cert)?,
                read_pem("client_tls.key_file", key)?,
            )),
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => {
                return Err("client_tls.cert_file and client_tls.key_file go together".into());
            }
        };
        Ok(ClientTls::new(ca, identity))
    }
}

/// Who may reach a service and how: the callers it accepts (`None`: anyone who reaches
/// the port) and TLS on its listener.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// The callers it accepts, by service token or client certificate.
    pub callers: Option<Callers>,
    /// TLS on the listener.
    pub tls: Option<ServerTlsConfig>,
}

impl Access {
    /// The access `callers` and `tls` configure, their files read. A caller known only
    /// by its SPIFFE ID needs a listener that asks for client certificates.
    ///
    /// # Errors
    ///
    /// A message naming the key at fault.
    pub fn load(callers: &CallersConfig, tls: Option<&ServerTls>) -> Result<Access, String> {
        let by_certificate = callers.callers.iter().any(|c| c.spiffe_id.is_some());
        if by_certificate && tls.is_none_or(|tls| tls.client_ca_file.is_none()) {
            return Err(
                "auth.callers name a spiffe_id, which needs server_tls.client_ca_file".into(),
            );
        }
        Ok(Access {
            callers: Callers::from_config(callers).map_err(|e| e.to_string())?,
            tls: tls.map(ServerTls::load).transpose()?,
        })
    }
}

fn read_pem(key: &str, path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("{key} {}: {e}", path.display()))?;
    let mut pem = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut pem)
        .map_err(|e| format!("{key} {}: {e}", path.display()))?;
    if pem.len() as u64 > MAX_PEM_BYTES {
        return Err(format!("{key} {}: larger than 1 MiB", path.display()));
    }
    if !pem.starts_with(b"-----BEGIN") && !pem.windows(10).any(|w| w == b"-----BEGIN") {
        return Err(format!("{key} {}: not PEM", path.display()));
    }
    Ok(pem)
}
