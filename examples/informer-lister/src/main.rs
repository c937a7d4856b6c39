//! A shared informer and its Lister alone, no controller: prints every
//! ConfigMap event, then answers Lister queries from the cache after each.
//!
//! ```sh
//! cargo run -p example-informer-lister -- [NAMESPACE]   # all namespaces without one
//! cargo run -p example-informer-lister -- [NAMESPACE] --print-rbac SA-NAMESPACE
//! ```

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_controllers::kube::core::{Expression, Selector};
use kinformer_controllers::kube::{Client, ResourceExt};
use kinformer_controllers::rbac;
use kinformer_informer::{
    CancellationToken, Lister, ResourceEventHandlerFuncs, SharedInformerFactory,
};

fn key(cm: &ConfigMap) -> String {
    format!("{}/{}", cm.namespace().unwrap_or_default(), cm.name_any())
}

/// What the cache holds now: every ConfigMap, and those labelled app=web.
fn census(lister: &Lister<ConfigMap>) -> String {
    let web: Selector = Expression::Equal("app".into(), "web".into()).into();
    let all = lister.list(&Selector::default()).len();
    format!("{all} cached, {} with app=web", lister.list(&web).len())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kinformer_controllers::logging::init()?; // INFO and above, to stderr
    let mut factory = SharedInformerFactory::new(Client::try_default().await?);
    if let Some(namespace) = std::env::args().nth(1).filter(|a| a != "--print-rbac") {
        factory = factory.namespace(namespace);
    }
    let informer = factory.informer::<ConfigMap>();
    // `--print-rbac NAMESPACE`: the RBAC it needs, for a ServiceAccount of NAMESPACE.
    if rbac::print_if_asked("informer-lister", || factory.permissions())? {
        return Ok(());
    }
    let (la, lu, ld) = (informer.lister(), informer.lister(), informer.lister());
    informer.add_event_handler(
        ResourceEventHandlerFuncs::new()
            .on_add(move |cm: &Arc<ConfigMap>, initial| {
                let what = if initial { "listed" } else { "added" };
                println!("{what} {} ({})", key(cm), census(&la));
            })
            .on_update(move |_, cm| println!("updated {} ({})", key(cm), census(&lu)))
            .on_delete(move |cm| println!("deleted {} ({})", key(cm.object()), census(&ld))),
    )?;
    let shutdown = CancellationToken::new();
    factory.start(&shutdown);
    factory.wait_for_cache_sync(&shutdown).await;
    println!("synced: {}", census(&informer.lister()));
    tokio::signal::ctrl_c().await?;
    shutdown.cancel();
    Ok(())
}
