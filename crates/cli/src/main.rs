//! `kinformer`: runs the pod-stdout or service-strategy controller against a
//! cluster (kubeconfig, context or in-cluster configuration).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::{Pod, Service};
use kinformer_controllers::{
    Controller, ControllerOptions, LeaderElectionConfig, LeaderElector, Metrics, PanicPolicy,
    pod_stdout, service_strategy,
};
use kinformer_informer::{
    ApiListerWatcher, CancellationToken, InformerOptions, SharedIndexInformer, strip_managed_fields,
};
use kinformer_store::namespace_indexers;
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
    #[arg(long, global = true)]
    lease_name: Option<String>,
    /// Namespace of the Lease (default: --namespace, or "default" with --all-namespaces).
    #[arg(long, global = true)]
    lease_namespace: Option<String>,
    /// Serve /metrics, /healthz and /readyz on this address (for example 127.0.0.1:8080).
    #[arg(long, global = true)]
    metrics_addr: Option<SocketAddr>,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Exit on the first panic in a reconcile instead of recovering.
    #[arg(long, global = true)]
    fatal_panics: bool,
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
    init_logging(cli.log_format);
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

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(false).init(),
        LogFormat::Json => builder.json().init(),
    }
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

fn identity() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".into());
    format!("{host}_{}_{:08x}", std::process::id(), fastrand::u32(..))
}

async fn run(cli: Cli) -> Result<()> {
    let client = client(&cli).await?;
    let shutdown = CancellationToken::new();
    {
        let shutdown = shutdown.clone();
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        tokio::spawn(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            info!("signal received; shutting down (a second signal exits at once)");
            shutdown.cancel();
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            error!("second signal received; exiting now without finishing the drain");
            eprintln!("error: second signal received; exiting now without finishing the drain");
            std::process::exit(130);
        });
    }

    let name = cli.command.name();
    let metrics = Metrics::new();
    // Probes keep answering (503 once stopping) until the process exits.
    let serving = CancellationToken::new();
    let _stop_serving = serving.clone().drop_guard();
    if let Some(addr) = cli.metrics_addr {
        metrics
            .serve(addr, serving.clone())
            .await
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
    }
    let namespace = (!cli.all_namespaces).then_some(cli.namespace.as_str());
    let elector = cli.leader_elect.then(|| {
        let lease_ns = cli
            .lease_namespace
            .clone()
            .unwrap_or_else(|| namespace.unwrap_or("default").to_owned());
        let lease = cli
            .lease_name
            .clone()
            .unwrap_or_else(|| format!("kinformer-{name}"));
        Arc::new(LeaderElector::new(
            client.clone(),
            LeaderElectionConfig::new(&lease_ns, &lease, &identity()),
        ))
    });

    info!(
        controller = name,
        namespace = namespace.unwrap_or("<all>"),
        workers = cli.workers,
        "starting"
    );
    match cli.command {
        Command::PodStdout => {
            let informer = informer::<Pod>(&client, namespace)?;
            let reconciler = pod_stdout::PodStdout::new(informer.lister());
            Controller::new(
                name,
                informer,
                reconciler,
                options(&cli, &metrics, &elector),
            )?
            .run(shutdown)
            .await?;
        }
        Command::ServiceStrategy => {
            let informer = informer::<Service>(&client, namespace)?;
            let reconciler =
                service_strategy::ServiceStrategy::new(informer.lister(), client.clone());
            let options =
                options(&cli, &metrics, &elector).event_filter(service_strategy::event_filter);
            Controller::new(name, informer, reconciler, options)?
                .run(shutdown)
                .await?;
        }
    }
    info!("stopped cleanly");
    Ok(())
}

fn options<K>(
    cli: &Cli,
    metrics: &Arc<Metrics>,
    elector: &Option<Arc<LeaderElector>>,
) -> ControllerOptions<K> {
    let mut o = ControllerOptions::new()
        .workers(cli.workers)
        .max_retries(cli.max_retries)
        .metrics(Arc::clone(metrics))
        .panic_policy(if cli.fatal_panics {
            PanicPolicy::Crash
        } else {
            PanicPolicy::Recover
        });
    if let Some(e) = elector {
        o = o.leader_election(Arc::clone(e));
    }
    o
}

fn informer<K>(client: &Client, namespace: Option<&str>) -> Result<SharedIndexInformer<K>>
where
    K: kube_client::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let informer = SharedIndexInformer::new(
        ApiListerWatcher::<K>::new(client.clone(), namespace).drop_managed_fields(),
        InformerOptions::new().indexers(namespace_indexers()),
    );
    informer.set_transform(strip_managed_fields)?;
    Ok(informer)
}
