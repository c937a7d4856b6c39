//! Fakes for unit tests: a scripted [`ListerWatcher`](crate::ListerWatcher)
//! and an in-process API server, both deterministic under Tokio's paused
//! time (no socket, no timer of their own).
//!
//! - [`ScriptedListerWatcher`] answers each list and watch call with the
//!   next answer of its script ([`ScriptedWatch`]: events, then closed,
//!   kept open, or handed to the test as a [`LiveWatch`]), can refuse any
//!   call (410 Gone, 429, a refused streaming list, a panic), holds a list
//!   until the test releases it, and records every request with its
//!   instant. It drives a [`Reflector`](crate::Reflector) or a
//!   [`SharedIndexInformer`](crate::SharedIndexInformer) one transition at
//!   a time, without the wire.
//! - [`FakeApiServer`] is a kube [`Client`](kube_client::Client) over an
//!   in-memory tower service: it stores objects as JSON, answers get, list,
//!   watch (from a version, with the writes after it), create, update,
//!   patch and delete as the API server would, refuses what the test tells
//!   it to, holds writes while told to, and records every request. Code
//!   that takes a `Client` (a [`SharedInformerFactory`](crate::SharedInformerFactory),
//!   an event recorder, a leader elector) runs against it unchanged.
//!
//! It lives in this crate, under the crates that use it, because both fakes
//! stand in for what an informer talks to: a `ListerWatcher`, or the API
//! server behind [`ApiListerWatcher`](crate::ApiListerWatcher); a crate on
//! top (kinformer-controllers) uses them through this one.
//!
//! The module is behind the cargo feature `testing`, off by default: it is
//! test support, which a program's build need not compile (an HTTP router,
//! merge patches, two more small dependencies), and which should not sit
//! beside the real lister-watcher in a program's completions. Enable it
//! where tests are built:
//!
//! ```toml
//! [dev-dependencies]
//! kinformer-informer = { version = "0.1", features = ["testing"] }
//! ```

mod api;
mod scripted;

use std::collections::BTreeMap;

use kube_client::core::WatchEvent;
use kube_client::core::watch::{Bookmark, BookmarkMeta};

use crate::ListPage;

pub use api::{ApiRequest, FakeApiServer};
pub use scripted::{LiveWatch, ScriptedListerWatcher, ScriptedWatch};

/// The annotation of the bookmark that ends a streaming list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// A complete list page: `items` at `resource_version`, no continue token.
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kinformer_informer::testing::page;
///
/// let more = kinformer_informer::ListPage {
///     continue_token: Some("next".to_owned()),
///     ..page(vec![ConfigMap::default()], 7)
/// };
/// assert_eq!((more.items.len(), more.resource_version.as_str()), (1, "7"));
/// ```
pub fn page<K>(items: Vec<K>, resource_version: impl ToString) -> ListPage<K> {
    ListPage {
        items,
        resource_version: resource_version.to_string(),
        continue_token: None,
        skipped: Vec::new(),
        shard_selector: None,
    }
}

/// A BOOKMARK event at `resource_version` (apiVersion and kind left empty:
/// the Reflector reads only the version and the annotations).
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kinformer_informer::kube::core::WatchEvent;
///
/// let WatchEvent::Bookmark(b) = kinformer_informer::testing::bookmark::<ConfigMap>(12) else {
///     unreachable!()
/// };
/// assert_eq!(b.metadata.resource_version, "12");
/// ```
pub fn bookmark<K>(resource_version: impl ToString) -> WatchEvent<K> {
    WatchEvent::Bookmark(Bookmark {
        types: Default::default(),
        metadata: BookmarkMeta {
            resource_version: resource_version.to_string(),
            annotations: BTreeMap::new(),
        },
    })
}

/// The bookmark that ends a streaming list's initial events
/// (annotated `k8s.io/initial-events-end`), at `resource_version`.
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kinformer_informer::kube::core::WatchEvent;
///
/// let end = kinformer_informer::testing::initial_events_end::<ConfigMap>(9);
/// let WatchEvent::Bookmark(b) = end else { unreachable!() };
/// assert_eq!(b.metadata.annotations["k8s.io/initial-events-end"], "true");
/// ```
pub fn initial_events_end<K>(resource_version: impl ToString) -> WatchEvent<K> {
    WatchEvent::Bookmark(Bookmark {
        types: Default::default(),
        metadata: BookmarkMeta {
            resource_version: resource_version.to_string(),
            annotations: BTreeMap::from([(INITIAL_EVENTS_END.to_owned(), "true".to_owned())]),
        },
    })
}
