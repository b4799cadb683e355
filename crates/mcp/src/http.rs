//! A streamable HTTP server: rmcp's transport over a reqwest client built here, which
//! adds OAuth tokens for a server that asks for them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use sse_stream::Sse;

use crate::config::McpConfigError;
use crate::oauth::OAuth;
use crate::stdio::MAX_MESSAGE_BYTES;

/// Longest time to establish a TCP (and TLS) connection to the server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most times one request is sent: once, again with a renewed token after a `401`, and
/// again after a scope step-up. A server that keeps refusing gets its refusal back.
const MAX_SENDS: usize = 3;

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

/// A transport to `url`, with the configured headers and bearer token (or OAuth), and
/// the same bound on one message as stdio servers have.
pub(crate) fn transport(
    client: &reqwest::Client,
    url: &str,
    headers: &[(HeaderName, HeaderValue)],
    bearer_token: Option<&str>,
    oauth: Option<&Arc<OAuth>>,
) -> StreamableHttpClientTransport<Authorized> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned())
        .custom_headers(headers.iter().cloned().collect())
        .max_sse_event_size(MAX_MESSAGE_BYTES)
        .max_json_response_size(MAX_MESSAGE_BYTES);
    if let Some(token) = bearer_token {
        // rmcp adds the `Bearer ` prefix.
        config = config.auth_header(token.to_owned());
    }
    let client = Authorized {
        http: client.clone(),
        oauth: oauth.cloned(),
    };
    StreamableHttpClientTransport::with_client(client, config)
}

/// reqwest, with the server's OAuth client (if it has one) answering its `401` and `403`
/// challenges: a request refused for its token is sent again with a new one.
///
/// Sending again is safe: a server that answers `401` or `403` has not acted on the
/// request.
#[derive(Debug, Clone)]
pub(crate) struct Authorized {
    http: reqwest::Client,
    oauth: Option<Arc<OAuth>>,
}

type HttpResult<T> = Result<T, StreamableHttpError<reqwest::Error>>;

impl Authorized {
    async fn send<T, F, Fut>(&self, token: Option<String>, call: F) -> HttpResult<T>
    where
        F: Fn(Option<String>) -> Fut,
        Fut: Future<Output = HttpResult<T>>,
    {
        let Some(oauth) = &self.oauth else {
            return call(token).await;
        };
        let mut token = oauth.current().await?;
        let mut sends = 1;
        loop {
            let result = call(token.clone()).await;
            if sends == MAX_SENDS {
                return result;
            }
            let renewed = match &result {
                Err(StreamableHttpError::AuthRequired(refusal)) => {
                    oauth
                        .renew(&refusal.www_authenticate_header, token.as_deref())
                        .await?
                }
                Err(StreamableHttpError::InsufficientScope(refusal)) => {
                    oauth
                        .upgrade(&refusal.www_authenticate_header, token.as_deref())
                        .await?
                }
                _ => return result,
            };
            token = Some(renewed);
            sends += 1;
        }
    }
}

impl StreamableHttpClient for Authorized {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> HttpResult<StreamableHttpPostResponse> {
        self.send(auth_header, |token| {
            self.http.post_message(
                Arc::clone(&uri),
                message.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
            )
        })
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> HttpResult<StreamableHttpPostResponse> {
        self.send(auth_header, |token| {
            self.http.post_message_with_max_sse_event_size(
                Arc::clone(&uri),
                message.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
                max_sse_event_size,
            )
        })
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> HttpResult<StreamableHttpPostResponse> {
        self.send(auth_header, |token| {
            self.http.post_message_with_response_limits(
                Arc::clone(&uri),
                message.clone(),
                session_id.clone(),
                token,
                custom_headers.clone(),
                limits,
            )
        })
        .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> HttpResult<()> {
        self.send(auth_header, |token| {
            self.http.delete_session(
                Arc::clone(&uri),
                Arc::clone(&session_id),
                token,
                custom_headers.clone(),
            )
        })
        .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> HttpResult<BoxStream<'static, Result<Sse, SseError>>> {
        self.send(auth_header, |token| {
            self.http.get_stream(
                Arc::clone(&uri),
                session_id.clone(),
                last_event_id.clone(),
                token,
                custom_headers.clone(),
            )
        })
        .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> HttpResult<BoxStream<'static, Result<Sse, SseError>>> {
        self.send(auth_header, |token| {
            self.http.get_stream_with_max_sse_event_size(
                Arc::clone(&uri),
                session_id.clone(),
                last_event_id.clone(),
                token,
                custom_headers.clone(),
                max_sse_event_size,
            )
        })
        .await
    }
}
