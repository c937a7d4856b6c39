//! The primitives the queue synchronises with, swappable for loom's.
//!
//! A normal build re-exports `parking_lot`'s mutex, std's `AtomicBool` and
//! tokio's `Notify`, `Handle` and `timeout_at`: the same types as before,
//! at no cost. Under `--cfg loom` (the model checks in `tests/model.rs`,
//! run by `cargo xtask test`) they are loom's, so that loom explores every
//! interleaving of the queue's lock, flags and wake-ups:
//!
//! - `Mutex` is loom's, with `parking_lot`'s `lock()` (no poisoning).
//! - `Notify` is a model of tokio's written on loom's mutex, since loom's
//!   own `Notify` blocks a thread and has no `notified()` future. It keeps
//!   the guarantees the queue relies on, as tokio documents them (tokio
//!   checks its own `Notify` against them under loom): `notify_one` wakes
//!   the oldest registered waiter or else stores one permit; `notify_waiters`
//!   wakes every `Notified` made before it, enabled or not, and stores
//!   nothing; a `Notified` dropped after a `notify_one` chose it passes the
//!   wake-up on.
//! - `Handle::spawn` runs a background task (the delaying queue's timer
//!   loop) on a loom thread, so a model also checks that it ends.
//! - `timeout_at` never times out: time stands still in a model, which
//!   explores wake-ups only (give delays far in the future).
//!
//! `Arc` and `Weak` stay std's in both builds: loom's `Arc` has no `Weak`,
//! which the background tasks hold; the loom mutex in each `Notify` and in
//! the state still orders one handle against another.

#[cfg(not(loom))]
pub(crate) use parking_lot::Mutex;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::AtomicBool;
#[cfg(not(loom))]
pub(crate) use tokio::runtime::Handle;
#[cfg(not(loom))]
pub(crate) use tokio::sync::Notify;
#[cfg(not(loom))]
pub(crate) use tokio::time::timeout_at;

#[cfg(loom)]
pub(crate) use loom::sync::atomic::AtomicBool;
#[cfg(loom)]
pub(crate) use model::{Handle, Mutex, Notify, timeout_at};

#[cfg(loom)]
mod model {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::PoisonError;
    use std::task::{Context, Poll, Waker};

    use tokio::time::Instant;

    /// loom's mutex with `parking_lot`'s `lock()`.
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(PoisonError::into_inner)
        }
    }

    /// Runs background tasks on loom threads.
    pub(crate) struct Handle;

    impl Handle {
        /// Always a handle: a model has no Tokio runtime.
        pub(crate) fn try_current() -> Result<Self, ()> {
            Ok(Self)
        }

        pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
            loom::thread::spawn(move || loom::future::block_on(task));
        }
    }

    /// Waits for `future` alone: the deadline never passes in a model.
    pub(crate) async fn timeout_at<F: Future>(
        _deadline: Instant,
        future: F,
    ) -> Result<F::Output, ()> {
        Ok(future.await)
    }

    /// tokio's `Notify`, modelled (see the module's docs).
    pub(crate) struct Notify {
        state: Mutex<Waiters>,
    }

    #[derive(Default)]
    struct Waiters {
        /// A `notify_one` with no waiter registered, kept for the next.
        permit: bool,
        /// How many `notify_waiters` calls there were.
        notify_waiters_calls: usize,
        next_id: usize,
        /// Registered waiters, oldest first.
        list: Vec<Waiter>,
    }

    struct Waiter {
        id: usize,
        waker: Option<Waker>,
        notified: Option<Notification>,
    }

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Notification {
        One,
        All,
    }

    impl Waiters {
        /// Chooses the oldest waiter not yet notified, or stores the permit:
        /// the waker to wake once the lock is released.
        fn notify_one(&mut self) -> Option<Waker> {
            match self.list.iter_mut().find(|w| w.notified.is_none()) {
                Some(waiter) => {
                    waiter.notified = Some(Notification::One);
                    waiter.waker.take()
                }
                None => {
                    self.permit = true;
                    None
                }
            }
        }
    }

    impl Notify {
        pub(crate) fn new() -> Self {
            Self {
                state: Mutex::new(Waiters::default()),
            }
        }

        pub(crate) fn notified(&self) -> Notified<'_> {
            let calls = self.state.lock().notify_waiters_calls;
            Notified {
                notify: self,
                notify_waiters_calls: calls,
                state: NotifiedState::Init,
            }
        }

        pub(crate) fn notify_one(&self) {
            let waker = self.state.lock().notify_one();
            if let Some(waker) = waker {
                waker.wake();
            }
        }

        pub(crate) fn notify_waiters(&self) {
            let wakers: Vec<Waker> = {
                let mut state = self.state.lock();
                state.notify_waiters_calls += 1;
                state
                    .list
                    .iter_mut()
                    .filter(|w| w.notified.is_none())
                    .filter_map(|w| {
                        w.notified = Some(Notification::All);
                        w.waker.take()
                    })
                    .collect()
            };
            wakers.into_iter().for_each(Waker::wake);
        }
    }

    /// tokio's `Notified`, modelled.
    pub(crate) struct Notified<'a> {
        notify: &'a Notify,
        notify_waiters_calls: usize,
        state: NotifiedState,
    }

    enum NotifiedState {
        Init,
        Waiting(usize),
        Done,
    }

    impl Notified<'_> {
        /// Registers as a waiter without a waker, as tokio's `enable`:
        /// whether it was notified already.
        pub(crate) fn enable(self: Pin<&mut Self>) -> bool {
            self.get_mut().poll_notified(None)
        }

        fn poll_notified(&mut self, waker: Option<&Waker>) -> bool {
            let mut state = self.notify.state.lock();
            match self.state {
                NotifiedState::Done => true,
                NotifiedState::Init => {
                    // A `notify_waiters` since it was made, else a permit.
                    if state.notify_waiters_calls != self.notify_waiters_calls {
                        self.state = NotifiedState::Done;
                        return true;
                    }
                    if state.permit {
                        state.permit = false;
                        self.state = NotifiedState::Done;
                        return true;
                    }
                    let id = state.next_id;
                    state.next_id += 1;
                    state.list.push(Waiter {
                        id,
                        waker: waker.cloned(),
                        notified: None,
                    });
                    self.state = NotifiedState::Waiting(id);
                    false
                }
                NotifiedState::Waiting(id) => {
                    let Some(index) = state.list.iter().position(|w| w.id == id) else {
                        unreachable!("a waiting Notified stays listed until it is done")
                    };
                    if state.list[index].notified.is_some() {
                        state.list.remove(index);
                        self.state = NotifiedState::Done;
                        return true;
                    }
                    if let Some(waker) = waker {
                        state.list[index].waker = Some(waker.clone());
                    }
                    false
                }
            }
        }
    }

    impl Future for Notified<'_> {
        type Output = ();

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            match self.get_mut().poll_notified(Some(cx.waker())) {
                true => Poll::Ready(()),
                false => Poll::Pending,
            }
        }
    }

    impl Drop for Notified<'_> {
        fn drop(&mut self) {
            let NotifiedState::Waiting(id) = self.state else {
                return;
            };
            let waker = {
                let mut state = self.notify.state.lock();
                let index = state.list.iter().position(|w| w.id == id);
                let waiter = index.map(|i| state.list.remove(i));
                match waiter.and_then(|w| w.notified) {
                    // Chosen by a `notify_one` it will not consume: pass it on.
                    Some(Notification::One) => state.notify_one(),
                    _ => None,
                }
            };
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }
}
