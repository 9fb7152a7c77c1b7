//! One pod's network to the simulated etcd: every connection its engine opens goes through a
//! [`Wire`] that the world can pause (the pod frozen: no request, keepalive or answer moves),
//! make deaf (requests reach etcd and are applied, their answers wait) and break (every open
//! connection reset: watch and keepalive streams end, requests fail).

use crate::etcd::Etcd;
use hyper_util::rt::TokioIo;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tonic::transport::{Channel, Endpoint};

#[derive(Default)]
struct State {
    paused: bool,
    /// The pod died: nothing moves, for good.
    dead: bool,
    /// Answers wait; requests go on.
    deaf: bool,
    /// Bumped by each break: a wire born before it is reset.
    generation: u64,
    /// The wires waiting for the pause to end.
    parked: Vec<Waker>,
}

/// A pod's network switch. Cheap to clone.
#[derive(Clone, Default)]
pub struct Net(Arc<Mutex<State>>);

impl Net {
    /// A gRPC channel to `etcd` whose connections go through this switch.
    pub fn channel(&self, etcd: &Arc<Etcd>) -> Channel {
        let (net, etcd) = (self.clone(), etcd.clone());
        let connector = tower::service_fn(move |_| {
            let wire = Wire {
                inner: etcd.connect(),
                born: net.0.lock().unwrap().generation,
                net: net.clone(),
            };
            async move { Ok::<_, io::Error>(TokioIo::new(wire)) }
        });
        Endpoint::from_static("http://etcd.sim:2379").connect_with_connector_lazy(connector)
    }

    /// Freezes (`true`) or thaws the pod's connections.
    pub fn pause(&self, paused: bool) {
        let mut s = self.0.lock().unwrap();
        s.paused = paused;
        s.parked.drain(..).for_each(Waker::wake);
    }

    /// Makes the pod's connections deliver no answer (`true`) or deliver them again.
    pub fn deafen(&self, deaf: bool) {
        let mut s = self.0.lock().unwrap();
        s.deaf = deaf;
        s.parked.drain(..).for_each(Waker::wake);
    }

    /// Cuts the pod off for good (it died): nothing moves, whatever comes after.
    pub fn kill(&self) {
        self.0.lock().unwrap().dead = true;
    }

    /// Resets every connection open now; new ones work.
    pub fn break_all(&self) {
        let mut s = self.0.lock().unwrap();
        s.generation += 1;
        s.parked.drain(..).for_each(Waker::wake);
    }

    /// `None` to go on; `Some` to stop with that answer: parked while paused (or, for a
    /// `read`, while deaf), an error once broken.
    fn gate<T>(&self, born: u64, read: bool, cx: &Context<'_>) -> Option<Poll<io::Result<T>>> {
        let mut s = self.0.lock().unwrap();
        if s.generation != born {
            return Some(Poll::Ready(Err(io::ErrorKind::ConnectionReset.into())));
        }
        if s.dead || s.paused || (read && s.deaf) {
            s.parked.push(cx.waker().clone());
            return Some(Poll::Pending);
        }
        None
    }
}

/// One connection of a pod.
struct Wire {
    inner: DuplexStream,
    born: u64,
    net: Net,
}

impl AsyncRead for Wire {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.net.gate(this.born, true, cx) {
            Some(stop) => stop,
            None => Pin::new(&mut this.inner).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Wire {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match this.net.gate(this.born, false, cx) {
            Some(stop) => stop,
            None => Pin::new(&mut this.inner).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match this.net.gate(this.born, false, cx) {
            Some(stop) => stop,
            None => Pin::new(&mut this.inner).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
