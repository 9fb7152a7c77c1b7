//! Seeds on every core: each seed runs on a runtime and thread-local generators of its own, so
//! seeds run side by side on threads without touching one another, and each run is the same as
//! it would be alone.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// `run(i, items[i])` for every item on `threads` threads, in item order; once one is an
/// error, unless `keep_going`, no item not yet started starts (the ones before it still
/// finish).
pub fn map<T: Send, E: Send>(
    items: &[u64],
    (threads, keep_going): (usize, bool),
    run: impl Fn(usize, u64) -> Result<T, E> + Sync,
) -> Vec<Result<T, E>> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let done: Mutex<Vec<Option<Result<T, E>>>> = Mutex::new(items.iter().map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                while !failed.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&item) = items.get(i) else { break };
                    let result = run(i, item);
                    failed.fetch_or(result.is_err() && !keep_going, Ordering::Relaxed);
                    done.lock().unwrap()[i] = Some(result);
                }
            });
        }
    });
    // Items after a failure that never started are left out.
    done.into_inner().unwrap().into_iter().map_while(|r| r).collect()
}
