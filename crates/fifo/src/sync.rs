//! The primitives the queues synchronise with, swappable for loom's.
//!
//! A normal build re-exports `parking_lot`'s mutex and tokio's `Notify`:
//! the same types as before, at no cost. Under `--cfg loom` (the model
//! checks in `tests/model.rs`, run by `cargo xtask test`) they are loom's,
//! so that loom explores every interleaving of the consumer's lock, the
//! content's lock and the wake-ups:
//!
//! - `Mutex` is loom's, with `parking_lot`'s `lock()` (no poisoning).
//! - `Notify` is a model of the part of tokio's that the queues use, written
//!   on loom's mutex (loom's own `Notify` blocks a thread and has no
//!   `notified()` future): `notify_waiters` wakes every `Notified` made
//!   before it, enabled or not, and stores nothing, as tokio documents (and
//!   checks under loom). The workqueue crate's `sync` module models the
//!   rest (`notify_one` and its permit).

#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use tokio::sync::Notify;

#[cfg(loom)]
pub(crate) use loom::sync::MutexGuard;
#[cfg(loom)]
pub(crate) use model::{Mutex, Notify};

#[cfg(loom)]
mod model {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::PoisonError;
    use std::task::{Context, Poll, Waker};

    use super::MutexGuard;

    /// loom's mutex with `parking_lot`'s `lock()`.
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(PoisonError::into_inner)
        }
    }

    /// tokio's `Notify`, as far as `notify_waiters` (see the module's docs).
    pub(crate) struct Notify {
        state: Mutex<Waiters>,
    }

    #[derive(Default)]
    struct Waiters {
        /// How many `notify_waiters` calls there were.
        calls: usize,
        next_id: usize,
        /// Registered waiters not yet woken, with their wakers if polled.
        list: Vec<(usize, Option<Waker>)>,
    }

    impl Notify {
        pub(crate) fn new() -> Self {
            Self {
                state: Mutex::new(Waiters::default()),
            }
        }

        pub(crate) fn notified(&self) -> Notified<'_> {
            let calls = self.state.lock().calls;
            Notified {
                notify: self,
                calls,
                id: None,
            }
        }

        pub(crate) fn notify_waiters(&self) {
            let wakers: Vec<Waker> = {
                let mut state = self.state.lock();
                state.calls += 1;
                state
                    .list
                    .drain(..)
                    .filter_map(|(_, waker)| waker)
                    .collect()
            };
            wakers.into_iter().for_each(Waker::wake);
        }
    }

    /// tokio's `Notified`, modelled.
    pub(crate) struct Notified<'a> {
        notify: &'a Notify,
        /// `notify_waiters` calls when it was made: any later one wakes it.
        calls: usize,
        /// Its place in the list, once registered.
        id: Option<usize>,
    }

    impl Notified<'_> {
        /// Registers as a waiter without a waker, as tokio's `enable`:
        /// whether it was notified already.
        pub(crate) fn enable(self: Pin<&mut Self>) -> bool {
            self.get_mut().poll_notified(None)
        }

        fn poll_notified(&mut self, waker: Option<&Waker>) -> bool {
            let mut state = self.notify.state.lock();
            if state.calls != self.calls {
                return true;
            }
            match self.id {
                Some(id) => {
                    if let (Some(waker), Some(entry)) =
                        (waker, state.list.iter_mut().find(|(i, _)| *i == id))
                    {
                        entry.1 = Some(waker.clone());
                    }
                }
                None => {
                    let id = state.next_id;
                    state.next_id += 1;
                    state.list.push((id, waker.cloned()));
                    self.id = Some(id);
                }
            }
            false
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
            if let Some(id) = self.id {
                self.notify.state.lock().list.retain(|(i, _)| *i != id);
            }
        }
    }
}
