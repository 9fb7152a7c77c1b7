//! A TCP proxy in front of the API server that makes watches lag: bytes the server sends on a
//! connection whose client has been silent for a while (a watch, once its request is sent) reach
//! the client `lag` late, in order; answers to requests (sent right after the request) pass at
//! once. So an operator behind it sees pod events late while its reads are fresh: the stale
//! cache of a slow watch, on demand. The API server speaks HTTP/1.1 to kube-rs (one request at
//! a time per connection), so a connection's silence is a fair sign of a watch.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long a client must have been silent for what the server sends to be delayed.
const QUIET: Duration = Duration::from_millis(500);

/// A running lagging proxy (its thread lives as long as the test binary).
pub struct LagProxy {
    /// A kubeconfig like the control plane's, pointing at the proxy.
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl LagProxy {
    /// Starts a proxy to the API server of `kubeconfig` that delays watch data by `lag`.
    pub fn start(kubeconfig: &Path, lag: Duration) -> Self {
        let config = std::fs::read_to_string(kubeconfig).unwrap();
        let server = config
            .lines()
            .find_map(|l| l.trim().strip_prefix("server: https://"))
            .expect("a server in the kubeconfig")
            .to_string();
        let upstream: SocketAddr = server.parse().expect("server is IP:port");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move { accept(TcpListener::from_std(listener).unwrap(), upstream, lag).await });
        });
        let dir = tempfile::Builder::new().prefix("podlock-lag-").tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, config.replace(&server, &addr.to_string())).unwrap();
        LagProxy {
            kubeconfig: path,
            _dir: dir,
        }
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, lag: Duration) {
    while let Ok((client, _)) = listener.accept().await {
        tokio::spawn(async move {
            if let Ok(server) = TcpStream::connect(upstream).await {
                relay(client, server, lag).await;
            }
        });
    }
}

/// Copies both ways; server bytes that arrive while the client has been quiet are held `lag`.
async fn relay(client: TcpStream, server: TcpStream, lag: Duration) {
    let start = Instant::now();
    let last_sent = Arc::new(AtomicU64::new(0)); // ms since `start` of the client's last bytes
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let sent = last_sent.clone();
    let up = async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = cr.read(&mut buf).await {
            sent.store(start.elapsed().as_millis() as u64, Ordering::SeqCst);
            if sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = sw.shutdown().await;
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read_down = async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = sr.read(&mut buf).await {
            let quiet = start.elapsed().as_millis() as u64 - last_sent.load(Ordering::SeqCst);
            let delay = if quiet > QUIET.as_millis() as u64 {
                lag
            } else {
                Duration::ZERO
            };
            if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let write_down = async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at.into()).await;
            if cw.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = cw.shutdown().await;
    };
    tokio::join!(up, read_down, write_down);
}
