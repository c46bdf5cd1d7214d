//! The NATS broker guard: async-nats connects to loopback ports, and what the server sends
//! reaches it through [`line_guard`](super::line_guard) (docs/decisions.md, "Poison messages
//! over NATS"). One guard per server of the URL; TLS to the server when the URL is `tls://` or
//! the server's `INFO` requires it, the client speaking plain NATS to the guard.

use super::NatsError;
use super::line_guard::ServerLines;
use crate::edge::intake::guard::{Filter, Guard, Protocol, Upstream, split_url};
use bytes::BytesMut;
use std::sync::Arc;

/// The NATS protocol for [`Guard`].
struct Nats;

/// The server's side: [`ServerLines`].
struct FromServer(ServerLines);

impl Filter for FromServer {
    fn filter(&mut self, input: &mut BytesMut, output: &mut Vec<u8>) {
        self.0.feed(input, output);
    }
}

/// The client's side, passed on as it is.
struct FromClient;

impl Filter for FromClient {
    fn filter(&mut self, input: &mut BytesMut, output: &mut Vec<u8>) {
        output.extend_from_slice(input);
        input.clear();
    }
}

impl Protocol for Nats {
    fn filters(&self) -> (Box<dyn Filter>, Box<dyn Filter>) {
        (
            Box::new(FromServer(ServerLines::default())),
            Box::new(FromClient),
        )
    }
    fn tls_after_first_line(&self) -> bool {
        true
    }
}

/// Guards in front of the servers of `url` (one or more, comma-separated), and the URL the
/// client connects to instead: the same credentials, at the guards' loopback ports.
pub(super) async fn start(url: &str) -> Result<(Vec<Guard>, String), NatsError> {
    let bad = |why: String| NatsError::Guard(why);
    let mut guards = Vec::new();
    let mut urls = Vec::new();
    for one in url.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let split = split_url(one)
            .ok_or_else(|| bad("the URL is not nats://host... or tls://host...".into()))?;
        let tls = match split.scheme.to_ascii_lowercase().as_str() {
            "nats" => false,
            "tls" => true,
            other => return Err(bad(format!("scheme {other:?} is neither nats nor tls"))),
        };
        let upstream = Upstream {
            host: split.host.to_string(),
            port: split.port.unwrap_or(4222),
            tls,
        };
        let guard = Guard::start(upstream, Arc::new(Nats))
            .await
            .map_err(|e| bad(format!("cannot start the broker guard: {e}")))?;
        urls.push(format!(
            "nats://{}127.0.0.1:{}",
            split.userinfo,
            guard.port()
        ));
        guards.push(guard);
    }
    if guards.is_empty() {
        return Err(bad("no server in the URL".into()));
    }
    Ok((guards, urls.join(",")))
}
