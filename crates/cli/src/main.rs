//! `kinformer`: runs the pod-stdout or service-strategy controller against a
//! cluster (kubeconfig, context or in-cluster configuration).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod, Service};
use kinformer_controllers::{
    BindAddress, ControllerOptions, LeaderElectionConfig, Manager, ManagerOptions, PanicPolicy,
    Ring, RingConfig, pod_stdout, service_strategy, shutdown_on_signal,
};
use kinformer_informer::{CancellationToken, SharedInformerFactory};
use kube_client::config::{KubeConfigOptions, Kubeconfig};
use kube_client::{Client, Config};
use tracing::{error, info};

#[derive(Parser)]
#[command(
    name = "kinformer",
    version,
    about = "Kubernetes controllers built on kinformer"
)]
struct Cli {
    /// Path of the kubeconfig (default: $KUBECONFIG, ~/.kube/config, then in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use (default: the current context).
    #[arg(long, global = true)]
    context: Option<String>,
    /// Namespace to watch.
    #[arg(long, short = 'n', global = true, default_value = "default")]
    namespace: String,
    /// Watch every namespace instead of --namespace.
    #[arg(long, short = 'A', global = true)]
    all_namespaces: bool,
    /// Concurrent reconciles.
    #[arg(long, global = true, default_value_t = 2)]
    workers: usize,
    /// Retries of a failing key before it is dropped.
    #[arg(long, global = true, default_value_t = 5)]
    max_retries: u32,
    /// Reconcile only while holding a coordination.k8s.io Lease.
    #[arg(long, global = true)]
    leader_elect: bool,
    /// Name of the Lease (default: `kinformer-<controller>`).
    #[arg(long, global = true, visible_alias = "leader-election-id")]
    lease_name: Option<String>,
    /// Namespace of the Leases, the election's and --shard-ring's (default:
    /// the pod's own namespace in-cluster, else --namespace, or "default"
    /// with --all-namespaces).
    #[arg(long, global = true, alias = "lease-namespace")]
    leader_election_namespace: Option<String>,
    /// Serve /metrics on this address ("0" disables it; ":8080" is every interface).
    #[arg(long, global = true, alias = "metrics-addr", default_value = ":8080")]
    metrics_bind_address: BindAddress,
    /// Serve /healthz, /livez and /readyz on this address ("0" disables
    /// them; the metrics address serves all four on one listener).
    #[arg(long, global = true, default_value = ":8081")]
    health_probe_bind_address: BindAddress,
    /// Log level (error, warn, info, debug, trace, or a RUST_LOG-style
    /// filter); default: $RUST_LOG, else info.
    #[arg(long, global = true)]
    log_level: Option<String>,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Exit on the first panic in a reconcile instead of recovering.
    #[arg(long, global = true)]
    fatal_panics: bool,
    /// Shard the controller over the replicas of this ring (their Leases
    /// are `<ring>-member-*` and `<ring>-slot-*`); each replica reconciles,
    /// lists and watches only the slots it holds. Not with --leader-elect.
    #[arg(long, global = true)]
    shard_ring: Option<String>,
    /// How many slots cut the hash space of --shard-ring (the same for
    /// every replica).
    #[arg(long, global = true, default_value_t = 16)]
    shard_slots: u32,
    /// This replica's name in leader election and rings (default: host,
    /// process id and a random suffix).
    #[arg(long, global = true)]
    identity: Option<String>,
    /// Print the least-privilege RBAC this controller needs with these
    /// flags (a ServiceAccount `kinformer-<controller>`, its Roles or
    /// ClusterRole and bindings, as a JSON List for `kubectl apply -f -`)
    /// and exit, without connecting to a cluster.
    #[arg(long, global = true)]
    print_rbac: bool,
    /// The namespace of --print-rbac's ServiceAccount (default: the Lease's
    /// namespace).
    #[arg(long, global = true)]
    service_account_namespace: Option<String>,
    /// Print what --print-rbac prints and a Deployment running this
    /// controller with these flags as that ServiceAccount (two replicas
    /// with --leader-elect, else one; probes, metrics port, resource
    /// requests, non-root), then exit without connecting to a cluster.
    #[arg(long, global = true, conflicts_with = "print_rbac")]
    print_manifests: bool,
    /// The container image of --print-manifests' Deployment.
    #[arg(long, global = true, default_value = concat!("kinformer:", env!("CARGO_PKG_VERSION")))]
    image: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Clone, Copy)]
enum Command {
    /// Print every Pod add, update and delete.
    PodStdout,
    /// Set each annotated Service's `app` selector from its kinformer.dev/strategy annotation.
    ServiceStrategy,
}

impl Command {
    fn name(self) -> &'static str {
        match self {
            Command::PodStdout => "pod-stdout",
            Command::ServiceStrategy => "service-strategy",
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_logging(cli.log_format, cli.log_level.as_deref()) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the Tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(cli));
    // A reconcile that blocks its thread must not keep the process alive.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat, level: Option<&str>) -> Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = match level {
        Some(level) => EnvFilter::try_new(level)
            .map_err(|e| anyhow!("--log-level {level:?} is not a level or filter: {e}"))?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(false).init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}

async fn client(cli: &Cli) -> Result<Client> {
    let config = match (&cli.kubeconfig, &cli.context) {
        (None, None) => Config::infer().await.map_err(|e| {
            anyhow!("no usable cluster configuration ({e}); looked at $KUBECONFIG, ~/.kube/config and the in-cluster service account; pass --kubeconfig")
        })?,
        (path, context) => {
            let kubeconfig = match path {
                Some(p) => Kubeconfig::read_from(p).with_context(|| format!("cannot use kubeconfig {}", p.display()))?,
                None => Kubeconfig::read().context("cannot read the default kubeconfig")?,
            };
            let options = KubeConfigOptions {
                context: context.clone(),
                ..KubeConfigOptions::default()
            };
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .context("the kubeconfig is not usable")?
        }
    };
    let url = config.cluster_url.clone();
    let client =
        Client::try_from(config).with_context(|| format!("cannot build a client for {url}"))?;
    match tokio::time::timeout(Duration::from_secs(10), client.apiserver_version()).await {
        Err(_) => bail!("the API server at {url} did not answer within 10 s"),
        Ok(Err(kube_client::Error::Api(s))) if s.code == 401 => {
            bail!(
                "the API server at {url} rejected the credentials (401 Unauthorized): {}",
                s.message
            )
        }
        Ok(Err(kube_client::Error::Api(s))) if s.code == 403 => {
            bail!(
                "the API server at {url} forbids this user (403 Forbidden): {}",
                s.message
            )
        }
        Ok(Err(e)) => bail!("cannot reach the API server at {url}: {e}"),
        Ok(Ok(v)) => info!(server = %url, version = %v.git_version, "connected"),
    }
    Ok(client)
}

async fn run(cli: Cli) -> Result<()> {
    let offline = cli.print_rbac || cli.print_manifests;
    let client = if offline {
        // Never used: the rules come from what is built, not from a server.
        let config = Config::new("https://kubernetes.invalid".parse()?);
        Client::try_from(config).context("building an offline client")?
    } else {
        client(&cli).await?
    };
    let shutdown = CancellationToken::new();
    shutdown_on_signal(shutdown.clone()).context("installing the signal handlers")?;

    let name = cli.command.name();
    let namespace = (!cli.all_namespaces).then_some(cli.namespace.as_str());
    let mut manager_options = ManagerOptions::new();
    manager_options.metrics_bind_address = cli.metrics_bind_address.socket_addr();
    manager_options.health_probe_bind_address = cli.health_probe_bind_address.socket_addr();
    // Printed manifests name where they will run, not where they are printed.
    let pod_namespace = || {
        (!offline)
            .then(LeaderElectionConfig::pod_namespace)
            .flatten()
    };
    let lease_ns = cli
        .leader_election_namespace
        .clone()
        .or_else(pod_namespace)
        .unwrap_or_else(|| namespace.unwrap_or("default").to_owned());
    let identity = cli
        .identity
        .clone()
        .unwrap_or_else(LeaderElectionConfig::default_identity);
    if cli.leader_elect && cli.shard_ring.is_some() {
        bail!(
            "--leader-elect and --shard-ring exclude each other: one active replica, or all of them each on its slots"
        );
    }
    if cli.leader_elect {
        let lease = cli
            .lease_name
            .clone()
            .unwrap_or_else(|| format!("kinformer-{name}"));
        manager_options.leader_election = Some(
            LeaderElectionConfig::new(&lease)
                .namespace(&lease_ns)
                .identity(&identity),
        );
    }
    let mut factory = SharedInformerFactory::new(client.clone());
    if let Some(ns) = namespace {
        factory = factory.namespace(ns);
    }
    let mut manager = Manager::with_factory(factory, client.clone(), manager_options)?;

    info!(
        controller = name,
        namespace = namespace.unwrap_or("<all>"),
        workers = cli.workers,
        "starting"
    );
    let ring = match &cli.shard_ring {
        Some(ring) => {
            let mut config = RingConfig::new(&lease_ns, ring, &identity);
            config.slots = cli.shard_slots;
            let ring = Ring::new(client.clone(), config)?;
            ring.register_metrics(manager.metrics());
            info!(ring = %ring.config().ring, slots = cli.shard_slots, identity = %identity, "sharded");
            Some(ring)
        }
        None => None,
    };
    match cli.command {
        Command::PodStdout => {
            let mut builder = manager
                .controller::<Pod>(name)
                .options(options(&cli, &manager));
            if let Some(ring) = &ring {
                builder = builder.sharded(Arc::clone(ring));
            }
            let lister = builder.informer().lister();
            manager.add(builder.reconciler(pod_stdout::PodStdout::new(lister))?);
        }
        Command::ServiceStrategy => {
            let mut builder = manager
                .controller::<Service>(name)
                .options(options(&cli, &manager))
                .with_event_filter(service_strategy::event_filter);
            if let Some(ring) = &ring {
                builder = builder.sharded(Arc::clone(ring));
            }
            let lister = builder.informer().lister();
            // The Manager's client: its writes are awaited before a reconcile reads.
            let writer = manager.client();
            let builder = builder
                .writes::<Service>(&["update"])
                .writes::<CoreEvent>(&["create"]);
            manager
                .add(builder.reconciler(service_strategy::ServiceStrategy::new(lister, writer))?);
        }
    }
    if offline {
        let account = format!("kinformer-{name}");
        let account_namespace = cli
            .service_account_namespace
            .as_deref()
            .unwrap_or(&lease_ns);
        let mut manifests = manager
            .permissions()
            .manifests(&account, account_namespace, &account);
        if cli.print_manifests {
            let items = manifests["items"]
                .as_array_mut()
                .context("manifests without items")?;
            items.push(deployment(&cli, &account, account_namespace, &lease_ns));
        }
        println!("{}", serde_json::to_string_pretty(&manifests)?);
        return Ok(());
    }
    manager.run(shutdown).await?;
    info!("stopped cleanly");
    Ok(())
}

/// The Deployment of --print-manifests: this controller with the flags it
/// was given, as the ServiceAccount `account` of `namespace`, its Leases
/// in `lease_ns`.
fn deployment(cli: &Cli, account: &str, namespace: &str, lease_ns: &str) -> serde_json::Value {
    let mut args = vec![cli.command.name().to_owned()];
    match cli.all_namespaces {
        true => args.push("--all-namespaces".into()),
        false => args.extend(["--namespace".into(), cli.namespace.clone()]),
    }
    if cli.leader_elect {
        args.push("--leader-elect".into());
        if let Some(lease) = &cli.lease_name {
            args.extend(["--lease-name".into(), lease.clone()]);
        }
    }
    if let Some(ring) = &cli.shard_ring {
        args.extend([
            "--shard-ring".into(),
            ring.clone(),
            "--shard-slots".into(),
            cli.shard_slots.to_string(),
        ]);
    }
    if cli.leader_elect || cli.shard_ring.is_some() {
        // Where the Role for its Leases is: without the flag the pod
        // would take its own namespace, `namespace`, which may differ.
        args.extend(["--leader-election-namespace".into(), lease_ns.to_owned()]);
    }
    if cli.fatal_panics {
        args.push("--fatal-panics".into());
    }
    args.extend([
        "--workers".into(),
        cli.workers.to_string(),
        "--max-retries".into(),
        cli.max_retries.to_string(),
        "--metrics-bind-address".into(),
        ":8080".into(),
        "--health-probe-bind-address".into(),
        ":8081".into(),
        "--log-format".into(),
        "json".into(),
    ]);
    let labels = serde_json::json!({"app.kubernetes.io/name": account});
    let probe = |path: &str| serde_json::json!({"httpGet": {"path": path, "port": "health"}, "periodSeconds": 10});
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": account, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": if cli.leader_elect { 2 } else { 1 },
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": account,
                    "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "terminationGracePeriodSeconds": 30,
                    "containers": [{
                        "name": "controller",
                        "image": cli.image,
                        "args": args,
                        "ports": [
                            {"name": "metrics", "containerPort": 8080},
                            {"name": "health", "containerPort": 8081},
                        ],
                        "livenessProbe": probe("/healthz"),
                        "readinessProbe": probe("/readyz"),
                        "resources": {
                            "requests": {"cpu": "10m", "memory": "64Mi"},
                            "limits": {"memory": "256Mi"},
                        },
                        "securityContext": {
                            "runAsNonRoot": true,
                            "runAsUser": 65532,
                            "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }],
                },
            },
        },
    })
}

fn options<K>(cli: &Cli, manager: &Manager) -> ControllerOptions<K> {
    manager
        .controller_options()
        .workers(cli.workers)
        .max_retries(cli.max_retries)
        .panic_policy(if cli.fatal_panics {
            PanicPolicy::Crash
        } else {
            PanicPolicy::Recover
        })
}
