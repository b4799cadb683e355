//! A streamable HTTP server: rmcp's transport over a reqwest client built here.

use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

use crate::config::McpConfigError;
use crate::stdio::MAX_MESSAGE_BYTES;

/// Longest time to establish a TCP (and TLS) connection to the server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP client of one server.
///
/// rustls is built with `ring` only, so the provider is installed here; without it
/// building the client fails (an `Err` from installing only means one is installed
/// already). No redirects are followed: the session ID and the bearer token must not
/// travel to another place. Idle connections are not pooled, as rmcp's own default
/// client does, because reusing one whose last body was not read to the end stalls on
/// delayed ACKs.
pub(crate) fn client(server: &str) -> Result<reqwest::Client, McpConfigError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| McpConfigError::HttpClient {
            server: server.to_owned(),
            reason: e.to_string(),
        })
}

/// A transport to `url`, with the configured headers and bearer token, and the same
/// bound on one message as stdio servers have.
pub(crate) fn transport(
    client: &reqwest::Client,
    url: &str,
    headers: &[(HeaderName, HeaderValue)],
    bearer_token: Option<&str>,
) -> StreamableHttpClientTransport<reqwest::Client> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned())
        .custom_headers(headers.iter().cloned().collect())
        .max_sse_event_size(MAX_MESSAGE_BYTES)
        .max_json_response_size(MAX_MESSAGE_BYTES);
    if let Some(token) = bearer_token {
        // rmcp adds the `Bearer ` prefix.
        config = config.auth_header(token.to_owned());
    }
    StreamableHttpClientTransport::with_client(client.clone(), config)
}
