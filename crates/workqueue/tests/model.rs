//! Model checks of the queue's synchronisation under loom: every
//! interleaving of two or three threads (up to a bound on preemptions) is
//! run, and a wake-up lost in any of them shows as a deadlock.
//!
//! ```text
//! CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" \
//!     cargo test -p kinformer-workqueue --release --test model
//! ```
//!
//! `cargo xtask test` runs them so. Under `--cfg loom` the queue's mutex,
//! flags and `Notify` are loom's (src/sync.rs). `LOOM_MAX_PREEMPTIONS`
//! overrides the bound of 3.
#![cfg(loom)]

use std::time::Duration;

use kinformer_workqueue::{DelayingQueue, Queue};
use loom::future::block_on;
use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

/// Runs `model` in every interleaving, at most 3 preemptions deep unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise, and prints how many there were
/// (seen with `--nocapture`).
fn check(model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    builder.check({
        let runs = std::sync::Arc::clone(&runs);
        move || {
            runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            model();
        }
    });
    println!(
        "{} interleavings",
        runs.load(std::sync::atomic::Ordering::Relaxed)
    );
}

fn queue_with(items: &[&'static str]) -> Queue<&'static str> {
    let queue = Queue::new();
    for item in items {
        queue.add(*item);
    }
    queue
}

#[test]
fn an_item_is_never_handed_to_two_getters_at_once() {
    check(|| {
        let queue = queue_with(&["a"]);
        let holders = Arc::new(AtomicUsize::new(0));
        let worker = |queue: Queue<&'static str>, holders: Arc<AtomicUsize>| {
            move || {
                let taken = block_on(queue.get()).expect("not shut down");
                assert_eq!(holders.fetch_add(1, Ordering::SeqCst), 0, "held twice");
                // Added again while processed: handed to the other worker
                // once this guard drops, not before.
                queue.add("a");
                holders.fetch_sub(1, Ordering::SeqCst);
                drop(taken);
            }
        };
        let other = thread::spawn(worker(queue.clone(), Arc::clone(&holders)));
        worker(queue.clone(), holders)();
        other.join().unwrap();
        assert_eq!(queue.len(), 1);
    });
}

#[test]
fn an_item_added_while_processed_is_handed_out_again_after_its_guard_drops() {
    check(|| {
        let queue = queue_with(&["a"]);
        // The state the item stands for: the worker must reconcile it.
        let version = Arc::new(AtomicUsize::new(0));
        let writer = thread::spawn({
            let (queue, version) = (queue.clone(), Arc::clone(&version));
            move || {
                version.store(1, Ordering::SeqCst);
                queue.add("a");
            }
        });
        // Without the re-add being kept, the last `get` would wait forever.
        loop {
            let taken = block_on(queue.get()).expect("not shut down");
            let seen = version.load(Ordering::SeqCst);
            drop(taken);
            if seen == 1 {
                break;
            }
        }
        writer.join().unwrap();
    });
}

#[test]
fn getters_waiting_while_another_thread_adds_get_the_items() {
    check(|| {
        let queue = Queue::new();
        let getters: Vec<_> = (0..2)
            .map(|_| {
                let queue = queue.clone();
                thread::spawn(move || *block_on(queue.get()).expect("not shut down"))
            })
            .collect();
        queue.add("a");
        queue.add("b");
        let mut got: Vec<_> = getters.into_iter().map(|g| g.join().unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, ["a", "b"]);
    });
}

#[test]
fn shut_down_wakes_every_getter() {
    check(|| {
        let queue = Queue::<&str>::new();
        let getters: Vec<_> = (0..2)
            .map(|_| {
                let queue = queue.clone();
                thread::spawn(move || block_on(queue.get()).is_none())
            })
            .collect();
        queue.shut_down();
        for getter in getters {
            assert!(
                getter.join().unwrap(),
                "a getter got an item from an empty queue"
            );
        }
    });
}

#[test]
fn shut_down_with_drain_returns_only_once_nothing_is_queued_or_processing() {
    check(|| {
        let queue = queue_with(&["a"]);
        let done = Arc::new(AtomicBool::new(false));
        let worker = thread::spawn({
            let (queue, done) = (queue.clone(), Arc::clone(&done));
            move || {
                while let Some(taken) = block_on(queue.get()) {
                    done.store(true, Ordering::SeqCst);
                    drop(taken);
                }
            }
        });
        block_on(queue.shut_down_with_drain());
        assert!(
            done.load(Ordering::SeqCst),
            "drained before the item was done"
        );
        assert_eq!(queue.len(), 0);
        worker.join().unwrap();
    });
}

/// The delaying queue's timer loop runs on a thread of its own in a model
/// (started by the first `add_after`); loom fails a model whose threads do
/// not all end, so these check that the loop is woken to exit.
#[test]
fn shut_down_ends_the_delaying_loop() {
    check(|| {
        let queue = DelayingQueue::new();
        queue.add_after("a", Duration::from_secs(3600));
        let stopper = thread::spawn({
            let queue = queue.clone();
            move || queue.shut_down()
        });
        stopper.join().unwrap();
        assert_eq!(queue.waiting_len(), 0);
        // Kept alive for good, so that only the shutdown can end the loop
        // (dropping the last handle would too).
        std::mem::forget(queue);
    });
}

#[test]
fn dropping_the_last_handle_ends_the_delaying_loop() {
    check(|| {
        let queue = DelayingQueue::new();
        queue.add_after("a", Duration::from_secs(3600));
        let other = thread::spawn({
            let queue = queue.clone();
            move || queue.add_after("b", Duration::from_secs(1800))
        });
        drop(queue);
        other.join().unwrap();
    });
}

#[test]
fn an_add_cancels_a_pending_delay_and_wakes_a_getter() {
    check(|| {
        let queue = DelayingQueue::new();
        queue.add_after("a", Duration::from_secs(3600));
        let getter = thread::spawn({
            let queue = queue.clone();
            move || *block_on(queue.get()).expect("not shut down")
        });
        queue.add("a");
        assert_eq!(getter.join().unwrap(), "a");
        assert_eq!(queue.waiting_len(), 0);
        queue.shut_down();
    });
}
