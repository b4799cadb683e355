//! The HTTP leg of the adapters: one JSON POST with bounded retries (exponential
//! backoff with jitter, `Retry-After` honoured up to a cap) and a bounded body.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;

use super::config::ModelConfigError;
use crate::model::ModelError;

/// How much of an error body is quoted in the error message.
const ERROR_SNIPPET_BYTES: usize = 512;

/// Waits between retries; injectable so tests neither sleep nor guess at timings.
#[async_trait::async_trait]
pub trait Sleeper: Send + Sync + std::fmt::Debug {
    /// Waits for `delay`.
    async fn sleep(&self, delay: Duration);
}

/// The real wait.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioSleeper;

#[async_trait::async_trait]
impl Sleeper for TokioSleeper {
    async fn sleep(&self, delay: Duration) {
        tokio::time::sleep(delay).await;
    }
}

/// Bounded retries: at most `max_retries` after the first attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Backoff before the first retry (before jitter).
    pub initial_backoff: Duration,
    /// Longest backoff.
    pub max_backoff: Duration,
    /// Longest wait a `Retry-After` header may impose.
    pub max_retry_after: Duration,
}

impl RetryPolicy {
    /// The wait before retry number `retry` (0-based): the server's `Retry-After`
    /// (capped) when it gave one, else `initial * 2^retry` (capped) with "equal jitter"
    /// (uniform in the upper half), so synchronised clients spread out.
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>, rng: &mut impl Rng) -> Duration {
        if let Some(after) = retry_after {
            return after.min(self.max_retry_after);
        }
        let factor = 1u32.checked_shl(retry.min(20)).unwrap_or(u32::MAX);
        let base = self
            .initial_backoff
            .saturating_mul(factor)
            .min(self.max_backoff);
        let millis = u64::try_from(base.as_millis()).unwrap_or(u64::MAX);
        if millis == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis(rng.random_range(millis / 2..=millis))
    }
}

/// Parses the seconds form of `Retry-After` (the HTTP-date form is ignored: the
/// exponential backoff applies then).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    let secs: f64 = value.trim().parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(86_400.0)))
}

/// One attempt's failure.
enum Failure {
    /// Worth another attempt (429, 5xx, timeout, reset, truncated body).
    Retry {
        message: String,
        retry_after: Option<Duration>,
    },
    /// Asking again cannot help (4xx other than 429, oversized body).
    Fatal(String),
}

/// A JSON-over-HTTP client with the retry policy.
#[derive(Debug)]
pub(crate) struct Transport {
    client: reqwest::Client,
    retry: RetryPolicy,
    max_response_bytes: usize,
    rng: Mutex<StdRng>,
    sleeper: Arc<dyn Sleeper>,
}

impl Transport {
    pub(crate) fn new(
        timeout: Duration,
        connect_timeout: Duration,
        max_response_bytes: usize,
        retry: RetryPolicy,
        sleeper: Arc<dyn Sleeper>,
        seed: Option<u64>,
    ) -> Result<Transport, ModelConfigError> {
        crate::install_crypto();
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(connect_timeout)
            .build()
            .map_err(|e| ModelConfigError::Client(e.to_string()))?;
        let rng = match seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        Ok(Transport {
            client,
            retry,
            max_response_bytes,
            rng: Mutex::new(rng),
            sleeper,
        })
    }

    /// POSTs `body` to `url` and returns the response as JSON, retrying as the policy
    /// allows. The error keeps the provider's last status code in its message.
    pub(crate) async fn post_json(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, ModelError> {
        let body = serde_json::to_vec(body)
            .map_err(|e| ModelError::Provider(format!("cannot encode the request: {e}")))?;
        let mut retry = 0u32;
        loop {
            match self.attempt(url, headers, body.clone()).await {
                Ok(value) => return Ok(value),
                Err(Failure::Fatal(message)) => return Err(ModelError::Provider(message)),
                Err(Failure::Retry {
                    message,
                    retry_after,
                }) => {
                    if retry >= self.retry.max_retries {
                        return Err(ModelError::Provider(format!(
                            "{message} (gave up after {} attempts)",
                            retry + 1
                        )));
                    }
                    let delay = {
                        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
                        self.retry.delay(retry, retry_after, &mut *rng)
                    };
                    tracing::debug!(%url, retry, ?delay, %message, "retrying the model provider");
                    self.sleeper.sleep(delay).await;
                    retry += 1;
                }
            }
        }
    }

    async fn attempt(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<serde_json::Value, Failure> {
        let mut request = self
            .client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.map_err(|e| Failure::Retry {
            message: format!("request to {url} failed: {}", describe(&e)),
            retry_after: None,
        })?;
        let status = response.status();
        if !status.is_success() {
            let after = retry_after(response.headers());
            let snippet = read_bounded(response, ERROR_SNIPPET_BYTES)
                .await
                .map(|(bytes, _)| String::from_utf8_lossy(&bytes).into_owned())
                .unwrap_or_default();
            let message = format!("HTTP {}: {}", status.as_u16(), snippet.trim());
            return Err(
                if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
                    Failure::Retry {
                        message,
                        retry_after: after,
                    }
                } else {
                    Failure::Fatal(message)
                },
            );
        }
        let (bytes, complete) = read_bounded(response, self.max_response_bytes)
            .await
            .map_err(|message| Failure::Retry {
                message: format!(
                    "HTTP {}: reading the body failed: {message}",
                    status.as_u16()
                ),
                retry_after: None,
            })?;
        if !complete {
            return Err(Failure::Fatal(format!(
                "HTTP {}: response body over {} bytes",
                status.as_u16(),
                self.max_response_bytes
            )));
        }
        serde_json::from_slice(&bytes).map_err(|e| Failure::Retry {
            message: format!(
                "HTTP {}: response body is not complete JSON ({e})",
                status.as_u16()
            ),
            retry_after: None,
        })
    }
}

/// Reads at most `limit` bytes; the flag says whether the body ended within them.
async fn read_bounded(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<(Vec<u8>, bool), String> {
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| describe(&e))? {
        let room = limit.saturating_sub(bytes.len());
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            return Ok((bytes, false));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok((bytes, true))
}

/// The error with its causes, which is where reqwest says "connection reset".
fn describe(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    if error.is_timeout() {
        text.push_str(" (timeout)");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_retries: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(1000),
            max_retry_after: Duration::from_secs(5),
        }
    }

    #[test]
    fn backoff_doubles_with_jitter_and_is_capped() {
        let mut rng = StdRng::seed_from_u64(7);
        for (retry, base) in [
            (0, 100),
            (1, 200),
            (2, 400),
            (3, 800),
            (4, 1000),
            (30, 1000),
        ] {
            let d = policy().delay(retry, None, &mut rng).as_millis();
            assert!((base / 2..=base).contains(&d), "retry {retry}: {d}ms");
        }
        // The same seed gives the same waits.
        let a: Vec<_> = (0..4)
            .map(|r| policy().delay(r, None, &mut StdRng::seed_from_u64(1)))
            .collect();
        let b: Vec<_> = (0..4)
            .map(|r| policy().delay(r, None, &mut StdRng::seed_from_u64(1)))
            .collect();
        assert_eq!(a, b);
    }

    #[test]
    fn retry_after_wins_but_is_capped() {
        let mut rng = StdRng::seed_from_u64(7);
        let p = policy();
        assert_eq!(
            p.delay(0, Some(Duration::from_secs(2)), &mut rng),
            Duration::from_secs(2)
        );
        assert_eq!(
            p.delay(0, Some(Duration::from_secs(600)), &mut rng),
            Duration::from_secs(5)
        );
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::RETRY_AFTER, "3".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
        headers.insert(
            reqwest::header::RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), None);
    }
}
