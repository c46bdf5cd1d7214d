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
//!   silent, or still sending its head) is closed to make room. When every connection is in a
//!   request, the next ones (up to [`PROBE_CONNECTIONS`]) are served only `/healthz`, `/readyz`
//!   and `/metrics` (anything else: `503` + `Retry-After`, connection closed), so that a load
//!   balancer and a scraper still get answers; past those, new connections wait until one
//!   closes (later ones in the kernel's listen backlog). Requests waiting for an outcome
//!   (`Prefer: wait`) are capped apart, below `max_connections` (see
//!   [`crate::engine::waiters`]).
//!
//! `axum::serve` has none of these, so claimd serves the axum router with hyper's HTTP/1
//! connection builder itself.

use crate::edge::http::problem::problem;
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
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

#[path = "server/body_budget.rs"]
mod body_budget;
pub use body_budget::{BodyBudget, BodyRefused, BodyShare};

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
    let room = Room {
        permits: Arc::new(Semaphore::new(limits.max_connections.max(1))),
        probe_permits: Arc::new(Semaphore::new(PROBE_CONNECTIONS)),
        open: Arc::default(),
        max_connections: limits.max_connections,
    };
    // One line per period while at the cap, not one per connection: a flood would fill the log.
    let at_cap_log = crate::edge::http::guard::LogEvery::new(crate::edge::http::guard::LOG_EVERY);
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
        let slot = match room.permits.clone().try_acquire_owned() {
            Ok(p) => Slot {
                permit: p,
                probes_only: false,
            },
            Err(_) => {
                tokio::select! {
                    s = room.make(&at_cap_log) => match s {
                        Some(s) => s,
                        None => break,
                    },
                    () = &mut shutdown => break,
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let mut stop = stop_tx.subscribe();
        let open = room.open.clone();
        let permits = room.permits.clone();
        tokio::spawn(async move {
            let permit = Mutex::new(slot.permit);
            let conn = Arc::new(Phase::new(slot.probes_only));
            let _registered = open.register(conn.clone());
            let io = TokioIo::new(TimedIo::new(stream, conn.clone(), limits));
            let service = service_fn(move |mut req: Request<Incoming>| {
                conn.busy();
                req.extensions_mut().insert(Peer(peer));
                let router = router.clone();
                let conn = conn.clone();
                let served = is_probe(req.uri().path()) || conn.serves_all(&permit, &permits);
                async move {
                    let response = if !served {
                        connections_busy(limits.max_connections)
                    } else {
                        handle(router, limits, req).await
                    };
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
    let _ = tokio::time::timeout(SHUTDOWN_WAIT, async {
        let _ = room.permits.acquire_many(all).await;
        let _ = room
            .probe_permits
            .acquire_many(PROBE_CONNECTIONS as u32)
            .await;
    })
    .await;
}

/// How often, at the cap with every connection in a request, the open connections are looked
/// at again for one that has gone back to waiting.
const CAP_RESCAN: Duration = Duration::from_millis(50);

/// The listener's connection places: `max_connections` for any request, and
/// [`PROBE_CONNECTIONS`] more that serve only the probes, taken when every other connection is
/// in a request. Both kinds of connection are in `open`, told apart by their phase.
struct Room {
    permits: Arc<Semaphore>,
    probe_permits: Arc<Semaphore>,
    open: Arc<OpenConns>,
    max_connections: usize,
}

/// A connection's place.
struct Slot {
    permit: OwnedSemaphorePermit,
    /// A place of the probes' reserve: any other request is answered `503`.
    probes_only: bool,
}

impl Room {
    /// At the connection cap: closes the open connection that has waited longest for a
    /// request and returns the place it frees (or any other that frees first). When every
    /// connection is in a request, a place of the probes' reserve (closing the reserve
    /// connection that has waited longest when they are all taken); while those are all in a
    /// request too, waits. `None` when the listener is closed.
    async fn make(&self, log: &crate::edge::http::guard::LogEvery) -> Option<Slot> {
        let mut logged = false;
        // A first rescan before a reserve place: in a burst, places free within milliseconds.
        let mut first = true;
        loop {
            let shed = self.open.shed_longest_waiting(false);
            let reserve = !shed && !std::mem::take(&mut first);
            if reserve && self.probe_permits.available_permits() == 0 {
                self.open.shed_longest_waiting(true);
            }
            if !logged && let Some(unlogged) = log.due() {
                let max_connections = self.max_connections;
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
                        "connection cap reached and every connection is in a request; new connections serve only /healthz, /readyz and /metrics, or wait"
                    );
                }
            }
            logged = true;
            tokio::select! {
                biased;
                p = self.permits.clone().acquire_owned() => {
                    return p.ok().map(|permit| Slot { permit, probes_only: false });
                }
                p = self.probe_permits.clone().acquire_owned(), if reserve => {
                    return p.ok().map(|permit| Slot { permit, probes_only: true });
                }
                () = tokio::time::sleep(CAP_RESCAN) => {}
            }
        }
    }
}

/// Connections kept beyond `max_connections` for the probes (`/healthz`, `/readyz`,
/// `/metrics`), so that a load balancer and a scraper are answered while every connection is
/// in a request (slow bodies, long waits). Any other request on one is answered `503`.
pub const PROBE_CONNECTIONS: usize = 8;

/// Whether `path` is one a probe connection serves.
pub fn is_probe(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics")
}

/// `503` + `Retry-After: 1` for a request other than a probe on a probes' connection; the
/// connection is closed after it.
fn connections_busy(max_connections: usize) -> Response {
    let mut r = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "busy",
        &format!(
            "every one of the {max_connections} connections ([http] max_connections) is in a request; this connection serves only /healthz, /readyz and /metrics: nothing was recorded, retry"
        ),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
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
    fn shed_longest_waiting(&self, probes_only: bool) -> bool {
        let conns = self.lock();
        let mut waiting: Vec<(Instant, &Arc<Phase>)> = conns
            .values()
            .filter(|p| p.lock().probes_only == probes_only)
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
    /// On a place of the probes' reserve: serves only the probes (see [`PROBE_CONNECTIONS`]).
    probes_only: bool,
}

#[derive(Debug)]
struct Phase(Mutex<PhaseInner>);

impl Phase {
    fn new(probes_only: bool) -> Self {
        Phase(Mutex::new(PhaseInner {
            state: State::Head(Instant::now()),
            shed: false,
            waker: None,
            probes_only,
        }))
    }
    /// Whether the connection serves any request: a probes' connection does once a place of
    /// `permits` is free (it takes it into `permit` and gives its reserve place back).
    fn serves_all(&self, permit: &Mutex<OwnedSemaphorePermit>, permits: &Arc<Semaphore>) -> bool {
        let mut p = self.lock();
        if p.probes_only
            && let Ok(place) = permits.clone().try_acquire_owned()
        {
            *permit.lock().unwrap_or_else(|e| e.into_inner()) = place;
            p.probes_only = false;
        }
        !p.probes_only
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
