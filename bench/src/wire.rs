//! What the cluster's processes ask of PostgreSQL and Redis, counted on the wire.
//!
//! A [`CountingProxy`] listens on a loopback port, forwards every connection to the real
//! server unchanged and reads the client's side of the stream as it passes: PostgreSQL's
//! frontend messages, or Redis's commands. The services are given the proxy's address
//! instead of the server's, so the counts are what the runtime really sends, whichever
//! server it is (the machine's, a managed one) and without any server-side extension.
//!
//! - **PostgreSQL**: a statement is a simple `Query` or an `Execute` of the extended
//!   protocol; a round trip is a `Query` or a `Sync`, each of which the client follows by
//!   waiting for `ReadyForQuery`. The proxy answers an `SSLRequest` or `GSSENCRequest`
//!   itself with `N` (unencrypted), which a client's default `sslmode=prefer` accepts; a
//!   URL that requires TLS fails to connect, since encrypted messages could not be read.
//! - **Redis**: a command is one request (a RESP array, or an inline line), each a round
//!   trip its caller waits for (pipelined ones share the connection's round trip, and
//!   are still counted one by one); a script (`EVALSHA`) is one. Counted by name.
//!
//! Bounds: at most [`MAX_CONNECTIONS`] connections at once (more are refused by closing
//! them); a RESP line is kept up to [`MAX_LINE_BYTES`] and a command name up to
//! [`MAX_NAME_BYTES`], and what is longer is passed on unread.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};

use agentloop_store::databases;
use anyhow::{Context, bail};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Most connections one proxy forwards at once.
pub const MAX_CONNECTIONS: usize = 1_024;
/// Longest RESP line (an array or bulk header, an inline command) that is parsed.
pub const MAX_LINE_BYTES: usize = 1_024;
/// Longest command name that is kept.
pub const MAX_NAME_BYTES: usize = 32;
/// Size of each direction's copy buffer.
const BUFFER_BYTES: usize = 16 * 1024;
/// How long the accept loop waits after a failed accept.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(50);

/// Which protocol a proxy reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// PostgreSQL's frontend/backend protocol, version 3.
    Postgres,
    /// RESP (Redis).
    Redis,
}

/// What one proxy counted so far.
#[derive(Debug, Default)]
struct Counters {
    statements: AtomicU64,
    round_trips: AtomicU64,
    pings: AtomicU64,
    statements_by_kind: Mutex<BTreeMap<String, u64>>,
    commands: AtomicU64,
    commands_by_name: Mutex<BTreeMap<String, u64>>,
}

impl Counters {
    /// One statement, by its first keyword (`?` when it is not known).
    fn statement(&self, kind: &str) {
        self.statements.fetch_add(1, Relaxed);
        count(
            &self.statements_by_kind,
            if kind.is_empty() { "?" } else { kind },
        );
    }

    /// One Redis command, by name.
    fn command(&self, name: &str) {
        self.commands.fetch_add(1, Relaxed);
        count(&self.commands_by_name, name);
    }
}

fn count(by: &Mutex<BTreeMap<String, u64>>, key: &str) {
    let mut by = by.lock().unwrap_or_else(PoisonError::into_inner);
    match by.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            by.insert(key.to_owned(), 1);
        }
    }
}

/// A snapshot of the counts; [`WireCounts::since`] gives what a run added.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WireCounts {
    /// PostgreSQL statements executed.
    pub statements: u64,
    /// PostgreSQL round trips (a `Query` or a `Sync`).
    pub round_trips: u64,
    /// Round trips that were a bare `Sync`: a connection pool's check of a connection.
    pub pings: u64,
    /// PostgreSQL statements by first keyword (upper case).
    pub statements_by_kind: BTreeMap<String, u64>,
    /// Redis commands.
    pub commands: u64,
    /// Redis commands by name (upper case).
    pub commands_by_name: BTreeMap<String, u64>,
}

impl WireCounts {
    /// What was counted after `earlier` was taken.
    pub fn since(&self, earlier: &WireCounts) -> WireCounts {
        WireCounts {
            statements: self.statements.saturating_sub(earlier.statements),
            round_trips: self.round_trips.saturating_sub(earlier.round_trips),
            pings: self.pings.saturating_sub(earlier.pings),
            statements_by_kind: difference(&self.statements_by_kind, &earlier.statements_by_kind),
            commands: self.commands.saturating_sub(earlier.commands),
            commands_by_name: difference(&self.commands_by_name, &earlier.commands_by_name),
        }
    }

    /// One proxy's PostgreSQL counts with another's Redis counts.
    pub fn join(postgres: WireCounts, redis: WireCounts) -> WireCounts {
        WireCounts {
            commands: redis.commands,
            commands_by_name: redis.commands_by_name,
            ..postgres
        }
    }
}

/// `now` less `earlier`, key by key, without the keys that did not grow.
fn difference(
    now: &BTreeMap<String, u64>,
    earlier: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    now.iter()
        .map(|(key, n)| {
            (
                key.clone(),
                n.saturating_sub(earlier.get(key).copied().unwrap_or(0)),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The `host:port` a URL of `protocol` names (the protocol's port if it names none).
///
/// # Errors
///
/// A URL without a host, or one asking for TLS, which would hide the messages.
pub fn upstream(url: &str, protocol: Protocol) -> anyhow::Result<String> {
    let (schemes, default_port): (&[&str], u16) = match protocol {
        Protocol::Postgres => (&["postgres://", "postgresql://"], 5432),
        Protocol::Redis => (&["redis://"], 6379),
    };
    if !schemes.iter().any(|scheme| url.starts_with(scheme)) {
        bail!(
            "{}: the cluster bench counts on the wire, so it takes {} URLs without TLS",
            databases::redact(url),
            schemes[0]
        );
    }
    let query = url.split_once('?').map_or("", |(_, query)| query);
    if query.split('&').any(|pair| {
        matches!(
            pair,
            "sslmode=require" | "sslmode=verify-ca" | "sslmode=verify-full"
        )
    }) {
        bail!(
            "{}: the cluster bench counts on the wire, so it cannot require TLS",
            databases::redact(url)
        );
    }
    let address = &url[authority(url)?];
    let bracketed_port = address.starts_with('[') && address.contains("]:");
    let port = bracketed_port || (!address.starts_with('[') && address.contains(':'));
    Ok(if port {
        address.to_owned()
    } else {
        format!("{address}:{default_port}")
    })
}

/// `url` with its host and port replaced by `proxy`'s.
///
/// # Errors
///
/// A URL without a host.
pub fn through(url: &str, proxy: SocketAddr) -> anyhow::Result<String> {
    let range = authority(url)?;
    Ok(format!(
        "{}{proxy}{}",
        &url[..range.start],
        &url[range.end..]
    ))
}

/// Where a URL's `host[:port]` is: after the scheme and any user, before the path.
fn authority(url: &str) -> anyhow::Result<std::ops::Range<usize>> {
    let start = url
        .find("://")
        .map(|at| at + 3)
        .with_context(|| format!("{} is not a URL", databases::redact(url)))?;
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |at| start + at);
    let host = url[start..end]
        .rfind('@')
        .map_or(start, |at| start + at + 1);
    if host == end {
        bail!("{} names no host", databases::redact(url));
    }
    Ok(host..end)
}

/// A forwarding proxy that counts; it stops with the value.
#[derive(Debug)]
pub struct CountingProxy {
    address: SocketAddr,
    counters: Arc<Counters>,
    /// The accept loop and every connection's pumps: aborted on drop.
    tasks: JoinSet<()>,
}

impl CountingProxy {
    /// Listens on a free loopback port and forwards to `upstream` (`host:port`).
    ///
    /// # Errors
    ///
    /// When no loopback port can be bound.
    pub async fn start(protocol: Protocol, upstream: String) -> anyhow::Result<CountingProxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("cannot bind the counting proxy's port")?;
        let address = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let mut tasks = JoinSet::new();
        tasks.spawn(accept(listener, protocol, upstream, Arc::clone(&counters)));
        Ok(CountingProxy {
            address,
            counters,
            tasks,
        })
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The counts so far.
    pub fn counts(&self) -> WireCounts {
        let c = &self.counters;
        let copy = |by: &Mutex<BTreeMap<String, u64>>| {
            by.lock().unwrap_or_else(PoisonError::into_inner).clone()
        };
        WireCounts {
            statements: c.statements.load(Relaxed),
            round_trips: c.round_trips.load(Relaxed),
            pings: c.pings.load(Relaxed),
            statements_by_kind: copy(&c.statements_by_kind),
            commands: c.commands.load(Relaxed),
            commands_by_name: copy(&c.commands_by_name),
        }
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

/// Accepts until the proxy is dropped (which aborts this task and, through the set it
/// owns, every connection).
async fn accept(
    listener: TcpListener,
    protocol: Protocol,
    upstream: String,
    counters: Arc<Counters>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        let accepted = listener.accept().await;
        // Reap the connections that ended, so the set stays as large as those open.
        while connections.try_join_next().is_some() {}
        let client = match accepted {
            Ok((client, _)) => client,
            Err(error) => {
                // A full descriptor table clears as connections close: back off instead
                // of spinning on the same error.
                tracing::warn!(%error, "the counting proxy could not accept");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::warn!("the counting proxy is at {MAX_CONNECTIONS} connections: refused one");
            continue;
        };
        let (upstream, counters) = (upstream.clone(), Arc::clone(&counters));
        connections.spawn(async move {
            if let Err(error) = forward(client, &upstream, protocol, &counters).await {
                tracing::debug!(%error, "a proxied connection ended");
            }
            drop(slot);
        });
    }
}

/// Forwards one connection both ways, counting what the client sends.
async fn forward(
    mut client: TcpStream,
    upstream: &str,
    protocol: Protocol,
    counters: &Counters,
) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    let mut reader = match protocol {
        Protocol::Postgres => Reader::Postgres(PgFrontend::new(negotiate(&mut client).await?)),
        Protocol::Redis => Reader::Redis(Resp::default()),
    };
    let mut server = TcpStream::connect(upstream).await?;
    server.set_nodelay(true)?;
    if let Reader::Postgres(frontend) = &reader {
        server.write_all(&frontend.startup).await?;
    }
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let requests = async {
        let mut buffer = vec![0; BUFFER_BYTES];
        loop {
            let n = client_read.read(&mut buffer).await?;
            if n == 0 {
                return server_write.shutdown().await;
            }
            let bytes = &buffer[..n];
            reader.feed(bytes, counters);
            server_write.write_all(bytes).await?;
        }
    };
    let replies = tokio::io::copy(&mut server_read, &mut client_write);
    // Either side closing ends the connection.
    tokio::select! {
        result = requests => result,
        result = replies => result.map(|_| ()),
    }
}

/// PostgreSQL's untyped opening: answers encryption requests with `N` until the client
/// sends its startup (or cancel) message, which it returns whole (length-prefixed, at
/// most 10 KiB as the server allows).
async fn negotiate(client: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    const SSL_REQUEST: u32 = 80_877_103;
    const GSSENC_REQUEST: u32 = 80_877_104;
    const MAX_STARTUP_BYTES: usize = 10_000;
    loop {
        let mut head = [0u8; 8];
        client.read_exact(&mut head).await?;
        let length = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let code = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        if length == 8 && (code == SSL_REQUEST || code == GSSENC_REQUEST) {
            client.write_all(b"N").await?;
            continue;
        }
        if !(8..=MAX_STARTUP_BYTES).contains(&length) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a startup message of {length} bytes"),
            ));
        }
        let mut startup = head.to_vec();
        startup.resize(length, 0);
        client.read_exact(&mut startup[8..]).await?;
        return Ok(startup);
    }
}

/// The client side's reader of one connection.
enum Reader {
    Postgres(PgFrontend),
    Redis(Resp),
}

impl Reader {
    fn feed(&mut self, bytes: &[u8], counters: &Counters) {
        match self {
            Reader::Postgres(frontend) => frontend.feed(bytes, counters),
            Reader::Redis(resp) => resp.feed(bytes, counters),
        }
    }
}

/// PostgreSQL's typed frontend messages: a type byte and a length that counts itself.
/// The first [`CAPTURE_BYTES`] of a `Query`, `Parse`, `Bind` or `Execute` are kept, to
/// name each statement by its first keyword: a `Parse` names its statement's, a `Bind`
/// ties a portal to a statement, an `Execute` runs a portal.
#[derive(Debug)]
struct PgFrontend {
    /// The startup message, to forward before anything else.
    startup: Vec<u8>,
    header: [u8; 5],
    have: usize,
    /// Body bytes of the current message still to pass.
    left: usize,
    captured: Vec<u8>,
    /// Prepared statements' keywords, by name; portals' keywords, by name.
    statements: HashMap<Vec<u8>, String>,
    portals: HashMap<Vec<u8>, String>,
    /// A message other than `Sync` came since the last `Sync`.
    since_sync: bool,
}

/// How much of a message body is kept to name its statement.
const CAPTURE_BYTES: usize = 256;
/// Most prepared statements or portals remembered per connection (the client's
/// statement cache is smaller; past this, the map starts over).
const MAX_NAMES: usize = 4_096;

impl PgFrontend {
    fn new(startup: Vec<u8>) -> PgFrontend {
        PgFrontend {
            startup,
            header: [0; 5],
            have: 0,
            left: 0,
            captured: Vec::new(),
            statements: HashMap::new(),
            portals: HashMap::new(),
            since_sync: false,
        }
    }

    fn feed(&mut self, mut bytes: &[u8], counters: &Counters) {
        while !bytes.is_empty() {
            if self.have < self.header.len() {
                let n = (self.header.len() - self.have).min(bytes.len());
                self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
                self.have += n;
                bytes = &bytes[n..];
                if self.have < self.header.len() {
                    return;
                }
                let [_, length @ ..] = self.header;
                self.left = (u32::from_be_bytes(length) as usize).saturating_sub(4);
                self.captured.clear();
            }
            let n = self.left.min(bytes.len());
            if matches!(self.header[0], b'Q' | b'P' | b'B' | b'E') {
                let room = CAPTURE_BYTES.saturating_sub(self.captured.len());
                self.captured.extend_from_slice(&bytes[..n.min(room)]);
            }
            self.left -= n;
            bytes = &bytes[n..];
            if self.left == 0 {
                self.have = 0;
                self.message(counters);
            }
        }
    }

    /// One whole message (its captured start).
    fn message(&mut self, counters: &Counters) {
        let mut fields = self.captured.split(|b| *b == 0);
        let mut field = || fields.next().unwrap_or_default().to_vec();
        match self.header[0] {
            b'Q' => {
                counters.statement(&keyword(&self.captured));
                counters.round_trips.fetch_add(1, Relaxed);
            }
            b'P' => {
                let (name, query) = (field(), field());
                remember(&mut self.statements, name, keyword(&query));
            }
            b'B' => {
                let (portal, statement) = (field(), field());
                let kind = self.statements.get(&statement).cloned().unwrap_or_default();
                remember(&mut self.portals, portal, kind);
            }
            b'E' => {
                let portal = field();
                counters.statement(self.portals.get(&portal).map_or("", String::as_str));
            }
            b'S' => {
                counters.round_trips.fetch_add(1, Relaxed);
                if !self.since_sync {
                    counters.pings.fetch_add(1, Relaxed);
                }
            }
            _ => {}
        }
        // A `Query` is a cycle of its own, as a `Sync` ends one.
        self.since_sync = !matches!(self.header[0], b'S' | b'Q');
    }
}

fn remember(names: &mut HashMap<Vec<u8>, String>, name: Vec<u8>, kind: String) {
    if names.len() >= MAX_NAMES && !names.contains_key(&name) {
        names.clear();
    }
    names.insert(name, kind);
}

/// The first keyword of an SQL text, upper case (`SELECT`, `BEGIN`, `WITH`, ...).
fn keyword(sql: &[u8]) -> String {
    let start = sql
        .iter()
        .position(|b| !(b.is_ascii_whitespace() || *b == b'('))
        .unwrap_or(sql.len());
    let word: Vec<u8> = sql[start..]
        .iter()
        .take_while(|b| b.is_ascii_alphabetic())
        .take(16)
        .map(u8::to_ascii_uppercase)
        .collect();
    String::from_utf8_lossy(&word).into_owned()
}

/// Where a RESP request stream is.
#[derive(Debug, Default, Clone, Copy)]
enum RespState {
    /// At the start of a request: `*N` or an inline command.
    #[default]
    Request,
    /// Expecting the `$L` header of the next of `left` bulk strings; `first` for the
    /// command's name.
    Header { left: u64, first: bool },
    /// Inside a bulk string: `remaining` bytes, its CRLF included, before the next of
    /// `left`.
    Bulk {
        left: u64,
        remaining: u64,
        first: bool,
    },
}

/// Redis requests: arrays of bulk strings, or inline lines.
#[derive(Debug, Default)]
struct Resp {
    state: RespState,
    line: Vec<u8>,
    /// The line went past [`MAX_LINE_BYTES`]: it is not parsed.
    long_line: bool,
    name: Vec<u8>,
}

impl Resp {
    fn feed(&mut self, mut bytes: &[u8], counters: &Counters) {
        while !bytes.is_empty() {
            if let RespState::Bulk {
                left,
                remaining,
                first,
            } = self.state
            {
                let n = remaining.min(bytes.len() as u64) as usize;
                if first {
                    // The name's own bytes, not its CRLF.
                    let content = (remaining.saturating_sub(2) as usize).min(n);
                    let room = MAX_NAME_BYTES.saturating_sub(self.name.len());
                    self.name.extend_from_slice(&bytes[..content.min(room)]);
                }
                bytes = &bytes[n..];
                let remaining = remaining - n as u64;
                self.state = match (remaining, left) {
                    (0, 1) => {
                        self.command(counters);
                        RespState::Request
                    }
                    (0, _) => RespState::Header {
                        left: left - 1,
                        first: false,
                    },
                    _ => RespState::Bulk {
                        left,
                        remaining,
                        first,
                    },
                };
                continue;
            }
            // A line, up to its LF.
            let (taken, ended) = match bytes.iter().position(|b| *b == b'\n') {
                Some(at) => (at + 1, true),
                None => (bytes.len(), false),
            };
            if self.line.len() + taken <= MAX_LINE_BYTES {
                self.line.extend_from_slice(&bytes[..taken]);
            } else {
                self.long_line = true;
            }
            bytes = &bytes[taken..];
            if ended {
                self.line_ended(counters);
            }
        }
    }

    fn line_ended(&mut self, counters: &Counters) {
        let line = std::mem::take(&mut self.line);
        let long = std::mem::take(&mut self.long_line);
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        let number = |prefix: u8| -> Option<i64> {
            let digits = text.strip_prefix(&[prefix])?;
            std::str::from_utf8(digits).ok()?.parse().ok()
        };
        self.state = match self.state {
            RespState::Request if long => {
                // An inline command too long to read: counted, nameless.
                self.command(counters);
                RespState::Request
            }
            RespState::Request if text.first() == Some(&b'*') => match number(b'*') {
                Some(n) if n > 0 => RespState::Header {
                    left: n as u64,
                    first: true,
                },
                // `*0`, `*-1`, or garbage: no command.
                Some(_) | None => RespState::Request,
            },
            RespState::Request => {
                if !text.is_empty() {
                    // An inline command: its first word is the name.
                    let word = text.split(|b| *b == b' ').next().unwrap_or_default();
                    self.name = word[..word.len().min(MAX_NAME_BYTES)].to_vec();
                    self.command(counters);
                }
                RespState::Request
            }
            RespState::Header { left, first } => match number(b'$') {
                Some(length) if !long && length >= 0 => RespState::Bulk {
                    left,
                    remaining: length as u64 + 2,
                    first,
                },
                // A null bulk string: an element with nothing in it.
                Some(_) if !long && left > 1 => RespState::Header {
                    left: left - 1,
                    first: false,
                },
                Some(_) if !long => {
                    self.command(counters);
                    RespState::Request
                }
                // Not RESP: drop this request and resynchronise at the next line.
                Some(_) | None => {
                    self.name.clear();
                    RespState::Request
                }
            },
            bulk @ RespState::Bulk { .. } => bulk,
        };
    }

    fn command(&mut self, counters: &Counters) {
        let name = String::from_utf8_lossy(&std::mem::take(&mut self.name)).to_ascii_uppercase();
        counters.command(&name);
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn counts(counters: &Counters) -> (u64, u64, u64) {
        (
            counters.statements.load(Relaxed),
            counters.round_trips.load(Relaxed),
            counters.commands.load(Relaxed),
        )
    }

    /// A typed frontend message.
    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut bytes = vec![kind];
        bytes.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        bytes.extend_from_slice(body);
        bytes
    }

    #[test]
    fn postgres_statements_are_counted_by_keyword_whatever_the_chunks() {
        // A simple query; a prepare of a named statement (parse, describe, sync); a
        // bare sync (a pool's ping); one batch that binds the named statement and an
        // unnamed one, each to a portal, and executes both; a simple commit; terminate.
        let mut stream = message(b'Q', b"  BEGIN\0");
        stream.extend(message(
            b'P',
            b"s1\0\n  SELECT body FROM events WHERE id = $1\0\0\0",
        ));
        stream.extend(message(b'D', b"Ss1\0"));
        stream.extend(message(b'S', b""));
        stream.extend(message(b'S', b""));
        stream.extend(message(b'P', b"\0(INSERT INTO events VALUES ($1))\0\0\0"));
        stream.extend(message(b'B', b"p1\0s1\0\0\0\0\0\0\0"));
        stream.extend(message(b'E', b"p1\0\0\0\0\0"));
        stream.extend(message(b'B', b"\0\0\0\0\0\0\0\0"));
        stream.extend(message(b'E', b"\0\0\0\0\0"));
        stream.extend(message(b'S', b""));
        stream.extend(message(b'Q', b"COMMIT\0"));
        stream.extend(message(b'X', b""));
        for chunk in [1, 2, 3, 7, stream.len()] {
            let counters = Counters::default();
            let mut frontend = PgFrontend::new(Vec::new());
            for piece in stream.chunks(chunk) {
                frontend.feed(piece, &counters);
            }
            assert_eq!(counts(&counters), (4, 5, 0), "chunks of {chunk}");
            assert_eq!(counters.pings.load(Relaxed), 1, "chunks of {chunk}");
            assert_eq!(
                counters.statements_by_kind.lock().unwrap().clone(),
                BTreeMap::from([
                    ("BEGIN".to_owned(), 1),
                    ("COMMIT".to_owned(), 1),
                    ("INSERT".to_owned(), 1),
                    ("SELECT".to_owned(), 1),
                ]),
                "chunks of {chunk}"
            );
        }
    }

    #[test]
    fn a_long_query_is_named_by_its_start_and_passed_on_whole() {
        let query = format!("UPDATE invocations SET {}\0", "x = 1, ".repeat(1_000));
        let mut body = b"big\0".to_vec();
        body.extend_from_slice(query.as_bytes());
        let mut stream = message(b'P', &body);
        stream.extend(message(b'B', b"\0big\0\0\0\0\0\0\0"));
        stream.extend(message(b'E', b"\0\0\0\0\0"));
        stream.extend(message(b'S', b""));
        let counters = Counters::default();
        let mut frontend = PgFrontend::new(Vec::new());
        for piece in stream.chunks(100) {
            frontend.feed(piece, &counters);
        }
        assert_eq!(counts(&counters), (1, 1, 0));
        assert_eq!(
            counters.statements_by_kind.lock().unwrap().clone(),
            BTreeMap::from([("UPDATE".to_owned(), 1)])
        );
    }

    #[test]
    fn redis_commands_are_counted_by_name_whatever_the_chunks() {
        let stream: &[u8] = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n*x\r\n\
            *2\r\n$7\r\nevalsha\r\n$-1\r\n\
            PING\r\n\
            *1\r\n$4\r\nPING\r\n\
            *0\r\n";
        for chunk in [1, 2, 5, stream.len()] {
            let counters = Counters::default();
            let mut resp = Resp::default();
            for piece in stream.chunks(chunk) {
                resp.feed(piece, &counters);
            }
            let by_name = counters.commands_by_name.lock().unwrap().clone();
            assert_eq!(counts(&counters).2, 4, "chunks of {chunk}: {by_name:?}");
            assert_eq!(
                by_name,
                BTreeMap::from([
                    ("EVALSHA".to_owned(), 1),
                    ("PING".to_owned(), 2),
                    ("SET".to_owned(), 1)
                ]),
                "chunks of {chunk}"
            );
        }
    }

    #[test]
    fn a_long_argument_is_passed_over_and_a_long_name_cut() {
        let big = "x".repeat(10 * MAX_LINE_BYTES);
        let long_name = "N".repeat(2 * MAX_NAME_BYTES);
        let stream = format!(
            "*2\r\n${}\r\n{long_name}\r\n${}\r\n{big}\r\n*1\r\n$3\r\nGET\r\n",
            long_name.len(),
            big.len()
        );
        let counters = Counters::default();
        let mut resp = Resp::default();
        for piece in stream.as_bytes().chunks(100) {
            resp.feed(piece, &counters);
        }
        let by_name = counters.commands_by_name.lock().unwrap().clone();
        assert_eq!(
            by_name,
            BTreeMap::from([("N".repeat(MAX_NAME_BYTES), 1), ("GET".to_owned(), 1)])
        );
    }

    #[test]
    fn urls_are_pointed_at_the_proxy_and_tls_is_refused() {
        let proxy: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let cases = [
            (
                "postgres://u:p@db.example:6543/agentloop_bench_1?application_name=x",
                Protocol::Postgres,
                "db.example:6543",
                "postgres://u:p@127.0.0.1:4000/agentloop_bench_1?application_name=x",
            ),
            (
                "postgresql://postgres@localhost/postgres",
                Protocol::Postgres,
                "localhost:5432",
                "postgresql://postgres@127.0.0.1:4000/postgres",
            ),
            (
                "redis://[::1]/0",
                Protocol::Redis,
                "[::1]:6379",
                "redis://127.0.0.1:4000/0",
            ),
            (
                "redis://:secret@[::1]:6380",
                Protocol::Redis,
                "[::1]:6380",
                "redis://:secret@127.0.0.1:4000",
            ),
        ];
        for (url, protocol, upstream_address, proxied) in cases {
            assert_eq!(upstream(url, protocol).unwrap(), upstream_address, "{url}");
            assert_eq!(through(url, proxy).unwrap(), proxied, "{url}");
        }
        for (url, protocol) in [
            ("rediss://host:6379", Protocol::Redis),
            ("postgres://host/db?sslmode=require", Protocol::Postgres),
            ("postgres:///db", Protocol::Postgres),
            ("redis://user@/0", Protocol::Redis),
            ("mysql://host/db", Protocol::Postgres),
        ] {
            let error = upstream(url, protocol).unwrap_err().to_string();
            assert!(!error.contains("secret"), "{error}");
        }
    }

    #[test]
    fn counts_since_subtract_and_drop_names_not_seen_again() {
        let before = WireCounts {
            statements: 5,
            round_trips: 4,
            pings: 1,
            statements_by_kind: BTreeMap::from([("SELECT".to_owned(), 5)]),
            commands: 3,
            commands_by_name: BTreeMap::from([("PING".to_owned(), 3)]),
        };
        let after = WireCounts {
            statements: 9,
            round_trips: 6,
            pings: 2,
            statements_by_kind: BTreeMap::from([("SELECT".to_owned(), 7), ("BEGIN".to_owned(), 2)]),
            commands: 5,
            commands_by_name: BTreeMap::from([("PING".to_owned(), 3), ("GET".to_owned(), 2)]),
        };
        assert_eq!(
            after.since(&before),
            WireCounts {
                statements: 4,
                round_trips: 2,
                pings: 1,
                statements_by_kind: BTreeMap::from([
                    ("SELECT".to_owned(), 2),
                    ("BEGIN".to_owned(), 2)
                ]),
                commands: 2,
                commands_by_name: BTreeMap::from([("GET".to_owned(), 2)]),
            }
        );
    }
}
