//! Mutual TLS between services: an internal service (the demo executor, as a tool owner
//! deploys it) behind `server_tls` with a client CA and callers named by SPIFFE ID. Real
//! certificates from a generated CA, real handshakes on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use agentloop_auth::{CallerConfig, CallersConfig};
use agentloop_demo_executor::{DemoConfig, DemoExecutor};
use agentloop_proto::client::{ClientConfig, connect};
use agentloop_proto::v1 as pb;
use agentloop_server::{Access, ClientTlsFiles, ServerTls};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
use tokio::sync::oneshot;
use tonic::Code;

const ORCHESTRATOR: &str = "spiffe://agentloop.test/orchestrator";
const GATEWAY: &str = "spiffe://agentloop.test/tools";
const TOKEN: &str = "the-orchestrator-service-token-0123456789";

/// A certificate authority that writes PEM files.
struct Authority {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl Authority {
    fn new() -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Authority {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A leaf for `dns` names and `uris`, as (certificate file, key file) in `dir`.
    fn leaf(&self, dir: &Path, name: &str, dns: &[&str], uris: &[&str]) -> (PathBuf, PathBuf) {
        let mut params =
            CertificateParams::new(dns.iter().map(|d| (*d).to_owned()).collect::<Vec<_>>())
                .unwrap();
        for uri in uris {
            params
                .subject_alt_names
                .push(SanType::URI((*uri).try_into().unwrap()));
        }
        let key = KeyPair::generate().unwrap();
        let certificate = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_file, key_file) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_file, certificate.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        (cert_file, key_file)
    }

    fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(format!("{name}.pem"));
        std::fs::write(&path, &self.pem).unwrap();
        path
    }
}

struct Served {
    endpoint: String,
    _stop: oneshot::Sender<()>,
}

async fn serve(dir: &Path, access: Access) -> Served {
    let executor = DemoExecutor::open(DemoConfig {
        data_dir: dir.join("executor"),
        ..DemoConfig::default()
    })
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(agentloop_demo_executor::run(
        listener,
        executor,
        access,
        async {
            let _ = stopped.await;
        },
    ));
    Served {
        endpoint: format!("https://localhost:{port}"),
        _stop: stop,
    }
}

/// `Describe` over TLS with `client` (the CA and maybe a certificate) and maybe a token.
async fn describe(endpoint: &str, client: &ClientTlsFiles, token: Option<&str>) -> Code {
    let config = ClientConfig::default()
        .with_tls(Some(client.load().unwrap()))
        .with_bearer(token)
        .unwrap();
    let transport = match connect(endpoint, config).await {
        Ok(transport) => transport,
        // The handshake refused us before any call.
        Err(_) => return Code::Unavailable,
    };
    match agentloop_proto::client::tool_executor(transport)
        .describe(pb::DescribeRequest::default())
        .await
    {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_listed_callers_reach_a_service_over_mutual_tls() {
    agentloop_server::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let trusted = Authority::new();
    let stranger = Authority::new();
    let ca = trusted.write(dir, "ca");
    let (cert_file, key_file) = trusted.leaf(dir, "server", &["localhost"], &[]);
    let token_file = dir.join("orchestrator.token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let callers = CallersConfig {
        callers: vec![CallerConfig {
            name: "orchestrator".into(),
            token_file: Some(token_file),
            spiffe_id: Some(ORCHESTRATOR.into()),
        }],
    };
    let tls = ServerTls {
        cert_file,
        key_file,
        client_ca_file: Some(ca.clone()),
    };
    let served = serve(dir, Access::load(&callers, Some(&tls)).unwrap()).await;

    let as_client = |cert: Option<(PathBuf, PathBuf)>| ClientTlsFiles {
        ca_file: ca.clone(),
        cert_file: cert.as_ref().map(|(c, _)| c.clone()),
        key_file: cert.map(|(_, k)| k),
    };
    let orchestrator = as_client(Some(trusted.leaf(
        dir,
        "orchestrator",
        &[],
        &[ORCHESTRATOR],
    )));
    let gateway = as_client(Some(trusted.leaf(dir, "gateway", &[], &[GATEWAY])));
    let impostor = as_client(Some(stranger.leaf(dir, "impostor", &[], &[ORCHESTRATOR])));
    let anonymous = as_client(None);

    // The listed caller's certificate is enough.
    assert_eq!(
        describe(&served.endpoint, &orchestrator, None).await,
        Code::Ok
    );
    // A certificate of the right CA that names another caller is not.
    assert_eq!(
        describe(&served.endpoint, &gateway, None).await,
        Code::Unauthenticated
    );
    // ...unless it carries a listed caller's token: both credentials are accepted.
    assert_eq!(
        describe(&served.endpoint, &gateway, Some(TOKEN)).await,
        Code::Ok
    );
    // No client certificate, or one from another CA: the handshake refuses, even with
    // the token, so the call fails in the transport (tonic says UNKNOWN, UNAVAILABLE or,
    // when TLS 1.3 sends the refusal after the client's handshake ended, CANCELLED),
    // never in the service.
    for client in [&anonymous, &impostor] {
        let code = describe(&served.endpoint, client, Some(TOKEN)).await;
        assert!(
            matches!(code, Code::Unavailable | Code::Unknown | Code::Cancelled),
            "refused in the handshake, got {code:?}"
        );
    }
    // Plain text to a TLS port gets nowhere.
    let plain = format!("http://{}", served.endpoint.trim_start_matches("https://"));
    let transport = connect(&plain, ClientConfig::default()).await;
    let refused = match transport {
        Err(_) => true,
        Ok(transport) => agentloop_proto::client::tool_executor(transport)
            .describe(pb::DescribeRequest::default())
            .await
            .is_err(),
    };
    assert!(refused, "a plain-text call to a TLS port must fail");
}

#[test]
fn a_caller_named_by_certificate_needs_a_listener_that_asks_for_one() {
    let callers = CallersConfig {
        callers: vec![CallerConfig {
            name: "orchestrator".into(),
            token_file: None,
            spiffe_id: Some(ORCHESTRATOR.into()),
        }],
    };
    let error = Access::load(&callers, None).unwrap_err();
    assert!(error.contains("server_tls.client_ca_file"), "{error}");
    let without_ca = ServerTls {
        cert_file: "/nonexistent/server.crt".into(),
        key_file: "/nonexistent/server.key".into(),
        client_ca_file: None,
    };
    let error = Access::load(&callers, Some(&without_ca)).unwrap_err();
    assert!(error.contains("server_tls.client_ca_file"), "{error}");
    // TLS settings for a plain-text endpoint are refused rather than ignored.
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::new().write(dir.path(), "ca");
    let tls = ClientTlsFiles {
        ca_file: ca,
        cert_file: None,
        key_file: None,
    }
    .load()
    .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let refused = runtime.block_on(connect(
        "http://127.0.0.1:1",
        ClientConfig::default().with_tls(Some(tls)).with_lazy(true),
    ));
    assert!(refused.is_err());
}
