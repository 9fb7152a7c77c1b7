//! The connection to one etcd member, with the gRPC request's frames written together.
//!
//! hyper's HTTP/2 client writes a new request as separate socket writes: the connection task
//! flushes the HEADERS frame before the task that sends the body has queued the DATA frame (a
//! new stream gets its send window only once the connection task opens it), and the empty
//! end-of-stream frame and the PING acknowledgement etcd's flow-control estimator asks for
//! often go out on their own too. Each write is a loopback send that wakes etcd's reader once
//! more. Go's gRPC client queues frames and flushes only when it has nothing left to queue;
//! [`Coalescing`] does the same at the socket: a flush with bytes pending first lets every other
//! ready task run once (it wakes itself and yields), then writes everything queued by then in
//! one `writev`.

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::rt::TokioIo;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tonic::transport::{Channel, Endpoint, Uri};

/// Bytes held before a write goes to the socket without waiting for the flush.
const HOLD_AT_MOST: usize = 64 * 1024;

/// A lazily connected channel to the single member at `endpoint`, its writes coalesced.
pub fn channel(endpoint: &Endpoint) -> Channel {
    endpoint.connect_with_connector_lazy(tower::service_fn(|uri: Uri| async move {
        let host = uri.host().unwrap_or("localhost").trim_matches(['[', ']']);
        let default_port = if uri.scheme_str() == Some("https") {
            443
        } else {
            80
        };
        let stream = tokio::net::TcpStream::connect((host, uri.port_u16().unwrap_or(default_port))).await?;
        stream.set_nodelay(true)?;
        Ok::<_, io::Error>(Coalescing::new(TokioIo::new(stream)))
    }))
}

/// A writer that holds what is written until a flush, and on a flush lets the other ready tasks
/// run once before it writes, so frames queued by them go out in the same system call.
pub struct Coalescing<T> {
    inner: T,
    pending: Vec<u8>,
    /// How much of `pending` the socket has taken.
    written: usize,
    /// Whether this flush already yielded once.
    yielded: bool,
}

impl<T> Coalescing<T> {
    /// Wraps `inner`.
    pub fn new(inner: T) -> Self {
        Coalescing {
            inner,
            pending: Vec::new(),
            written: 0,
            yielded: false,
        }
    }
}

impl<T: Write + Unpin> Coalescing<T> {
    /// Writes out everything held.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: Write + Unpin> Write for Coalescing<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.pending.len() >= HOLD_AT_MOST {
            ready!(self.poll_drain(cx))?;
        }
        self.pending.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.pending.len() >= HOLD_AT_MOST {
            ready!(self.poll_drain(cx))?;
        }
        let mut n = 0;
        for buf in bufs {
            self.pending.extend_from_slice(buf);
            n += buf.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.pending.is_empty() {
            return Pin::new(&mut self.inner).poll_flush(cx);
        }
        if !self.yielded {
            // Let the tasks woken with this one (the body of the request just opened) queue
            // their frames first.
            self.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        ready!(self.poll_drain(cx))?;
        self.yielded = false;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<T: Read + Unpin> Read for Coalescing<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    /// A socket that records each write it is given.
    #[derive(Default)]
    struct Recorder(Vec<Vec<u8>>);

    impl Write for Recorder {
        fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            self.0.push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    async fn write(w: &mut Coalescing<Recorder>, bytes: &[u8]) {
        let n = poll_fn(|cx| Pin::new(&mut *w).poll_write(cx, bytes))
            .await
            .unwrap();
        assert_eq!(n, bytes.len());
    }

    #[tokio::test]
    async fn frames_written_before_a_flush_go_out_in_one_write_after_one_yield() {
        let mut w = Coalescing::new(Recorder::default());
        write(&mut w, b"HEADERS").await;
        write(&mut w, b"DATA").await;
        assert!(w.inner.0.is_empty(), "nothing is written before the flush");
        let mut polls = 0;
        poll_fn(|cx| {
            polls += 1;
            Pin::new(&mut w).poll_flush(cx)
        })
        .await
        .unwrap();
        assert_eq!(polls, 2, "the flush yields once");
        assert_eq!(w.inner.0, vec![b"HEADERSDATA".to_vec()]);
        write(&mut w, b"PING").await;
        poll_fn(|cx| Pin::new(&mut w).poll_flush(cx)).await.unwrap();
        assert_eq!(w.inner.0.len(), 2, "the next flush yields and writes again");
    }

    #[tokio::test]
    async fn a_large_body_goes_out_without_waiting_for_the_flush() {
        let mut w = Coalescing::new(Recorder::default());
        write(&mut w, &vec![1; HOLD_AT_MOST]).await;
        write(&mut w, b"more").await;
        assert_eq!(w.inner.0.len(), 1, "what was held went out");
        assert_eq!(w.pending, b"more");
    }
}
