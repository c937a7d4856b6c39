//! How long a connection may wait, between and within requests.
//!
//! The API server (Go's HTTP client) keeps an idle keep-alive connection
//! 90 s and does not retry a POST it has sent when the server closes the
//! connection under it: a server that closes idle connections sooner makes
//! some admissions fail (under `failurePolicy: Fail`, refused). So an idle
//! connection is kept [`IDLE_TIMEOUT`], longer than the client keeps it,
//! so that the client is the one to close it (controller-runtime's server
//! keeps it 90 s, as long as the client). A new connection is idle too:
//! Go's Transport puts a connection it dialled but did not use (another
//! came free first) in its pool of idle ones, and may send on it any time
//! in its 90 s. A request's head must still come whole within
//! [`HEAD_TIMEOUT`] of its first byte, or the connection is cut
//! (slowloris). hyper's own `header_read_timeout` cannot do this: it runs
//! while the connection is idle.
//!
//! The phase a connection is in is seen from two sides, so it is shared:
//! [`Timed`], its IO, sees the bytes of a head arrive; [`Phase`], held by
//! its service, sees the head read and the answer made. The body and the
//! handler are bounded by the call's timeout, in the server.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// How long a request's head may take from its first byte.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection is kept without a request, new or kept alive:
/// longer than Go's HTTP client keeps it (90 s), so that the client closes
/// it first.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A head is arriving; cut at `until`.
    Head { until: Instant },
    /// A request is being answered.
    Request,
    /// New or answered; no byte of the next request yet. Closed at `until`.
    Idle { until: Instant },
}

/// The phase of one connection, as its service sees it.
#[derive(Debug, Clone)]
pub(crate) struct Phase(Arc<Mutex<State>>);

impl Phase {
    /// A connection just set up: idle until its first request.
    pub(crate) fn new() -> Self {
        let until = Instant::now() + IDLE_TIMEOUT;
        Self(Arc::new(Mutex::new(State::Idle { until })))
    }

    /// A head was read: its request is being answered.
    pub(crate) fn answering(&self) {
        *self.0.lock() = State::Request;
    }

    /// The request is answered: the connection idles until the next.
    pub(crate) fn answered(&self) {
        let until = Instant::now() + IDLE_TIMEOUT;
        *self.0.lock() = State::Idle { until };
    }

    /// Bytes arrived: the first of a head, if the connection was idle.
    fn received(&self) {
        let mut state = self.0.lock();
        if let State::Idle { .. } = *state {
            let until = Instant::now() + HEAD_TIMEOUT;
            *state = State::Head { until };
        }
    }

    fn get(&self) -> State {
        *self.0.lock()
    }
}

/// A connection's IO, cut when its [`Phase`] has waited too long: an
/// error when a head is late, the end of the stream (a quiet close) when
/// it has idled [`IDLE_TIMEOUT`].
pub(crate) struct Timed<IO> {
    io: IO,
    phase: Phase,
    timer: Pin<Box<Sleep>>,
}

impl<IO> Timed<IO> {
    pub(crate) fn new(io: IO, phase: Phase) -> Self {
        // Set to the phase's deadline when first waited on.
        let timer = Box::pin(tokio::time::sleep(IDLE_TIMEOUT));
        Self { io, phase, timer }
    }

    /// Whether the phase's deadline has passed; wakes `cx` at it if not.
    fn expired(&mut self, until: Instant, cx: &mut Context<'_>) -> bool {
        if self.timer.deadline() != until {
            self.timer.as_mut().reset(until);
        }
        self.timer.as_mut().poll(cx).is_ready()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Timed<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                this.phase.received();
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match this.phase.get() {
                State::Head { until } if this.expired(until, cx) => {
                    Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no whole request head within {HEAD_TIMEOUT:?}"),
                    )))
                }
                State::Idle { until } if this.expired(until, cx) => Poll::Ready(Ok(())),
                _ => Poll::Pending,
            },
            other => other,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Timed<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
