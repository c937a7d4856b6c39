//! The rate-limited workqueue alone, no Kubernetes: a producer adds jobs
//! (some twice while they wait: they are worked once), three workers take
//! them, a failing job is retried with per-item exponential backoff up to
//! three times and then dropped, and shutdown drains what is in flight.
//!
//! ```sh
//! cargo run -p example-workqueue
//! ```

use std::sync::Arc;
use std::time::Duration;

use kinformer_workqueue::{ItemExponentialFailureRateLimiter, RateLimitingQueue};

const MAX_RETRIES: u32 = 3;

#[tokio::main]
async fn main() {
    let limiter =
        ItemExponentialFailureRateLimiter::new(Duration::from_millis(10), Duration::from_secs(1));
    let queue = Arc::new(RateLimitingQueue::<String>::new(limiter));
    for job in ["a", "b", "c", "a", "flaky", "d", "b"] {
        queue.add(job.to_owned()); // the second "a" and "b" merge into the first
    }
    let (finished, mut finished_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut workers = Vec::new();
    for worker in 0..3 {
        let (queue, finished) = (Arc::clone(&queue), finished.clone());
        workers.push(tokio::spawn(async move {
            // `job` is a guard: the job is done once it is retried, forgotten or dropped.
            while let Some(job) = queue.get().await {
                let name = job.as_str();
                if name == "flaky" {
                    let retries = job.num_requeues();
                    if retries < MAX_RETRIES {
                        println!(
                            "worker {worker}: {name} failed, retry {} after backoff",
                            retries + 1
                        );
                        job.retry();
                    } else {
                        println!(
                            "worker {worker}: {name} failed {} times, dropped",
                            retries + 1
                        );
                        let _ = finished.send(job.clone());
                        job.forget();
                    }
                } else {
                    println!("worker {worker}: {name} done");
                    let _ = finished.send(job.clone());
                    job.forget();
                }
            }
        }));
    }
    // Wait until each of the 5 distinct jobs was worked or dropped.
    for _ in 0..5 {
        finished_rx.recv().await;
    }
    queue.shut_down_with_drain().await;
    for w in workers {
        w.await.expect("a worker panicked");
    }
    println!("queue drained; {} jobs left", queue.len());
}
