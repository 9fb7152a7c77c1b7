//! What a waiter relies on when it checks that its watches are served at once
//! (`Etcd::watch_keys_synced`): etcd answers a progress request on a stream only when every
//! watch of the stream is on its synced path. A version of etcd that answered regardless would
//! make the check pass for a watch left on the 100 ms catch-up path, and these tests fail.

use etcd_client::{Client, EventType, WatchOptions, WatchResponse, WatchStream};
use std::time::Duration;
use tokio::time::{Instant, timeout};

use crate::common::EtcdServer;

/// The next message on `stream`, within 5 s.
async fn next(stream: &mut WatchStream) -> WatchResponse {
    (timeout(Duration::from_secs(5), stream.message()).await)
        .expect("a message within 5 s")
        .expect("the stream works")
        .expect("the stream is open")
}

fn is_progress(resp: &WatchResponse) -> bool {
    resp.watch_id() == -1 && resp.events().is_empty()
}

#[tokio::test]
async fn a_stream_watching_from_now_answers_a_progress_request_at_once() {
    let etcd = EtcdServer::start().await;
    let mut client = Client::connect([&etcd.endpoint], None).await.unwrap();
    let mut stream = client.watch("k", None).await.unwrap();
    assert!(next(&mut stream).await.created());
    // Writes to other keys must not change that: the watch stays synced.
    for i in 0..20 {
        client.put(format!("other{i}"), "v", None).await.unwrap();
    }
    let asked = Instant::now();
    stream.request_progress().await.unwrap();
    let resp = next(&mut stream).await;
    assert!(
        is_progress(&resp),
        "expected a progress notification, got {resp:?}"
    );
    eprintln!("progress answered in {:?}", asked.elapsed());
}

#[tokio::test]
async fn a_stream_with_a_watch_on_the_catch_up_path_answers_only_once_it_caught_up() {
    let etcd = EtcdServer::start().await;
    let mut client = Client::connect([&etcd.endpoint], None).await.unwrap();
    let first = client
        .put("k", "0", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    for i in 1..50 {
        client.put("k", i.to_string(), None).await.unwrap();
    }
    // A watch from a past revision starts unsynced: etcd's catch-up loop sends it the 50 past
    // events within about 100 ms, and only then moves it to the synced watches.
    let from = WatchOptions::new().with_start_revision(first);
    let mut stream = client.watch("k", Some(from)).await.unwrap();
    assert!(next(&mut stream).await.created());
    let mut events = 0;
    loop {
        stream.request_progress().await.unwrap();
        let Ok(resp) = timeout(Duration::from_millis(5), stream.message()).await else {
            continue; // not answered: etcd drops the request while the watch is unsynced
        };
        let resp = resp.unwrap().unwrap();
        if is_progress(&resp) {
            break;
        }
        assert!(resp.events().iter().all(|e| e.event_type() == EventType::Put));
        events += resp.events().len();
    }
    assert_eq!(
        events, 50,
        "etcd answered a progress request before the watch caught up with the past events"
    );
}
