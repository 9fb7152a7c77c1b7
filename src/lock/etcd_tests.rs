//! Unit tests of `etcd`: the hedge.

use super::*;
use std::future::pending;

type Answer = Pin<Box<dyn Future<Output = Result<i32, etcd_client::Error>>>>;

/// Runs `hedged` over `answers` (the n-th attempt gets the n-th; later ones never answer);
/// returns the result, how many attempts were sent, and how long it took (paused time).
async fn run(answers: Vec<fn() -> Answer>) -> (Result<i32, LockError>, u64, Duration) {
    let stats = Stats::default();
    let start = Instant::now();
    let request = || {
        let n = stats.requests.load(Ordering::Relaxed) as usize - 1;
        answers
            .get(n)
            .map_or_else(|| Box::pin(pending()) as Answer, |a| a())
    };
    // 7 is a settled answer, 0 an unsettled one (a guard that failed).
    let result = hedged(&stats, request, |&n| n != 0).await;
    let sent = stats.requests.load(Ordering::Relaxed);
    assert_eq!(
        stats.resent.load(Ordering::Relaxed),
        sent - 1,
        "all but the first resent"
    );
    (result, sent, start.elapsed())
}

fn silent() -> Answer {
    Box::pin(pending())
}
fn ok() -> Answer {
    Box::pin(async { Ok(7) })
}
fn unavailable() -> Answer {
    Box::pin(async { Err(etcd_client::Error::GRpcStatus(tonic::Status::unavailable("down"))) })
}
fn denied() -> Answer {
    Box::pin(async {
        Err(etcd_client::Error::GRpcStatus(tonic::Status::permission_denied(
            "no",
        )))
    })
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_request_is_sent_again_after_the_hedge() {
    let (result, sent, took) = run(vec![silent, ok]).await;
    assert_eq!((result.unwrap(), sent, took), (7, 2, HEDGE));
}

fn late_ok() -> Answer {
    Box::pin(async {
        tokio::time::sleep(HEDGE * 3).await;
        Ok(7)
    })
}
fn unsettled() -> Answer {
    Box::pin(async { Ok(0) })
}

/// Finding 3 of the edges review: a release's first copy deleted the key but its answer
/// was held back past the hedge; the copy sent again found the key gone and answered
/// first, and the release was reported lost (410).
#[tokio::test(start_paused = true)]
async fn an_answer_that_may_be_an_earlier_copys_work_waits_for_that_copy() {
    let (result, sent, took) = run(vec![late_ok, unsettled]).await;
    assert_eq!((result.unwrap(), sent, took), (7, 2, HEDGE * 3));
    let (result, sent, took) = run(vec![silent, unsettled]).await;
    assert_eq!(
        (result.unwrap(), sent, took),
        (0, 2, BUDGET),
        "no copy settles: it stands"
    );
    let (result, sent, _) = run(vec![unsettled]).await;
    assert_eq!((result.unwrap(), sent), (0, 1), "nothing else out: at once");
}

#[tokio::test(start_paused = true)]
async fn a_transient_error_is_retried_after_a_short_pause() {
    let (result, sent, took) = run(vec![unavailable, ok]).await;
    assert_eq!((result.unwrap(), sent, took), (7, 2, RETRY_PAUSE));
}

fn auth_outdated() -> Answer {
    let old = "etcdserver: revision of auth store is old";
    Box::pin(async move {
        Err(etcd_client::Error::GRpcStatus(tonic::Status::invalid_argument(
            old,
        )))
    })
}

#[tokio::test(start_paused = true)]
async fn a_request_refused_for_an_outdated_token_is_sent_again() {
    let (result, sent, took) = run(vec![auth_outdated, ok]).await;
    assert_eq!((result.unwrap(), sent, took), (7, 2, RETRY_PAUSE));
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_final() {
    let (result, sent, _) = run(vec![denied, ok]).await;
    assert!(matches!(result, Err(LockError::Forbidden(_))), "{result:?}");
    assert_eq!(sent, 1);
}

#[tokio::test(start_paused = true)]
async fn silence_ends_at_the_budget() {
    let (result, sent, took) = run(vec![]).await;
    assert!(
        matches!(result, Err(LockError::Unavailable(Unavailable::Timeout(_)))),
        "{result:?}"
    );
    assert_eq!(
        (sent, took),
        ((BUDGET.as_millis() / HEDGE.as_millis()) as u64, BUDGET)
    );
}
