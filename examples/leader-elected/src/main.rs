//! Leader election across replicas: run it twice with different identities
//! and metrics addresses; one leads and reconciles, the other stands by
//! with its caches warm, and takes over when the leader stops. Each serves
//! `/metrics` (with `leader_election_master_status`) and the probes on its
//! address.
//!
//! ```sh
//! cargo run -p example-leader-elected -- NAMESPACE IDENTITY 127.0.0.1:8080
//! ```

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_controllers::kube::{Client, ResourceExt};
use kinformer_controllers::{Action, LeaderElectionConfig, Lookup, Manager, ManagerOptions, rbac};
use kinformer_informer::SharedInformerFactory;

const MANAGER: &str = "leader-elected";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kinformer_controllers::logging::init()?; // INFO and above, to stderr
    let mut args = std::env::args().skip(1);
    let usage = "usage: leader-elected NAMESPACE IDENTITY METRICS-ADDRESS";
    let (Some(namespace), Some(identity), Some(addr)) = (args.next(), args.next(), args.next())
    else {
        anyhow::bail!(usage);
    };
    let mut election = LeaderElectionConfig::new(MANAGER)
        .namespace(&namespace)
        .identity(&identity);
    // Shorter than client-go's 15/10/2 s, so a takeover is quick to watch.
    (election.lease_duration, election.renew_deadline) =
        (Duration::from_secs(6), Duration::from_secs(4));
    election.retry_period = Duration::from_secs(1);
    let options = ManagerOptions::new()
        .metrics_bind_address(&addr)
        .health_probe_bind_address(&addr)
        .leader_election(election);
    let client = Client::try_default().await?;
    let factory = SharedInformerFactory::new(client.clone()).namespace(&namespace);
    let mut manager = Manager::with_factory(factory, client, options)?;
    let controller = manager.controller::<ConfigMap>(MANAGER).reconcile(
        identity.into(),
        |cm, identity: std::sync::Arc<String>| async move {
            if let Lookup::Found(cm) = cm {
                println!("{identity} reconciled {}", cm.name_any());
            }
            Ok(Action::Done)
        },
    )?;
    manager.add(controller);
    // `--print-rbac NAMESPACE`: the RBAC it needs, for a ServiceAccount of NAMESPACE.
    if rbac::print_if_asked(MANAGER, || manager.permissions())? {
        return Ok(());
    }
    Ok(manager.run_until_signal().await?)
}
