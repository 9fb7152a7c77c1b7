//! TCP proxies in front of etcd members that, once armed, hold one request back: a member that
//! gets a request late, after its client gave up on it and sent it elsewhere, and never learns
//! that the client gave up (as when the cancel is lost with a failing connection).
//!
//! The proxy reads the client's HTTP/2 frames (etcd is plaintext here). Armed with a needle,
//! the first DATA frame containing it (a gRPC request's body) and the rest of its stream's
//! DATA frames reach the member `delay` late; the stream's RST_STREAM (the client's cancel) is
//! dropped. Every other frame passes at once: a HEADERS frame cannot be held, since the
//! header compression state is shared by a connection's streams, but a stream whose body is
//! missing simply waits for it.
//!
//! Made with [`HeldRequests::answers`], the armed request passes at once and is applied, but
//! every answer of its member comes `delay` late for the next `delay`: a member whose answer
//! is late, past the engine's 500 ms hedge, after it did the work.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, sleep_until};

/// The client's connection preface, before its first frame.
const PREFACE: usize = 24;
const DATA: u8 = 0x0;
const RST_STREAM: u8 = 0x3;

/// Proxies that hold back the next request containing a needle (see the module's doc).
#[derive(Clone)]
pub struct HeldRequests {
    needle: Arc<Mutex<Option<Vec<u8>>>>,
    delay: Duration,
    /// Requests held back so far.
    held: Arc<Mutex<u32>>,
    /// Whether the armed request passes and its member's answers are held back instead.
    answers: bool,
}

impl HeldRequests {
    /// Proxies whose held request reaches its member `delay` late.
    pub fn new(delay: Duration) -> Self {
        HeldRequests {
            needle: Arc::default(),
            delay,
            held: Arc::default(),
            answers: false,
        }
    }

    /// Proxies where the armed request passes at once, and its member's answers are `delay`
    /// late for the next `delay` (see the module's doc).
    pub fn answers(delay: Duration) -> Self {
        HeldRequests {
            answers: true,
            ..HeldRequests::new(delay)
        }
    }

    /// The next request whose body contains `needle`, at any proxy, is held back.
    pub fn arm(&self, needle: &[u8]) {
        *self.needle.lock().unwrap() = Some(needle.to_vec());
    }

    /// How many requests were held back so far.
    pub fn held(&self) -> u32 {
        *self.held.lock().unwrap()
    }

    /// A proxy in front of `upstream` (`http://host:port`); returns its URL.
    pub async fn proxy(&self, upstream: &str) -> String {
        let upstream = upstream.trim_start_matches("http://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let this = self.clone();
        let late = Late::default(); // this member's answers are late until then
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let ((client_rx, client_tx), (server_rx, server_tx)) =
                    (client.into_split(), server.into_split());
                tokio::spawn(this.clone().requests(client_rx, server_tx, late.clone()));
                tokio::spawn(answers(server_rx, client_tx, late.clone(), this.delay));
            }
        });
        url
    }

    /// Copies the client's frames to the member, holding back the armed request's body. The
    /// member's side stays open until a held body has been delivered.
    async fn requests(self, mut from: OwnedReadHalf, to: OwnedWriteHalf, late: Late) {
        let to = Arc::new(tokio::sync::Mutex::new(to));
        let mut preface = [0; PREFACE];
        if from.read_exact(&mut preface).await.is_err() || to.lock().await.write_all(&preface).await.is_err()
        {
            return;
        }
        let mut holding: Option<(u32, Instant)> = None;
        while let Some((head, payload)) = next_frame(&mut from).await {
            let (kind, stream) = (head[3], stream_id(&head));
            let held_stream = holding.filter(|(s, _)| *s == stream);
            if held_stream.is_none() && kind == DATA && self.claims(&payload) {
                match self.answers {
                    true => *late.lock().unwrap() = Some(Instant::now() + self.delay),
                    false => holding = Some((stream, Instant::now() + self.delay)),
                }
            }
            match (holding.filter(|(s, _)| *s == stream), kind) {
                (Some(_), RST_STREAM) => {} // the cancel never arrives
                (Some((_, at)), DATA) => deliver_at(to.clone(), at, [&head[..], &payload].concat()),
                _ => {
                    if to
                        .lock()
                        .await
                        .write_all(&[&head[..], &payload].concat())
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
        if let Some((_, at)) = holding {
            sleep_until(at + Duration::from_secs(2)).await;
        }
        let _ = to.lock().await.shutdown().await;
    }

    /// Whether `payload` is the armed request's (then disarms).
    fn claims(&self, payload: &[u8]) -> bool {
        let mut needle = self.needle.lock().unwrap();
        let found = needle
            .as_ref()
            .is_some_and(|n| payload.windows(n.len()).any(|w| w == n.as_slice()));
        if found {
            *needle = None;
            *self.held.lock().unwrap() += 1;
        }
        found
    }
}

/// Until when a member's answers are late, if they are.
type Late = Arc<Mutex<Option<Instant>>>;

/// Copies the member's answers back, in order; those that come while it is late, `delay`
/// after they came.
async fn answers(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, late: Late, delay: Duration) {
    let (chunks, mut queued) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    tokio::spawn(async move {
        let mut buf = vec![0; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            let now = Instant::now();
            let is_late = late.lock().unwrap().is_some_and(|until| now < until);
            let at = if is_late { now + delay } else { now };
            if chunks.send((at, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    });
    while let Some((at, chunk)) = queued.recv().await {
        sleep_until(at).await;
        if to.write_all(&chunk).await.is_err() {
            return;
        }
    }
}

/// Writes `frame` to `to` at `at`.
fn deliver_at(to: Arc<tokio::sync::Mutex<OwnedWriteHalf>>, at: Instant, frame: Vec<u8>) {
    tokio::spawn(async move {
        sleep_until(at).await;
        let _ = to.lock().await.write_all(&frame).await;
    });
}

/// The next frame: its 9-byte header and its payload.
async fn next_frame(from: &mut OwnedReadHalf) -> Option<([u8; 9], Vec<u8>)> {
    let mut head = [0; 9];
    from.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0; len];
    from.read_exact(&mut payload).await.ok()?;
    Some((head, payload))
}

/// The stream a frame belongs to.
fn stream_id(head: &[u8; 9]) -> u32 {
    u32::from_be_bytes([head[5] & 0x7f, head[6], head[7], head[8]])
}
