//! Reading `/metrics` as Prometheus does, for tests: one GET over a real connection
//! (its samples are read by [`crate::metrics::sample`]).

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The most bytes read of one response: a scrape of every agentloop metric is a few
/// tens of kilobytes.
const MAX_RESPONSE_BYTES: u64 = 16 * 1024 * 1024;

/// `GET /metrics` of `address` (`host:port`): the body of a 200 answer.
///
/// # Errors
///
/// When the connection fails or the answer is not a 200 with a body.
pub async fn get(address: &str) -> std::io::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: scrape\r\nconnection: close\r\n\r\n")
        .await?;
    let mut response = String::new();
    stream
        .take(MAX_RESPONSE_BYTES)
        .read_to_string(&mut response)
        .await?;
    let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| invalid(format!("no end of headers in {response:?}")))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(invalid(format!("answered {head:?}")));
    }
    Ok(body.to_owned())
}
