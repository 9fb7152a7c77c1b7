//! The clients the engine reaches etcd through, replaced whole when etcd stops taking them.
//!
//! A sidecar's etcd password and etcd's CA can change while it runs: a reinstall on fresh etcd
//! volumes brings new passwords and a new CA, which the operator writes into each namespace's
//! Secret and the kubelet into the pods' mounted copies of it. etcd then refuses the clients the
//! sidecar connected with (their password, token or trusted CA is the old one), and only clients
//! built anew from those files get in. The engine notes each refusal of its current clients
//! ([`Link::notice`]); the sidecar, which knows where the files are, waits for one
//! ([`Link::refused`]) and hands in clients built anew ([`Link::replace`]).

use etcd_client::Client;
use std::sync::{Arc, RwLock};
use tokio::sync::watch;

use super::members::{Members, Route};
use crate::lock::refusal::Refusal;

/// The clients of one connection to etcd: balanced over the endpoints, and one per member.
pub(in crate::lock) struct Clients {
    pub client: Client,
    pub members: Arc<Members>,
}

impl Clients {
    /// The client for a new request, watch or keepalive stream (see [`Members::pick`]).
    pub fn pick(&self) -> Route {
        self.members.pick(&self.client)
    }
}

/// The engine's current etcd clients, and the refusals noticed on them. Cheap to clone.
#[derive(Clone)]
pub struct Link(Arc<Shared>);

struct Shared {
    current: RwLock<Arc<Clients>>,
    refused: watch::Sender<Option<Refusal>>,
}

impl Link {
    /// A link over `client`, and `members` (one client per member, none for one endpoint).
    pub(in crate::lock) fn new(client: Client, members: Vec<Client>) -> Self {
        Link(Arc::new(Shared {
            current: RwLock::new(clients(client, members)),
            refused: watch::Sender::new(None),
        }))
    }

    /// The clients new requests, watches and keepalive streams go through.
    pub(in crate::lock) fn current(&self) -> Arc<Clients> {
        self.0.current.read().unwrap().clone()
    }

    /// Notes `e`, the answer to a request sent through `clients`, if it refuses them. A refusal
    /// of clients already replaced is old news, and ignored.
    pub(in crate::lock) fn notice(&self, clients: &Arc<Clients>, e: &etcd_client::Error) {
        if let Some(refusal) = Refusal::of(e)
            && Arc::ptr_eq(clients, &self.current())
        {
            self.0.refused.send_replace(Some(refusal));
        }
    }

    /// Waits for the next refusal of the current clients, and says why they were refused.
    pub async fn refused(&self) -> Refusal {
        let mut refusals = self.0.refused.subscribe();
        // The sender lives as long as `self`; only refusals are sent.
        let _ = refusals.changed().await;
        refusals.borrow_and_update().expect("only refusals are sent")
    }

    /// Replaces the clients: new requests, watches and keepalive streams go through `client`
    /// and `members`; those under way finish on the old ones.
    pub fn replace(&self, client: Client, members: Vec<Client>) {
        *self.0.current.write().unwrap() = clients(client, members);
    }
}

fn clients(client: Client, members: Vec<Client>) -> Arc<Clients> {
    Arc::new(Clients {
        client,
        members: Arc::new(Members::new(members)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_client::Channel;
    use tonic::transport::Endpoint;

    /// A client that never connects (nothing is sent through it here).
    async fn idle() -> Client {
        let channel = Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
        Client::from_channel(Channel::Tonic(channel), None).await.unwrap()
    }

    fn refused_password() -> etcd_client::Error {
        let message = "etcdserver: authentication failed, invalid user ID or password";
        etcd_client::Error::GRpcStatus(tonic::Status::invalid_argument(message))
    }

    #[tokio::test]
    async fn only_a_refusal_of_the_current_clients_wakes_whoever_waits_for_one() {
        let link = Link::new(idle().await, vec![]);
        let old = link.current();
        let waiting = link.clone();
        let waiter = tokio::spawn(async move { waiting.refused().await });
        tokio::task::yield_now().await; // it waits now
        link.replace(idle().await, vec![]);
        link.notice(&old, &refused_password());
        let unavailable = etcd_client::Error::GRpcStatus(tonic::Status::unavailable("no leader"));
        link.notice(&link.current(), &unavailable);
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "woken by old clients' refusal or a failure of etcd's"
        );
        link.notice(&link.current(), &refused_password());
        assert_eq!(waiter.await.unwrap(), Refusal::Password);
    }
}
