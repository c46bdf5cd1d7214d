//! Clients that hang up: a raw-TCP `POST /v1/messages/{consumer}` that closes its connection
//! at a chosen point instead of waiting for the answer — a client timeout, a proxy giving up,
//! a deploy, a load generator that stops. Issue 11, item 1: whatever the client does, a claim
//! that committed must be performed by the worker that committed it.
//!
//! The request is written by hand (no client library closes a socket half way through its
//! own headers). Closing is a plain `close` (FIN) or, for [`HangUp::Reset`], an abortive close
//! (`SO_LINGER` 0: RST), as a process that dies or a proxy that resets does.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One intake post.
#[derive(Debug, Clone)]
pub struct Post {
    /// Consumer name (the URL path).
    pub consumer: String,
    /// `Idempotency-Key`.
    pub key: String,
    /// `Tenant-Id` (or the consumer's tenant header), when any.
    pub tenant: Option<(String, String)>,
    /// The body (sent as `application/json`).
    pub body: Vec<u8>,
}

impl Post {
    /// A post to `consumer` with `key` and a JSON `body`, no tenant.
    pub fn new(consumer: &str, key: &str, body: impl Into<Vec<u8>>) -> Post {
        Post {
            consumer: consumer.into(),
            key: key.into(),
            tenant: None,
            body: body.into(),
        }
    }

    /// The same post under a tenant header.
    pub fn tenant(mut self, header: &str, tenant: &str) -> Post {
        self.tenant = Some((header.into(), tenant.into()));
        self
    }

    /// The request bytes, and where its header section ends.
    fn bytes(&self) -> (Vec<u8>, usize) {
        let mut head = format!(
            "POST /v1/messages/{} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nIdempotency-Key: {}\r\nContent-Length: {}\r\n",
            self.consumer,
            self.key,
            self.body.len()
        );
        if let Some((name, value)) = &self.tenant {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        let mut out = head.into_bytes();
        let headers_end = out.len();
        out.extend_from_slice(&self.body);
        (out, headers_end)
    }
}

/// Where the client hangs up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum HangUp {
    /// Part of the header section, then close: the server never has a whole request (nothing
    /// may be claimed).
    MidHeaders,
    /// The whole request but half of the body, then close (nothing may be claimed).
    MidBody,
    /// The whole request, then close at once without reading.
    AfterBody,
    /// The whole request, wait this long, then close without reading (the client:
    /// 0.5–30 ms).
    After(Duration),
    /// The whole request, wait this long, then reset the connection (RST).
    Reset(Duration),
    /// The whole request, read the first bytes of the answer, then close.
    AfterPartialAnswer,
}

impl HangUp {
    /// A hang-up point drawn from `r`: mostly after the whole request (0.5–30 ms later, some
    /// with a reset), some mid-request and some after part of the answer.
    pub fn random(r: &mut fastrand::Rng) -> HangUp {
        let after = Duration::from_micros(r.u64(500..30_000));
        match r.u32(0..20) {
            0 => HangUp::MidHeaders,
            1 => HangUp::MidBody,
            2 => HangUp::AfterBody,
            3..=4 => HangUp::Reset(after),
            5..=6 => HangUp::AfterPartialAnswer,
            _ => HangUp::After(after),
        }
    }

    /// Whether the server received a whole request (so a claim may have committed).
    pub fn sent_whole_request(self) -> bool {
        !matches!(self, HangUp::MidHeaders | HangUp::MidBody)
    }
}

/// What a hung-up post saw.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    /// Could not connect or write (the server was not there): nothing was sent.
    NotSent,
    /// Hung up before any answer was read. The message may or may not have been claimed: to
    /// the client it is *not* acknowledged.
    NoAnswer,
    /// Hung up after reading the start of the answer: the status, when the first bytes held
    /// it (a `202`/`200` read here is an acknowledgement).
    PartialAnswer(Option<u16>),
}

impl Seen {
    /// The status the client read, if any.
    pub fn status(&self) -> Option<u16> {
        match self {
            Seen::PartialAnswer(s) => *s,
            _ => None,
        }
    }
}

/// Sends `post` to `addr` and hangs up at `how`.
pub async fn post_and_hang_up(addr: SocketAddr, post: &Post, how: HangUp) -> Seen {
    let Ok(Ok(mut s)) =
        tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr)).await
    else {
        return Seen::NotSent;
    };
    let _ = s.set_nodelay(true);
    let (req, headers_end) = post.bytes();
    let cut = match how {
        HangUp::MidHeaders => headers_end / 2,
        HangUp::MidBody if !post.body.is_empty() => headers_end + post.body.len() / 2,
        HangUp::MidBody => headers_end - 3,
        _ => req.len(),
    };
    if s.write_all(&req[..cut]).await.is_err() {
        return Seen::NotSent;
    }
    let seen = match how {
        HangUp::MidHeaders | HangUp::MidBody | HangUp::AfterBody => Seen::NoAnswer,
        HangUp::After(d) => {
            tokio::time::sleep(d).await;
            Seen::NoAnswer
        }
        HangUp::Reset(d) => {
            tokio::time::sleep(d).await;
            let _ = s.set_zero_linger();
            Seen::NoAnswer
        }
        HangUp::AfterPartialAnswer => {
            let mut buf = [0u8; 12];
            let mut got = 0;
            // The status line's first 12 bytes ("HTTP/1.1 202"), or less if the server closed.
            while got < buf.len() {
                match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf[got..])).await {
                    Ok(Ok(n)) if n > 0 => got += n,
                    _ => break,
                }
            }
            let status = std::str::from_utf8(&buf[..got])
                .ok()
                .and_then(|t| t.get(9..12))
                .and_then(|c| c.parse().ok());
            Seen::PartialAnswer(status)
        }
    };
    drop(s);
    seen
}

/// Sends `post` and reads the whole answer: the status (`None` when the connection failed or
/// no answer came within `timeout`).
pub async fn post_and_read(addr: SocketAddr, post: &Post, timeout: Duration) -> Option<u16> {
    let mut s = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let (req, _) = post.bytes();
    s.write_all(&req).await.ok()?;
    // The status line is all that is needed; the rest of the answer is read and dropped so the
    // server's write completes.
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    let end = tokio::time::Instant::now() + timeout;
    loop {
        let n = tokio::time::timeout_at(end, s.read(&mut buf))
            .await
            .ok()?
            .ok()?;
        out.extend_from_slice(&buf[..n]);
        if n == 0 || complete(&out) {
            break;
        }
    }
    std::str::from_utf8(out.get(..12)?)
        .ok()?
        .get(9..12)?
        .parse()
        .ok()
}

/// Whether `out` holds a whole HTTP/1.1 answer (headers and `Content-Length` bytes of body).
fn complete(out: &[u8]) -> bool {
    let Some(pos) = out.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&out[..pos]).to_ascii_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    out.len() >= pos + 4 + len
}

/// What a run of [`send_all`] sent and saw.
#[derive(Debug, Default, Clone)]
pub struct Sent {
    /// Posts written (whole or in part).
    pub posts: usize,
    /// Posts whose client hung up.
    pub hung_up: usize,
    /// Keys of which at least one whole request reached the server (a claim may exist).
    pub whole: std::collections::HashSet<String>,
    /// Keys a client saw acknowledged (`202`/`200` read, whole or in part).
    pub acked: std::collections::HashSet<String>,
    /// Reading clients' posts that ended without a `202`/`200` (after retrying `503`s).
    pub unexpected: Vec<(String, Option<u16>)>,
}

/// Sends `posts` to `addr` from `hanging` clients that hang up at a point drawn by
/// `how` and `reading` clients that read every answer (a `503` is sent again, as a real client
/// would). Each client takes the next post from one shared queue.
pub async fn send_all(
    addr: SocketAddr,
    posts: Vec<Post>,
    hanging: usize,
    reading: usize,
    seed: u64,
    how: fn(&mut fastrand::Rng) -> HangUp,
) -> Sent {
    use std::sync::{Arc, Mutex};
    let queue = Arc::new(Mutex::new(posts));
    let sent = Arc::new(Mutex::new(Sent::default()));
    let mut tasks = Vec::new();
    for client in 0..hanging + reading {
        let (queue, sent) = (queue.clone(), sent.clone());
        let hangs = client < hanging;
        tasks.push(tokio::spawn(async move {
            let mut r = fastrand::Rng::with_seed(seed ^ (client as u64 + 1));
            loop {
                let Some(post) = queue.lock().unwrap().pop() else {
                    return;
                };
                if hangs {
                    let at = how(&mut r);
                    let seen = post_and_hang_up(addr, &post, at).await;
                    let mut s = sent.lock().unwrap();
                    s.posts += 1;
                    if seen == Seen::NotSent {
                        continue;
                    }
                    s.hung_up += 1;
                    if at.sent_whole_request() {
                        s.whole.insert(post.key.clone());
                    }
                    if matches!(seen.status(), Some(200 | 202)) {
                        s.acked.insert(post.key.clone());
                    }
                } else {
                    let mut status = None;
                    for _ in 0..50 {
                        status = post_and_read(addr, &post, Duration::from_secs(20)).await;
                        if status != Some(503) && status.is_some() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    let mut s = sent.lock().unwrap();
                    s.posts += 1;
                    s.whole.insert(post.key.clone());
                    match status {
                        Some(200 | 202) => {
                            s.acked.insert(post.key.clone());
                        }
                        other => s.unexpected.push((post.key.clone(), other)),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    Arc::try_unwrap(sent).unwrap().into_inner().unwrap()
}

/// `n` payment posts under keys `{prefix}{i}`, plus `duplicates` repeats of some of them (same
/// body), shuffled with `seed`.
pub fn payments(prefix: &str, n: usize, duplicates: usize, seed: u64) -> Vec<Post> {
    let mut r = fastrand::Rng::with_seed(seed);
    let body = |i: usize| format!("{{\"order\":\"{prefix}{i}\",\"amount\":{}}}", 100 + i);
    let mut posts: Vec<Post> = (0..n)
        .map(|i| Post::new("payments", &format!("{prefix}{i}"), body(i)))
        .collect();
    for _ in 0..duplicates {
        let i = r.usize(0..n);
        posts.push(Post::new("payments", &format!("{prefix}{i}"), body(i)));
    }
    r.shuffle(&mut posts);
    posts
}
