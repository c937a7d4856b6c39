//! The queues need no runtime: each is made, fed and popped on a plain
//! thread, outside any Tokio runtime, with a pop waiting for a push from
//! another thread (an informer pops from a thread of its own).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kinformer_fifo::{
    DeltaFifo, FifoKind, InformerQueue, Popped, RealFifo, RealFifoOptions, Requeue,
};
use kinformer_store::{Indexer, KnownObjects, meta_namespace_key};

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

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `future` on this thread, parked between polls: no runtime.
fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::park();
    }
}

/// The key of the next unit popped from `queue`.
fn pop_key(queue: &InformerQueue<Pod>) -> String {
    block_on(queue.pop_unit(|unit, _| {
        let key = match unit {
            Popped::Deltas { key, .. } => key.to_owned(),
            Popped::ReplacedAll(all) => all.objects().map(|(k, _)| k.to_string()).collect(),
            Popped::SyncAll | Popped::Bookmark(_) => String::new(),
        };
        Ok::<_, Requeue<()>>(key)
    }))
    .unwrap()
}

#[test]
fn every_queue_is_made_fed_and_popped_outside_any_runtime() {
    assert!(tokio::runtime::Handle::try_current().is_err());
    let _ = (DeltaFifo::<Pod>::default(), RealFifo::<Pod>::default());
    let _ = RealFifo::<Pod>::with_options(RealFifoOptions::default().atomic());
    for kind in [
        FifoKind::DeltaFifo,
        FifoKind::RealFifo,
        FifoKind::AtomicFifo,
    ] {
        let known: Arc<dyn KnownObjects<Pod>> = Arc::new(Indexer::<Pod>::new());
        let queue = InformerQueue::new(kind, Arc::new(|p: &Pod| meta_namespace_key(p)), known);
        queue.add(pod("a")).unwrap();
        assert_eq!(pop_key(&queue), "ns/a", "{kind:?}");
        // A pop that waits, woken by a push from another thread.
        let pusher = {
            let queue = queue.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                queue.add(pod("b")).unwrap();
            })
        };
        assert_eq!(pop_key(&queue), "ns/b", "{kind:?}");
        pusher.join().unwrap();
        assert!(queue.is_empty());
    }
}
