//! The HTTP listener of `claimd run`: an accept loop with a cap on open connections, and per
//! connection the timeouts a payments API needs against slow or idle clients (HTTP/1.1).
//!
//! - **Request head**: a client has `header_read_timeout` from its first byte (or from the
//!   connection opening) to send the complete request line and headers.
//! - **Body**: `body_read_timeout` from when claimd starts reading a body to its last byte;
//!   past it the request is answered `408` and the connection closed.
//! - **Idle keep-alive**: a connection with no request for `idle_timeout` is closed.
//! - **Declared length**: a `Content-Length` over `max_body_bytes` is answered `413` at once,
//!   before any of the body is read (and instead of `100 Continue`).
//! - **Request head size**: a head (request line and headers) over [`HEAD_LIMIT`] is answered
//!   `431` and the connection closed.
//! - **Connections**: at most `max_connections` open at once. At the cap, the next connection is
//!   accepted and the open connection that has waited longest for a request (idle keep-alive,
//!   silent, or still sending its head) is closed to make room; when every connection is in a
//!   request, the next one waits until one closes (later ones in the kernel's listen backlog).
//!
//! `axum::serve` has none of these, so claimd serves the axum router with hyper's HTTP/1
//! connection builder itself.

use crate::http::problem::problem;
use axum::Router;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

/// The limits the listener enforces (from `[http]`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time to send a complete request head.
    pub header_read_timeout: Duration,
    /// Time to send a whole body, from when claimd starts reading it.
    pub body_read_timeout: Duration,
    /// Time a keep-alive connection may sit without a request.
    pub idle_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
    /// Largest body; a larger declared `Content-Length` is refused before reading.
    pub max_body_bytes: usize,
}

impl Limits {
    /// The limits configured in `[http]`.
    pub fn from_config(http: &crate::config::HttpConfig) -> Self {
        Limits {
            header_read_timeout: http.header_read_timeout.0,
            body_read_timeout: http.body_read_timeout.0,
            idle_timeout: http.idle_timeout.0,
            max_connections: http.max_connections,
            max_body_bytes: http.max_body_bytes,
        }
    }
}

/// Largest read buffer hyper keeps for one connection. hyper reads into whatever capacity
/// its buffer has, so while a body streams through, the buffer may hold up to about twice this.
pub const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Largest request head (request line and headers); larger is answered `431`. Without its own
/// limit hyper allowed whatever fit in its buffer (about 111 KiB).
pub const HEAD_LIMIT: usize = 64 * 1024;

/// The client address of a request, put in its extensions by [`serve`] (the TCP peer: behind
/// a load balancer, the balancer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub std::net::SocketAddr);

/// How long, after shutdown begins, open connections get to finish their request.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// Serves `router` on `listener` until `shutdown` resolves, then lets open requests finish
/// (up to a few seconds) and returns.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let open = Arc::new(OpenConns::default());
    // One line per period while at the cap, not one per connection: a flood would fill the log.
    let at_cap_log = crate::http::guard::LogEvery::new(crate::http::guard::LOG_EVERY);
    let (stop_tx, _) = watch::channel(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(error) => {
                    // Usually transient (a reset before accept, out of descriptors): back off.
                    tracing::debug!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let room = make_room(&permits, &open, limits.max_connections, &at_cap_log);
                tokio::select! {
                    p = room => match p {
                        Some(p) => p,
                        None => break,
                    },
                    () = &mut shutdown => break,
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let mut stop = stop_tx.subscribe();
        let open = open.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let conn = Arc::new(Phase::new());
            let _registered = open.register(conn.clone());
            let io = TokioIo::new(TimedIo::new(stream, conn.clone(), limits));
            let service = service_fn(move |mut req: Request<Incoming>| {
                conn.busy();
                req.extensions_mut().insert(Peer(peer));
                let router = router.clone();
                let conn = conn.clone();
                async move {
                    let response = handle(router, limits, req).await;
                    // Idle once hyper has sent the whole answer (it drops the body then): a
                    // connection still writing is in a request, and never shed.
                    Ok::<_, std::convert::Infallible>(response.map(|body| IdleAfter { body, conn }))
                }
            });
            let mut builder = http1::Builder::new();
            // Head and idle deadlines are TimedIo's: hyper's own header timer counts idle
            // keep-alive time as header time. It is kept as a backstop that never fires first,
            // because with it set hyper polls the socket as soon as a connection goes idle,
            // which is what starts TimedIo's idle deadline (and lets a shed idle connection
            // see its end at once).
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.idle_timeout + limits.header_read_timeout)
                // hyper's read buffer grows to ~400 KiB per connection while a body streams
                // through it unless capped; 64 KiB (which hyper may overshoot to about twice
                // that, see READ_BUFFER_BYTES) keeps a thousand open connections within
                // 64-128 MiB.
                .max_buf_size(READ_BUFFER_BYTES)
                .max_header_size(HEAD_LIMIT)
                .keep_alive(true);
            let connection = builder.serve_connection(io, service);
            let mut connection = std::pin::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = async { let _ = stop.wait_for(|s| *s).await; } => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = result {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    let _ = stop_tx.send(true);
    let all = u32::try_from(limits.max_connections.max(1)).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(SHUTDOWN_WAIT, permits.acquire_many(all)).await;
}

/// How often, at the cap with every connection in a request, the open connections are looked
/// at again for one that has gone back to waiting.
const CAP_RESCAN: Duration = Duration::from_millis(50);

/// At the connection cap: closes the open connection that has waited longest for a request,
/// and returns the permit it frees (or any other that frees first). While every connection is
/// in a request, waits. `None` when the semaphore is closed.
async fn make_room(
    permits: &Arc<Semaphore>,
    open: &OpenConns,
    max_connections: usize,
    log: &crate::http::guard::LogEvery,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    let mut logged = false;
    loop {
        let shed = open.shed_longest_waiting();
        if !logged && let Some(unlogged) = log.due() {
            if shed {
                tracing::info!(
                    max_connections,
                    unlogged,
                    "connection cap reached; closing the connection that waited longest for a request"
                );
            } else {
                tracing::warn!(
                    max_connections,
                    unlogged,
                    "connection cap reached and every connection is in a request; new connections wait"
                );
            }
        }
        logged = true;
        tokio::select! {
            p = permits.clone().acquire_owned() => return p.ok(),
            () = tokio::time::sleep(CAP_RESCAN) => {}
        }
    }
}

/// The open connections, for shedding at the cap.
#[derive(Default)]
struct OpenConns {
    next: std::sync::atomic::AtomicU64,
    conns: Mutex<std::collections::HashMap<u64, Arc<Phase>>>,
}

/// Removes a connection from [`OpenConns`] when its task ends.
struct Registered<'a> {
    open: &'a OpenConns,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.open.lock().remove(&self.id);
    }
}

impl OpenConns {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Arc<Phase>>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn register(&self, phase: Arc<Phase>) -> Registered<'_> {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.lock().insert(id, phase);
        Registered { open: self, id }
    }

    /// Closes the connection that has waited longest for its next request (idle keep-alive,
    /// silent since it opened, or still sending its head); `false` when every one is in a
    /// request. A connection in a request is never closed: its body or answer is under way.
    fn shed_longest_waiting(&self) -> bool {
        let conns = self.lock();
        let mut waiting: Vec<(Instant, &Arc<Phase>)> = conns
            .values()
            .filter_map(|p| p.waiting_since().map(|t| (t, p)))
            .collect();
        waiting.sort_by_key(|(t, _)| *t);
        // The oldest that is still waiting when asked (it may have just begun a request).
        waiting.into_iter().any(|(_, p)| p.shed())
    }
}

/// One request: the declared-length check, then the router with a body that times out.
async fn handle(router: Router, limits: Limits, req: Request<Incoming>) -> Response {
    if let Some(len) = declared_length(req.headers())
        && len > limits.max_body_bytes as u64
    {
        // Answered before the body is touched: hyper sends no `100 Continue`, reads nothing,
        // and closes the connection after this answer.
        let mut r = problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body too large",
            &format!(
                "Content-Length {len} is over the limit of {} bytes ([http] max_body_bytes)",
                limits.max_body_bytes
            ),
        );
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return r;
    }
    let req = req.map(|b| axum::body::Body::new(TimedBody::new(b, limits.body_read_timeout)));
    match router.oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

/// The byte budget for request bodies held in memory at once (`[http] body_budget_bytes`).
///
/// A body takes budget for the memory it really holds, not for what it declares: before it is
/// read, a first slice (its declared length when that is smaller; see [`BodyBudget::slice`]),
/// then more as its bytes arrive and its buffer grows (doubling, up to the declared length or
/// `max_body_bytes`), trimmed to the real size once read. So a client that declares 1 MiB and
/// trickles holds only what it sent. The share is kept until the claim's call starts (see
/// [`crate::claimer::Claimer::submit_held`]): a body waiting to be read, claimed or called
/// counts here; one in a call is bounded by the consumer's `concurrency` instead. When the
/// budget is spent, intake waits up to `intake_wait` for a first slice and then answers `503` +
/// `Retry-After` without reading the body (likewise, mid-body, for more room): the backlog
/// waits in the clients, never in claimd's memory.
#[derive(Debug)]
pub struct BodyBudget {
    kib: Arc<Semaphore>,
    total_kib: usize,
    slice_kib: usize,
}

/// A share of the [`BodyBudget`], given back on drop.
#[derive(Debug)]
pub struct BodyShare {
    held: tokio::sync::OwnedSemaphorePermit,
    kib: Arc<Semaphore>,
    total_kib: usize,
}

impl BodyShare {
    /// Gives back what the share holds beyond `bytes` (a body of unknown length was shorter
    /// than `max_body_bytes`).
    pub fn trim_to(&mut self, bytes: usize) {
        let keep = bytes.div_ceil(1024).max(1);
        if let Some(extra) = self.held.num_permits().checked_sub(keep).filter(|n| *n > 0) {
            drop(self.held.split(extra));
        }
    }

    /// Bytes this share holds.
    pub fn bytes(&self) -> usize {
        self.held.num_permits() * 1024
    }

    /// Grows the share to `bytes`, waiting up to `wait` for the room; `false` when the budget
    /// stayed spent (the share keeps what it had).
    pub async fn grow_to(&mut self, bytes: usize, wait: Duration) -> bool {
        let want = bytes.div_ceil(1024).min(self.total_kib);
        let Some(more) = want.checked_sub(self.held.num_permits()).filter(|n| *n > 0) else {
            return true;
        };
        let Ok(more) = u32::try_from(more) else {
            return false;
        };
        let got = match self.kib.clone().try_acquire_many_owned(more) {
            Ok(p) => Some(p),
            Err(_) => tokio::time::timeout(wait, self.kib.clone().acquire_many_owned(more))
                .await
                .ok()
                .and_then(Result::ok),
        };
        match got {
            Some(p) => {
                self.held.merge(p);
                true
            }
            None => false,
        }
    }
}

impl BodyBudget {
    /// A budget of `bytes` (counted in KiB, rounded up) shared by at most `max_connections`
    /// requests at once.
    pub fn new(bytes: usize, max_connections: usize) -> Self {
        let total_kib = bytes.div_ceil(1024).max(1);
        // Every open connection can hold its first slice at once without spending the budget
        // (16 KiB with the defaults), so connections alone, however slow, cannot exhaust it.
        let slice_kib = (total_kib / max_connections.max(1)).clamp(4, 64);
        BodyBudget {
            kib: Arc::new(Semaphore::new(total_kib)),
            total_kib,
            slice_kib,
        }
    }

    /// The first slice a body of unknown or larger length takes before it is read.
    pub fn slice(&self) -> usize {
        self.slice_kib * 1024
    }

    /// A share for the first `bytes` of a body, waiting up to `wait` for one; `None` when the
    /// budget stayed spent.
    pub async fn admit(&self, bytes: usize, wait: Duration) -> Option<BodyShare> {
        let kib = u32::try_from(bytes.div_ceil(1024).clamp(1, self.total_kib)).ok()?;
        let held = match self.kib.clone().try_acquire_many_owned(kib) {
            Ok(p) => p,
            Err(_) => tokio::time::timeout(wait, self.kib.clone().acquire_many_owned(kib))
                .await
                .ok()?
                .ok()?,
        };
        Some(BodyShare {
            held,
            kib: self.kib.clone(),
            total_kib: self.total_kib,
        })
    }

    /// Bytes of the budget now taken by bodies being read, claimed or waiting for a call.
    pub fn in_use_bytes(&self) -> usize {
        (self.total_kib - self.kib.available_permits()) * 1024
    }
}

/// The `Content-Length` a request declares, when it declares one it can parse.
pub fn declared_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// The body did not arrive within `body_read_timeout`.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the request body did not arrive within {0:?} ([http] body_read_timeout)")]
pub struct BodyReadTimeout(pub Duration);

impl BodyReadTimeout {
    /// Whether `e` (or what caused it) is a body read timeout.
    pub fn is_cause_of(e: &(dyn std::error::Error + 'static)) -> bool {
        let mut cur = Some(e);
        while let Some(err) = cur {
            if err.is::<BodyReadTimeout>() {
                return true;
            }
            cur = err.source();
        }
        false
    }
}

/// A request body with a deadline that starts when it is first read.
struct TimedBody {
    inner: Incoming,
    timeout: Duration,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl TimedBody {
    fn new(inner: Incoming, timeout: Duration) -> Self {
        TimedBody {
            inner,
            timeout,
            deadline: None,
        }
    }
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let timeout = self.timeout;
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending => {
                let sleep = this
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                ready!(sleep.as_mut().poll(cx));
                Poll::Ready(Some(Err(Box::new(BodyReadTimeout(timeout)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that marks its connection idle when hyper is done with it.
struct IdleAfter {
    body: axum::body::Body,
    conn: Arc<Phase>,
}

impl Drop for IdleAfter {
    fn drop(&mut self) {
        self.conn.idle();
    }
}

impl HttpBody for IdleAfter {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Where a connection is between requests, for its read deadline.
#[derive(Debug, Clone, Copy)]
enum State {
    /// Waiting for (the rest of) a request head since this instant.
    Head(Instant),
    /// A request is being handled (the body has its own deadline).
    Busy,
    /// Between requests since this instant.
    Idle(Instant),
}

#[derive(Debug)]
struct PhaseInner {
    state: State,
    /// Closed to make room at the connection cap: its next read ends the connection.
    shed: bool,
    /// Who waits on the socket, woken when the connection is shed.
    waker: Option<std::task::Waker>,
}

#[derive(Debug)]
struct Phase(Mutex<PhaseInner>);

impl Phase {
    fn new() -> Self {
        Phase(Mutex::new(PhaseInner {
            state: State::Head(Instant::now()),
            shed: false,
            waker: None,
        }))
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, PhaseInner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn busy(&self) {
        let mut p = self.lock();
        p.state = State::Busy;
        // A request began before the shed took effect: it is served, and the connection stays.
        p.shed = false;
    }
    fn idle(&self) {
        self.lock().state = State::Idle(Instant::now());
    }
    /// Bytes arrived: an idle connection starts a new request head.
    fn bytes(&self) {
        let mut p = self.lock();
        if matches!(p.state, State::Idle(_)) {
            p.state = State::Head(Instant::now());
        }
    }
    /// Since when the connection has waited for a request; `None` in a request or once shed.
    fn waiting_since(&self) -> Option<Instant> {
        let p = self.lock();
        match p.state {
            State::Head(t) | State::Idle(t) if !p.shed => Some(t),
            _ => None,
        }
    }
    /// Marks the connection to be closed at its next read, unless it is in a request.
    fn shed(&self) -> bool {
        let mut p = self.lock();
        if matches!(p.state, State::Busy) || p.shed {
            return false;
        }
        p.shed = true;
        if let Some(w) = p.waker.take() {
            w.wake();
        }
        true
    }
    fn is_shed(&self) -> bool {
        let p = self.lock();
        p.shed && !matches!(p.state, State::Busy)
    }
    /// The read deadline, remembering `waker` so a shed can end the wait.
    fn read_deadline(
        &self,
        limits: &Limits,
        waker: &std::task::Waker,
    ) -> Option<(Instant, &'static str)> {
        let mut p = self.lock();
        if !p.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
            p.waker = Some(waker.clone());
        }
        match p.state {
            State::Head(t) => Some((t + limits.header_read_timeout, "request head")),
            State::Idle(t) => Some((t + limits.idle_timeout, "idle keep-alive")),
            State::Busy => None,
        }
    }
}

/// A TCP stream whose reads fail with `TimedOut` past the connection's read deadline.
struct TimedIo {
    stream: TcpStream,
    phase: Arc<Phase>,
    limits: Limits,
    sleep: Pin<Box<Sleep>>,
}

impl TimedIo {
    fn new(stream: TcpStream, phase: Arc<Phase>, limits: Limits) -> Self {
        TimedIo {
            stream,
            phase,
            limits,
            sleep: Box::pin(tokio::time::sleep(Duration::from_secs(3600))),
        }
    }
}

impl AsyncRead for TimedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.phase.is_shed() {
            // End of stream: hyper closes a connection that waits between requests quietly.
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.phase.bytes();
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                let Some((deadline, what)) = this.phase.read_deadline(&this.limits, cx.waker())
                else {
                    return Poll::Pending;
                };
                if this.sleep.deadline() != deadline {
                    this.sleep.as_mut().reset(deadline);
                }
                ready!(this.sleep.as_mut().poll(cx));
                Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("{what} timed out"),
                )))
            }
        }
    }
}

impl AsyncWrite for TimedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
