//! The connection a request came on ([`Peer`]), so that a stream can end as soon as its client
//! closes the connection, not at its next write.
//!
//! hyper notices a closed connection while it streams a response only if it is reading the
//! socket: with bytes of the client's buffered and unread (a second request pipelined behind
//! a `GET .../watch`), it does not read, and learns of the close only when a write fails, at
//! the next keep-alive comment, up to `keepAliveSeconds` (300 s) later; the stream's etcd
//! watch lived that long (issue #54, F9). [`Peer::closed`] watches a duplicate of the socket
//! for the peer's end of it (`EPOLLRDHUP`), whatever hyper reads, without reading it.

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use std::future::{Future, pending};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use tokio::io::Interest;
use tokio::net::TcpListener;

/// The socket of the connection a request came on (axum's connect info).
#[derive(Debug, Clone, Copy)]
pub struct Peer(RawFd);

impl Connected<IncomingStream<'_, TcpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        Peer(stream.io().as_raw_fd())
    }
}

impl Peer {
    /// Completes when the client has closed its side of the connection (or the socket fails);
    /// never if its socket cannot be watched. Call it while the connection serves the request
    /// (a handler), when the descriptor is surely still this connection's.
    pub fn closed(self) -> impl Future<Output = ()> + Send + 'static {
        // SAFETY: while its request is being served the connection is open, so the descriptor
        // is its socket's; the duplicate is ours, and closed when the future is dropped.
        let dup = unsafe { BorrowedFd::borrow_raw(self.0) }.try_clone_to_owned();
        async move {
            let socket = dup.and_then(|fd| {
                let socket = std::net::TcpStream::from(fd);
                socket.set_nonblocking(true)?;
                tokio::net::TcpStream::from_std(socket)
            });
            let Ok(socket) = socket else {
                return pending().await;
            };
            loop {
                match socket.ready(Interest::READABLE).await {
                    Ok(ready) if ready.is_read_closed() => return,
                    // Bytes to read, which are hyper's: forget the readiness without reading
                    // and wait for the next change.
                    Ok(_) => {
                        let _ = socket.try_io(Interest::READABLE, || {
                            Err::<(), _>(io::ErrorKind::WouldBlock.into())
                        });
                    }
                    Err(_) => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn the_close_is_seen_behind_unread_bytes_and_not_before() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\n\r\nGET /again HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let closed = Peer(server.as_raw_fd()).closed();
        tokio::pin!(closed);
        let early = tokio::time::timeout(Duration::from_millis(200), &mut closed).await;
        assert!(early.is_err(), "bytes unread are no close");
        drop(client);
        tokio::time::timeout(Duration::from_secs(2), &mut closed)
            .await
            .expect("the close seen");
        drop(server);
    }
}
