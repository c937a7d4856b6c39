//! A test's own namespace, deleted when the test is done with it.

use std::sync::mpsc;

use k8s_openapi::api::core::v1::Namespace;
use kube_client::api::{Api, DeleteParams};
use kube_client::{Client, Config};

/// A namespace made by [`TestEnv::create_namespace`](crate::TestEnv::create_namespace):
/// its name (it dereferences to a `String`, so `&ns` is a `&str`), deleted
/// when this is dropped. The delete is sent from a thread of the control
/// plane's own and not waited for; the namespace controller then empties
/// and removes the namespace. [`keep`](Self::keep) gives the name without
/// the delete.
pub struct TestNamespace {
    name: String,
    deleter: Option<mpsc::Sender<String>>,
}

impl TestNamespace {
    pub(crate) fn new(name: String, deleter: mpsc::Sender<String>) -> Self {
        Self {
            name,
            deleter: Some(deleter),
        }
    }

    /// The name, and the namespace kept when the test ends.
    pub fn keep(mut self) -> String {
        self.deleter = None;
        std::mem::take(&mut self.name)
    }
}

impl std::ops::Deref for TestNamespace {
    type Target = String;

    fn deref(&self) -> &String {
        &self.name
    }
}

/// As its name's: `{ns:?}` is `"the-name"`, as it was when this was a `String`.
impl std::fmt::Debug for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.name, f)
    }
}

impl AsRef<str> for TestNamespace {
    fn as_ref(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Display for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if let Some(deleter) = self.deleter.take() {
            let _ = deleter.send(std::mem::take(&mut self.name));
        }
    }
}

/// Starts the thread that deletes the namespaces sent to it, with a client
/// of its own on a runtime of its own (a drop may come after the test's
/// runtime has stopped). It ends when every sender is gone.
pub(crate) fn deleter(config: Config) -> mpsc::Sender<String> {
    let (tx, rx) = mpsc::channel::<String>();
    let spawned = std::thread::Builder::new()
        .name("envtest-ns-deleter".into())
        .spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                let Ok(client) = Client::try_from(config) else {
                    return;
                };
                let namespaces: Api<Namespace> = Api::all(client);
                while let Ok(name) = rx.recv() {
                    if let Err(e) = namespaces.delete(&name, &DeleteParams::default()).await {
                        tracing::debug!(namespace = %name, error = %e, "deleting a test's namespace failed");
                    }
                }
            });
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no thread to delete test namespaces: they are kept");
    }
    tx
}

impl serde::Serialize for TestNamespace {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.name)
    }
}

impl AsRef<std::ffi::OsStr> for TestNamespace {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.name.as_ref()
    }
}

impl From<&TestNamespace> for String {
    fn from(ns: &TestNamespace) -> Self {
        ns.name.clone()
    }
}
