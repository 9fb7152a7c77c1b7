//! The gRPC services, KV and Lease (Watch is in `watch.rs`), on etcd-client's generated server
//! traits, and the server that runs them over in-memory connections.

use super::errors::EtcdError;
use super::state::State;
use super::watch::WatchService;
use super::{Held, Shared, kv, txn};
use etcd_client::proto::{
    PbCompactionRequest, PbCompactionResponse, PbDeleteRequest, PbDeleteResponse, PbKvServer, PbKvService,
    PbLeaseGrantRequest, PbLeaseGrantResponse, PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse,
    PbLeaseLeasesRequest, PbLeaseLeasesResponse, PbLeaseRevokeRequest, PbLeaseRevokeResponse, PbLeaseServer,
    PbLeaseService, PbLeaseStatus, PbLeaseTimeToLiveRequest, PbLeaseTimeToLiveResponse, PbPutRequest,
    PbPutResponse, PbRangeRequest, PbRangeResponse, PbRangeStreamResponse, PbTxnRequest, PbTxnResponse,
    PbWatchServer,
};
use std::sync::Arc;
use tokio::io::DuplexStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

type Answer<T> = Result<Response<T>, Status>;

/// Serves KV, Lease and Watch on every connection `connections` brings.
pub(crate) async fn serve(shared: Arc<Shared>, connections: mpsc::UnboundedReceiver<DuplexStream>) {
    let api = Api(shared.clone());
    let incoming = UnboundedReceiverStream::new(connections).map(Ok::<_, std::io::Error>);
    let served = tonic::transport::Server::builder()
        .add_service(PbKvServer::new(api.clone()))
        .add_service(PbLeaseServer::new(api))
        .add_service(PbWatchServer::new(WatchService(shared)))
        .serve_with_incoming(incoming)
        .await;
    served.expect("in-memory connections do not fail to be accepted");
}

/// The KV and Lease services.
#[derive(Clone)]
struct Api(Arc<Shared>);

impl Api {
    /// Runs `f` on the state and fills its answer's header.
    fn answer<T>(
        &self,
        f: impl FnOnce(&mut State) -> Result<T, EtcdError>,
        header: impl FnOnce(&mut T) -> &mut Option<etcd_client::proto::PbResponseHeader>,
    ) -> Answer<T> {
        self.0.update(|s| {
            let mut a = f(s)?;
            s.fill(header(&mut a));
            Ok(Response::new(a))
        })
    }
}

#[tonic::async_trait]
impl PbKvService for Api {
    async fn range(&self, r: Request<PbRangeRequest>) -> Answer<PbRangeResponse> {
        let r = r.into_inner();
        kv::validate_range(&r)?;
        self.answer(|s| kv::range(s, None, &r), |a| &mut a.header)
    }

    async fn put(&self, r: Request<PbPutRequest>) -> Answer<PbPutResponse> {
        let r = r.into_inner();
        kv::validate_put(&r)?;
        let put = |s: &mut State| {
            kv::check_put(s, &r)?;
            let mut write = s.store.begin();
            let a = kv::put(s, &mut write, &r)?;
            s.commit(write);
            Ok(a)
        };
        self.answer(put, |a| &mut a.header)
    }

    async fn delete_range(&self, r: Request<PbDeleteRequest>) -> Answer<PbDeleteResponse> {
        let r = r.into_inner();
        kv::validate_delete(&r)?;
        let delete = |s: &mut State| {
            let mut write = s.store.begin();
            let a = kv::delete(s, &mut write, &r);
            s.commit(write);
            Ok(a)
        };
        self.answer(delete, |a| &mut a.header)
    }

    async fn txn(&self, r: Request<PbTxnRequest>) -> Answer<PbTxnResponse> {
        let r = r.into_inner();
        let Some(hold) = txn::first_put(&r).and_then(|key| self.0.take_hold(Held::Txn, key)) else {
            return self.answer(|s| txn::run(s, &r), |a| &mut a.header);
        };
        // Applied once let on, whether or not its client still waits for the answer: a member
        // that has a request commits it even after the client gave up on it.
        let (api, (answer, answered)) = (self.clone(), oneshot::channel());
        tokio::spawn(async move {
            hold.wait().await;
            let _ = answer.send(api.answer(|s| txn::run(s, &r), |a| &mut a.header));
        });
        (answered.await).unwrap_or_else(|_| Err(Status::unavailable("the member stopped")))
    }

    async fn compact(&self, r: Request<PbCompactionRequest>) -> Answer<PbCompactionResponse> {
        let revision = r.into_inner().revision;
        let compact = |s: &mut State| {
            s.store
                .compact(revision)
                .map(|()| PbCompactionResponse::default())
        };
        self.answer(compact, |a| &mut a.header)
    }

    type RangeStreamStream = Boxed<PbRangeStreamResponse>;

    async fn range_stream(&self, _: Request<PbRangeRequest>) -> Answer<Boxed<PbRangeStreamResponse>> {
        // etcd 3.6, the version the chart ships, has no RangeStream (3.7 has).
        Err(Status::unimplemented(
            "unknown method RangeStream for service etcdserverpb.KV",
        ))
    }
}

type Boxed<T> = std::pin::Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;
type KeepAlives = Boxed<PbLeaseKeepAliveResponse>;

#[tonic::async_trait]
impl PbLeaseService for Api {
    async fn lease_grant(&self, r: Request<PbLeaseGrantRequest>) -> Answer<PbLeaseGrantResponse> {
        let r = r.into_inner();
        let grant = |s: &mut State| {
            let (id, ttl) = s.leases.grant(r.id, r.ttl, Instant::now())?;
            Ok(PbLeaseGrantResponse {
                id,
                ttl,
                ..Default::default()
            })
        };
        self.answer(grant, |a| &mut a.header)
    }

    async fn lease_revoke(&self, r: Request<PbLeaseRevokeRequest>) -> Answer<PbLeaseRevokeResponse> {
        let id = r.into_inner().id;
        let revoke = |s: &mut State| s.revoke(id).map(|()| PbLeaseRevokeResponse::default());
        self.answer(revoke, |a| &mut a.header)
    }

    type LeaseKeepAliveStream = KeepAlives;

    async fn lease_keep_alive(&self, r: Request<Streaming<PbLeaseKeepAliveRequest>>) -> Answer<KeepAlives> {
        let mut requests = r.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let shared = self.0.clone();
        tokio::spawn(async move {
            while let Ok(Some(req)) = requests.message().await {
                // A lease that is gone is answered with TTL 0, not an error (etcd's leaseKeepAlive).
                let renew = |s: &mut State| PbLeaseKeepAliveResponse {
                    header: s.header(),
                    id: req.id,
                    ttl: s.leases.renew(req.id, Instant::now()).unwrap_or(0),
                };
                if tx.send(Ok(shared.update(renew))).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn lease_time_to_live(
        &self,
        r: Request<PbLeaseTimeToLiveRequest>,
    ) -> Answer<PbLeaseTimeToLiveResponse> {
        let r = r.into_inner();
        let ttl = |s: &mut State| {
            // A lease that is gone: TTL -1, not an error (etcd's LeaseTimeToLive).
            let Some(lease) = s.leases.get(r.id) else {
                return Ok(PbLeaseTimeToLiveResponse {
                    id: r.id,
                    ttl: -1,
                    ..Default::default()
                });
            };
            Ok(PbLeaseTimeToLiveResponse {
                header: None,
                id: r.id,
                ttl: lease.remaining(Instant::now()),
                granted_ttl: lease.ttl,
                keys: if r.keys {
                    lease.keys.iter().cloned().collect()
                } else {
                    Vec::new()
                },
            })
        };
        self.answer(ttl, |a| &mut a.header)
    }

    async fn lease_leases(&self, _: Request<PbLeaseLeasesRequest>) -> Answer<PbLeaseLeasesResponse> {
        let leases = |s: &mut State| {
            Ok(PbLeaseLeasesResponse {
                header: None,
                leases: s.leases.ids().map(|id| PbLeaseStatus { id }).collect(),
            })
        };
        self.answer(leases, |a| &mut a.header)
    }
}
