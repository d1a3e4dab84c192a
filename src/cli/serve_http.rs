//! The connections of `dynrt serve`: an accept loop over hyper's HTTP/1 connections with the
//! axum router as their service, bounded in number and in time, and the signals that drain
//! them.
//!
//! * At most `max_connections` at once: one more is answered 503 in OpenAI's shape and
//!   closed at once, so that half-open connections cannot exhaust the process's file
//!   descriptors (the health check of a server under such a flood answers again as soon as
//!   the others time out).
//! * A request head must arrive within `header_timeout` of the connection waiting for it;
//!   this is also how long an idle keep-alive connection stays open (hyper starts the same
//!   timer between requests). A slowloris client is cut after it.
//! * An answer that cannot be written for `write_timeout` (a client that stopped reading a
//!   stream) closes its connection, and the request ends as for a client that went away.
//! * While draining, connections close once their answer is written, and new ones are no
//!   longer accepted.

use super::serve_api::ApiError;
use axum::extract::ConnectInfo;
use axum::http::StatusCode;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

/// The limits of the connections.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once at most.
    pub max_connections: usize,
    /// Time for a request head to arrive (and for an idle connection to stay open).
    pub header_timeout: Duration,
    /// Time an answer may wait for the client to take its bytes.
    pub write_timeout: Duration,
}

/// The most bytes hyper buffers for one request head; the guard answers heads larger than
/// its own limits (below this) with 414 or 431 in OpenAI's shape.
const MAX_HEAD_BUFFER_BYTES: usize = 96 << 10;

/// Header fields hyper parses at most (the guard refuses more than its own, fewer, limit).
const MAX_PARSED_HEADERS: usize = 200;

/// Serves `router` on `listener` until `draining` turns true, then lets the connections
/// finish their answers and close; returns when none is left or `closed` turns true.
/// `open` counts the connections open now.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    mut draining: watch::Receiver<bool>,
    open: Arc<Semaphore>,
) {
    let total = limits.max_connections.max(1);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = draining.wait_for(|d| *d) => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors, or the peer gave up before the accept: wait a
                // moment rather than spin, and go on.
                log::warn!("accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            refuse(stream, total);
            continue;
        };
        let router = router.clone();
        let draining = draining.clone();
        tokio::spawn(async move {
            connection(stream, peer, router, limits, draining).await;
            drop(permit);
        });
    }
    drop(listener);
}

/// Answers a connection over the limit with a 503 and closes it, here and now: no task
/// and no descriptor outlives the call, however many such connections come.
fn refuse(stream: TcpStream, max: usize) {
    let body = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        format!("the server holds {max} connections already, its limit: try again later"),
        Some("too_many_connections"),
    )
    .body()
    .to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let Ok(mut stream) = stream.into_std() else {
        return;
    };
    // A fresh socket's buffer takes these few hundred bytes at once (the socket is
    // non-blocking: were it full, the answer would be dropped, never waited for). What the
    // client sent already is read first, so that the close is a FIN rather than a reset.
    let _ = std::io::Read::read(&mut stream, &mut [0u8; 4096]);
    let _ = std::io::Write::write(&mut stream, answer.as_bytes());
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    limits: Limits,
    mut draining: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let io = TokioIo::new(StallGuard::new(stream, limits.write_timeout));
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        let mut router = router.clone();
        tower_service::Service::call(&mut router, request)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD_BUFFER_BYTES)
        .max_headers(MAX_PARSED_HEADERS)
        .keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    if !*draining.borrow() {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    log::debug!("connection from {peer}: {e}");
                }
                return;
            }
            _ = draining.wait_for(|d| *d) => {}
        }
    }
    // Draining: the answer under way is finished, then the connection closes.
    conn.as_mut().graceful_shutdown();
    if let Err(e) = conn.await {
        log::debug!("connection from {peer} while draining: {e}");
    }
}

/// A socket whose writes fail with `TimedOut` once one has waited `limit` for the client.
struct StallGuard {
    stream: TcpStream,
    limit: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl StallGuard {
    fn new(stream: TcpStream, limit: Duration) -> StallGuard {
        StallGuard {
            stream,
            limit,
            stalled: None,
        }
    }

    /// `ready` as it came, after arming (pending) or clearing (done) the stall timer.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        ready: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if ready.is_ready() {
            self.stalled = None;
            return ready;
        }
        let limit = self.limit;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if timer.as_mut().poll(cx).is_ready() {
            self.stalled = None;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client took no bytes of the answer for the write timeout",
            )));
        }
        Poll::Pending
    }
}

impl AsyncRead for StallGuard {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for StallGuard {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.watch(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.watch(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.stream).poll_flush(cx);
        self.watch(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.stream).poll_shutdown(cx);
        self.watch(cx, r)
    }
}

/// SIGTERM and SIGINT as a stream of signal numbers (Unix): a handler writes each to a
/// pipe, a thread reads the pipe and sends them on (the handler itself may only write).
#[cfg(unix)]
pub mod signals {
    use std::sync::atomic::{AtomicI32, Ordering};

    /// The pipe's write end, for the handler (-1 before `install`).
    static PIPE: AtomicI32 = AtomicI32::new(-1);

    extern "C" fn on_signal(signal: libc::c_int) {
        let fd = PIPE.load(Ordering::Relaxed);
        if fd >= 0 {
            let byte = signal as u8;
            // SAFETY: write(2) is async-signal-safe; the buffer is one live byte.
            unsafe {
                libc::write(fd, (&byte as *const u8).cast(), 1);
            }
        }
    }

    /// Installs the handlers; each SIGTERM or SIGINT then arrives on the channel returned.
    ///
    /// # Errors
    /// The operating system's, when the pipe, the handlers or the thread cannot be made.
    pub fn install() -> std::io::Result<tokio::sync::mpsc::Receiver<i32>> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2(2) writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        PIPE.store(fds[1], Ordering::Relaxed);
        for signal in [libc::SIGTERM, libc::SIGINT] {
            // SAFETY: a zeroed sigaction is valid; the handler only calls write(2).
            let ok = unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(signal, &action, std::ptr::null_mut())
            };
            if ok != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        // The server acts on two signals at most (drain, then exit).
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let read_fd = fds[0];
        std::thread::Builder::new()
            .name("dynrt-signals".into())
            .spawn(move || loop {
                let mut byte = 0u8;
                // SAFETY: reads one byte into a live local.
                let n = unsafe { libc::read(read_fd, (&mut byte as *mut u8).cast(), 1) };
                if n == 1 {
                    if tx.blocking_send(i32::from(byte)).is_err() {
                        return;
                    }
                } else if n == 0
                    || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
                {
                    return;
                }
            })?;
        Ok(rx)
    }
}
