//! A broker guard: an in-process loopback listener the broker client connects to instead of
//! the broker. For each connection it opens the real one (TCP, TLS when the URL or the server
//! asks) and copies bytes both ways through a [`Filter`] per direction, so what the broker
//! sends is read, and made harmless, before the client's own decoder sees it
//! (docs/decisions.md, "Poison messages").
//!
//! A guard lives as long as the intake consumer that made it; dropping it closes its listener
//! and every connection through it.

use bytes::BytesMut;
use std::io;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tracing::{debug, warn};

/// One direction of a guarded connection: bytes in, bytes out.
pub(crate) trait Filter: Send + 'static {
    /// Moves what of `input` can be judged to `output`, rewritten where needed, and leaves an
    /// incomplete unit (frame, line, message) in `input` for the next read.
    fn filter(&mut self, input: &mut BytesMut, output: &mut Vec<u8>);
}

/// The protocol a guard speaks: its filters and how its connections begin.
pub(crate) trait Protocol: Send + Sync + 'static {
    /// The filters of one new connection: (broker to client, client to broker).
    fn filters(&self) -> (Box<dyn Filter>, Box<dyn Filter>);
    /// Whether TLS starts after the server's first line (NATS: INFO is sent in the clear,
    /// then the client upgrades when the URL or the INFO asks), rather than at connect.
    fn tls_after_first_line(&self) -> bool {
        false
    }
}

/// Where a guard connects.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Upstream {
    /// The broker's host name or address (no brackets).
    pub host: String,
    /// The broker's port.
    pub port: u16,
    /// Whether the URL asks for TLS (`amqps://`, `tls://`).
    pub tls: bool,
}

/// A URL split for a guard: `scheme://[userinfo@]host[:port][rest]`.
#[derive(Debug, PartialEq)]
pub(crate) struct SplitUrl<'a> {
    /// The scheme, lower case as written.
    pub scheme: &'a str,
    /// `user:password@` when present (with the `@`), kept for the client.
    pub userinfo: &'a str,
    /// The host, without IPv6 brackets; `localhost` when the URL has none (as the clients
    /// read it).
    pub host: &'a str,
    /// The port, when written.
    pub port: Option<u16>,
    /// Path and query, from the first `/` or `?` on.
    pub rest: &'a str,
}

/// Splits `url`; `None` when it is not `scheme://host...`.
pub(crate) fn split_url(url: &str) -> Option<SplitUrl<'_>> {
    let (scheme, after) = url.split_once("://")?;
    let end = after.find(['/', '?']).unwrap_or(after.len());
    let (authority, rest) = after.split_at(end);
    let (userinfo, hostport) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (host, tail) = v6.split_once(']')?;
        (host, tail.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    let port = match port {
        Some(p) => Some(p.parse().ok()?),
        None => None,
    };
    let host = if host.is_empty() { "localhost" } else { host };
    Some(SplitUrl {
        scheme,
        userinfo,
        host,
        port,
        rest,
    })
}

/// A running guard: its loopback port, and the last failure to reach the broker.
#[derive(Debug)]
pub(crate) struct Guard {
    port: u16,
    last_error: Arc<Mutex<Option<String>>>,
    task: JoinHandle<()>,
}

impl Guard {
    /// Listens on `127.0.0.1:0` for connections to guard on their way to `upstream`.
    pub(crate) async fn start(
        upstream: Upstream,
        protocol: Arc<dyn Protocol>,
    ) -> io::Result<Guard> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let port = listener.local_addr()?.port();
        let tls = if upstream.tls || protocol.tls_after_first_line() {
            Some(tls_connector().map_err(io::Error::other)?)
        } else {
            None
        };
        let last_error = Arc::new(Mutex::new(None));
        let errors = last_error.clone();
        let task = tokio::spawn(async move {
            // Dropped with the task when the guard is: every connection through it ends.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((client, _)) => {
                            let (upstream, protocol, tls, errors) =
                                (upstream.clone(), protocol.clone(), tls.clone(), errors.clone());
                            connections.spawn(async move {
                                if let Err(e) = relay(client, &upstream, &*protocol, tls).await {
                                    debug!(error = %e, "guarded broker connection ended");
                                    *errors.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                                }
                            });
                        }
                        Err(e) => {
                            warn!(error = %e, "broker guard: accept failed");
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        }
                    },
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Ok(Guard {
            port,
            last_error,
            task,
        })
    }

    /// The loopback port the client connects to.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Why the last guarded connection failed, taken (so the next failure is its own).
    pub(crate) fn take_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A byte stream to the broker, plain or TLS.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// TLS to the broker: the platform's roots (as lapin and async-nats verify), ring.
fn tls_connector() -> Result<tokio_rustls::TlsConnector, rustls::Error> {
    use rustls_platform_verifier::BuilderVerifierExt;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_platform_verifier()?
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

async fn tls_to(
    tls: &tokio_rustls::TlsConnector,
    host: &str,
    tcp: TcpStream,
) -> io::Result<Box<dyn Stream>> {
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    Ok(Box::new(tls.connect(name, tcp).await?))
}

/// The longest first line read before TLS (a NATS INFO).
const MAX_FIRST_LINE: usize = 64 * 1024;

/// One guarded connection: open the broker's, then copy both ways until either side ends.
async fn relay(
    client: TcpStream,
    upstream: &Upstream,
    protocol: &dyn Protocol,
    tls: Option<tokio_rustls::TlsConnector>,
) -> io::Result<()> {
    let _ = client.set_nodelay(true);
    let mut tcp = TcpStream::connect((upstream.host.as_str(), upstream.port))
        .await
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("{}:{}: {e}", upstream.host, upstream.port),
            )
        })?;
    let _ = tcp.set_nodelay(true);
    let mut first = Vec::new();
    let broker: Box<dyn Stream> = match tls {
        Some(tls) if protocol.tls_after_first_line() => {
            // Read the first line in the clear; TLS when the URL or the line asks for it.
            let mut byte = [0u8; 1];
            while !first.ends_with(b"\r\n") {
                if first.len() > MAX_FIRST_LINE || tcp.read(&mut byte).await? == 0 {
                    return Err(io::Error::other("the broker's first line did not come"));
                }
                first.push(byte[0]);
            }
            if upstream.tls || line_asks_tls(&first) {
                tls_to(&tls, &upstream.host, tcp).await?
            } else {
                Box::new(tcp)
            }
        }
        Some(tls) => tls_to(&tls, &upstream.host, tcp).await?,
        None => Box::new(tcp),
    };
    let (down, up) = protocol.filters();
    let (broker_read, broker_write) = tokio::io::split(broker);
    let (client_read, client_write) = client.into_split();
    tokio::select! {
        r = pump(broker_read, client_write, down, first) => r,
        r = pump(client_read, broker_write, up, Vec::new()) => r,
    }
}

/// Whether a NATS INFO line says the server requires TLS.
fn line_asks_tls(line: &[u8]) -> bool {
    line.strip_prefix(b"INFO ")
        .and_then(|json| serde_json::from_slice::<serde_json::Value>(json).ok())
        .is_some_and(|info| info["tls_required"] == true)
}

/// Copies `from` to `to` through `filter`, starting with `first` (bytes already read).
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut filter: Box<dyn Filter>,
    first: Vec<u8>,
) -> io::Result<()> {
    let mut input = BytesMut::from(&first[..]);
    let mut output = Vec::new();
    loop {
        filter.filter(&mut input, &mut output);
        if !output.is_empty() {
            to.write_all(&output).await?;
            output.clear();
        }
        input.reserve(64 * 1024);
        if from.read_buf(&mut input).await? == 0 {
            // Whatever was left incomplete goes on as it is; the peer decides.
            to.write_all(&input).await?;
            let _ = to.shutdown().await;
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_what_the_guard_and_the_client_need() {
        let u = split_url("amqps://user:p%40ss@broker.example:5671/%2f?heartbeat=10").unwrap();
        assert_eq!(
            u,
            SplitUrl {
                scheme: "amqps",
                userinfo: "user:p%40ss@",
                host: "broker.example",
                port: Some(5671),
                rest: "/%2f?heartbeat=10",
            }
        );
        let u = split_url("nats://[::1]:4222").unwrap();
        assert_eq!((u.host, u.port, u.rest), ("::1", Some(4222), ""));
        let u = split_url("tls://nats.example").unwrap();
        assert_eq!((u.host, u.port, u.userinfo), ("nats.example", None, ""));
        assert_eq!(split_url("amqp:///%2f").unwrap().host, "localhost");
        assert!(split_url("localhost:4222").is_none());
        assert!(split_url("amqp://host:notaport/").is_none());
    }

    #[test]
    fn an_info_line_asks_for_tls_only_when_it_says_so() {
        assert!(line_asks_tls(b"INFO {\"tls_required\":true}\r\n"));
        assert!(!line_asks_tls(b"INFO {\"tls_required\":false}\r\n"));
        assert!(!line_asks_tls(b"INFO {}\r\n"));
        assert!(!line_asks_tls(b"-ERR 'x'\r\n"));
    }
}
