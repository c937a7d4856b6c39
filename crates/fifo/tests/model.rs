//! Model checks of the queues' synchronisation under loom: every
//! interleaving of two or three threads (up to a bound on preemptions) is
//! run, and a wake-up lost in any of them shows as a deadlock.
//!
//! ```text
//! CARGO_TARGET_DIR=target/loom RUSTFLAGS="--cfg loom" \
//!     cargo test -p kinformer-fifo --release --test model
//! ```
//!
//! `cargo xtask test` runs them so. Under `--cfg loom` the queues' locks
//! and `Notify` are loom's (src/sync.rs). `LOOM_MAX_PREEMPTIONS` overrides
//! the bound of 3.
#![cfg(loom)]

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_fifo::{DeltaFifo, Deltas, PopError, Popped, RealFifo, Requeue};
use loom::future::block_on;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;

/// Runs `model` in every interleaving, at most 3 preemptions deep unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise, and prints how many there were
/// (seen with `--nocapture`).
fn check(model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    builder.check({
        let runs = Arc::clone(&runs);
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

fn pod(name: &str) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: ObjectMeta {
            namespace: Some("ns".into()),
            name: Some(name.into()),
            resource_version: Some("1".into()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    })
}

/// The names in `deltas`, oldest first.
fn names(deltas: &Deltas<Pod>) -> Vec<String> {
    deltas
        .iter()
        .filter_map(|d| d.object.object().metadata.name.clone())
        .collect()
}

fn pop_names(fifo: &RealFifo<Pod>) -> Result<Vec<String>, PopError<()>> {
    block_on(fifo.pop(|deltas, _| Ok::<_, Requeue<()>>(names(deltas))))
}

#[test]
fn a_pop_waiting_while_another_thread_adds_gets_the_delta() {
    check(|| {
        let fifo = Arc::new(RealFifo::<Pod>::new());
        let consumer = thread::spawn({
            let fifo = Arc::clone(&fifo);
            move || pop_names(&fifo)
        });
        fifo.add(pod("a")).unwrap();
        assert_eq!(consumer.join().unwrap().unwrap(), ["a"]);
    });
}

#[test]
fn deltas_from_two_producers_are_each_popped_once() {
    check(|| {
        let fifo = Arc::new(RealFifo::<Pod>::new());
        let producer = thread::spawn({
            let fifo = Arc::clone(&fifo);
            move || fifo.add(pod("b")).unwrap()
        });
        fifo.add(pod("a")).unwrap();
        let mut popped = [pop_names(&fifo).unwrap(), pop_names(&fifo).unwrap()].concat();
        producer.join().unwrap();
        popped.sort_unstable();
        assert_eq!(popped, ["a", "b"]);
        assert!(fifo.is_empty());
    });
}

#[test]
fn close_wakes_a_waiting_pop() {
    check(|| {
        let fifo = Arc::new(RealFifo::<Pod>::new());
        let consumer = thread::spawn({
            let fifo = Arc::clone(&fifo);
            move || pop_names(&fifo)
        });
        fifo.close();
        assert!(matches!(consumer.join().unwrap(), Err(PopError::Closed)));
    });
}

/// In the atomic mode a unit is processed with the content's lock released
/// (producers go on adding); the consumer's lock still keeps two
/// consumers from processing at once, and units in their order.
#[test]
fn atomic_pop_units_are_processed_one_at_a_time_in_order_while_producers_add() {
    check(|| {
        let fifo = Arc::new(RealFifo::<Pod>::atomic());
        let busy = Arc::new(AtomicUsize::new(0));
        // Which unit each pop processed, and in which turn.
        let turns = Arc::new(AtomicUsize::new(0));
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let (fifo, busy, turns) =
                    (Arc::clone(&fifo), Arc::clone(&busy), Arc::clone(&turns));
                thread::spawn(move || {
                    block_on(fifo.pop_unit(|unit, _| {
                        assert_eq!(busy.fetch_add(1, Ordering::SeqCst), 0, "two at once");
                        let Popped::Deltas { deltas, .. } = unit else {
                            unreachable!("only deltas were added")
                        };
                        let turn = turns.fetch_add(1, Ordering::SeqCst);
                        busy.fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, Requeue<()>>((turn, names(deltas)))
                    }))
                    .unwrap()
                })
            })
            .collect();
        fifo.add(pod("a")).unwrap();
        fifo.add(pod("b")).unwrap();
        let mut popped: Vec<_> = consumers.into_iter().map(|c| c.join().unwrap()).collect();
        popped.sort_unstable();
        assert_eq!(
            popped,
            [(0, vec!["a".to_owned()]), (1, vec!["b".to_owned()])]
        );
    });
}

#[test]
fn a_delta_fifo_pop_waiting_while_another_thread_adds_gets_the_deltas() {
    check(|| {
        let fifo = Arc::new(DeltaFifo::<Pod>::new());
        let consumer = thread::spawn({
            let fifo = Arc::clone(&fifo);
            move || block_on(fifo.pop(|deltas, _| Ok::<_, Requeue<()>>(names(deltas))))
        });
        fifo.add(pod("a")).unwrap();
        fifo.close();
        assert_eq!(consumer.join().unwrap().unwrap(), ["a"]);
    });
}
