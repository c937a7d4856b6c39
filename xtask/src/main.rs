//! Project tasks: `cargo xtask test`, `cargo xtask envtest ...`, `cargo xtask demo`,
//! `cargo xtask proto-schema`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use kinformer_envtest::{Binaries, KUBERNETES_VERSION, TestEnv};

mod bench;
mod demo;
mod demo_sharding;
mod soak;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "kinformer's project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Builds the test control plane if needed, then runs every test of the
    /// workspace, and the informer's tests once more on a RealFifo, then the
    /// queues' model checks (loom).
    Test {
        /// Extra arguments for `cargo test` (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// The real control plane (kube-apiserver + etcd) used by tests and the demo.
    Envtest {
        #[command(subcommand)]
        command: EnvtestCommand,
    },
    /// Benchmarks kinformer side by side with client-go and kube-runtime; writes docs/benchmarks.md.
    Bench {
        /// A shorter run (about 5 minutes): fewer rounds, 10 000 pods only, 15 s of latency.
        #[arg(long)]
        quick: bool,
        /// Only the sharded informers: N = 1, 2, 4 replicas with server-side sharding, client-side filtering and none.
        #[arg(long)]
        sharding: bool,
        /// Only the out-of-the-box sync rows, 10 000 and 50 000 pods, with more rounds and the server's own floor.
        #[arg(long, conflicts_with = "sharding")]
        defaults: bool,
        /// Only whole controllers: the stale-read rows (see --stale-reads), then configmap-hash in kinformer, controller-runtime and kube-runtime converging 10 000 Deployments, under churn, and failing over with 50 000 (about 30 minutes; --quick: 10).
        #[arg(long, conflicts_with_all = ["sharding", "defaults"])]
        controllers: bool,
        /// Only the stale-read rows of --controllers: child-per-parent with watch answers 1 s behind its writes, in kinformer (read-your-writes on and off), controller-runtime (with and without EnableReadYourWritesConsistency) and kube-runtime (about 10 minutes; --quick: 3).
        #[arg(long, conflicts_with_all = ["sharding", "defaults", "controllers"])]
        stale_reads: bool,
        /// Only the webhook rows: the Website example's validating, defaulting and conversion webhooks in kinformer, controller-runtime and kube-runtime, called by the same API server (create latency p50/p99, a 10 000-object list converted; about 10 minutes; --quick: 2).
        #[arg(long, conflicts_with_all = ["sharding", "defaults", "controllers", "stale_reads"])]
        webhooks: bool,
        /// Only the optional-CRD row: a Manager's RSS waiting for its CRD, caching 10 000 custom resources and after the CRD is deleted, and the time from the CRD established to the first reconcile (about 3 minutes; --quick: 1).
        #[arg(long, conflicts_with_all = ["sharding", "defaults", "controllers", "stale_reads", "webhooks"])]
        crds: bool,
    },
    /// Churn with a fault every 30 s, checking the informer never drifts; writes docs/reliability.md.
    Soak {
        /// How long to run.
        #[arg(long, default_value_t = 5)]
        minutes: u64,
    },
    /// Runs the controllers against a real control plane and shows what they do.
    Demo {
        /// Use this cluster instead of a local control plane (in a namespace of its own, deleted afterwards).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// The sharding part instead: pod-stdout over three replicas of a ring; one killed, one joining.
        #[arg(long)]
        sharding: bool,
    },
    /// Regenerates crates/protobuf/src/generated.rs from the Go types (xtask/proto-schema).
    ProtoSchema,
}

#[derive(Subcommand)]
enum EnvtestCommand {
    /// Builds kube-apiserver, kubectl and etcd from the pinned Go modules (cached).
    Build {
        /// Rebuild even if the binaries are cached.
        #[arg(long)]
        force: bool,
    },
    /// Starts a control plane and keeps it running until Ctrl-C or SIGTERM.
    Up {
        /// Where to write the admin kubeconfig (default: a file in the control plane's temp dir).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
    },
    /// Prints the directory holding the binaries.
    Path,
    /// Regenerates crates/envtest/go/kube/go.mod's replace block from k8s.io/kubernetes' own go.mod.
    Gomod,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.task {
        Task::Test { args } => test(&args),
        Task::Envtest { command } => match command {
            EnvtestCommand::Build { force } => {
                if force {
                    Binaries {
                        dir: Binaries::default_dir(),
                    }
                    .build()?;
                }
                let bins = Binaries::ensure()?;
                println!("{}", bins.dir.display());
                Ok(ExitCode::SUCCESS)
            }
            EnvtestCommand::Up { kubeconfig } => runtime()?.block_on(envtest_up(kubeconfig)),
            EnvtestCommand::Path => {
                println!("{}", Binaries::default_dir().display());
                Ok(ExitCode::SUCCESS)
            }
            EnvtestCommand::Gomod => gomod(),
        },
        Task::Bench {
            quick,
            sharding,
            defaults,
            controllers,
            stale_reads,
            webhooks,
            crds,
        } => {
            let root = workspace_root();
            if sharding {
                runtime()?.block_on(bench::run_sharding(quick, &root))?;
            } else if defaults {
                runtime()?.block_on(bench::run_defaults(quick, &root))?;
            } else if crds {
                runtime()?.block_on(bench::run_crds(quick, &root))?;
            } else if webhooks {
                runtime()?.block_on(bench::run_webhooks(quick, &root))?;
            } else if stale_reads {
                runtime()?.block_on(bench::run_stale_reads(quick, &root))?;
            } else if controllers {
                runtime()?.block_on(bench::run_controllers(quick, &root))?;
            } else {
                runtime()?.block_on(bench::run(quick, &root))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Task::Soak { minutes } => {
            runtime()?.block_on(soak::run(minutes, &workspace_root()))?;
            Ok(ExitCode::SUCCESS)
        }
        Task::Demo {
            kubeconfig,
            sharding,
        } => {
            let root = workspace_root();
            match sharding {
                true => runtime()?.block_on(demo::run(kubeconfig, &root, demo_sharding::scenario)),
                false => runtime()?.block_on(demo::run(kubeconfig, &root, demo::scenario)),
            }?;
            println!("\ndemo finished");
            Ok(ExitCode::SUCCESS)
        }
        Task::ProtoSchema => proto_schema(),
    }
}

/// Runs xtask/proto-schema (`go run .`), which writes the protobuf schema
/// table by reflection over the pinned k8s.io Go types, then rustfmt on it.
fn proto_schema() -> Result<ExitCode> {
    let root = workspace_root();
    let out = root.join("crates/protobuf/src/generated.rs");
    let status = Command::new("go")
        .current_dir(root.join("xtask/proto-schema"))
        .env("GOFLAGS", "-buildvcs=false")
        .env("GOTOOLCHAIN", "local")
        .args(["run", ".", "-o"])
        .arg(&out)
        .status()
        .context("running `go run` in xtask/proto-schema (is Go installed?)")?;
    if !status.success() {
        bail!("xtask/proto-schema failed");
    }
    let status = Command::new("rustfmt")
        .args(["--edition", "2024"])
        .arg(&out)
        .status()
        .context("running rustfmt")?;
    if !status.success() {
        bail!("rustfmt {} failed", out.display());
    }
    println!("{}", out.display());
    Ok(ExitCode::SUCCESS)
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the Tokio runtime")
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_owned)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn test(args: &[String]) -> Result<ExitCode> {
    let bins = Binaries::ensure().context("building the test control plane")?;
    eprintln!("xtask: control plane binaries in {}", bins.dir.display());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .current_dir(workspace_root())
        .args(["test", "--workspace"])
        .args(args)
        .status()
        .context("running cargo test")?;
    if !status.success() {
        return Ok(ExitCode::FAILURE);
    }
    // The informer's tests again on the queues other than the default
    // atomic one (see tests/common), the plain RealFifo with a compact
    // cache; the default queue with a compact cache.
    for (fifo, cache) in [
        ("delta", "whole"),
        ("real", "compact"),
        ("atomic", "compact"),
    ] {
        eprintln!("xtask: the informer tests again, on the {fifo} queue with a {cache} cache");
        let status = Command::new(&cargo)
            .current_dir(workspace_root())
            .args(["test", "-p", "kinformer-informer", "--tests"])
            .env("KINFORMER_TEST_FIFO", fifo)
            .env("KINFORMER_TEST_CACHE", cache)
            .args(args)
            .status()
            .with_context(|| format!("running cargo test on the {fifo} queue"))?;
        if !status.success() {
            return Ok(ExitCode::FAILURE);
        }
    }
    model_checks(&cargo)
}

/// The model checks of the work queue's and the fifos' synchronisation
/// (loom: every interleaving of a few threads; each crate's tests/model.rs).
/// `--cfg loom` builds in a target dir of its own, so the normal build is
/// left alone; loom and the queues are optimised, the rest (k8s-openapi)
/// not: a cold build in about 2 minutes, the models in seconds.
fn model_checks(cargo: &str) -> Result<ExitCode> {
    eprintln!("xtask: the model checks of the work queue and the fifos (loom)");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
        .join("loom");
    let mut command = Command::new(cargo);
    command.current_dir(workspace_root());
    command.args(["test", "-p", "kinformer-workqueue", "-p", "kinformer-fifo"]);
    command.args(["--test", "model"]);
    for package in ["loom", "generator", "kinformer-workqueue", "kinformer-fifo"] {
        command.arg("--config");
        command.arg(format!("profile.dev.package.{package}.opt-level=3"));
    }
    let status = command
        .env("CARGO_TARGET_DIR", target)
        .env("RUSTFLAGS", "--cfg loom")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .context("running the model checks")?;
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn envtest_up(kubeconfig: Option<PathBuf>) -> Result<ExitCode> {
    eprintln!("envtest: starting etcd and kube-apiserver {KUBERNETES_VERSION} on loopback...");
    let started = std::time::Instant::now();
    let env = TestEnv::start().await?;
    let path = match kubeconfig {
        Some(path) => {
            std::fs::copy(env.kubeconfig_path(), &path)
                .with_context(|| format!("writing the kubeconfig to {}", path.display()))?;
            path
        }
        None => env.kubeconfig_path().to_owned(),
    };
    let (etcd_pid, api_pid) = env.pids();
    println!("export KUBECONFIG={}", path.display());
    if let Some(bin) = env.binaries().kubectl().parent() {
        println!(
            "export PATH={}:\"$PATH\"  # kubectl {KUBERNETES_VERSION}",
            bin.display()
        );
    }
    println!(
        "envtest ready in {:.1} s: kube-apiserver {} at {} (pid {}), etcd at http://127.0.0.1:{} (pid {}), {}; Ctrl-C to stop",
        started.elapsed().as_secs_f64(),
        KUBERNETES_VERSION,
        env.server_url(),
        api_pid.unwrap_or_default(),
        env.etcd_port(),
        etcd_pid.unwrap_or_default(),
        if env.has_controller_manager() {
            "kube-controller-manager (garbage collector, namespace controller)"
        } else {
            "no kube-controller-manager (nothing collects garbage or removes deleted namespaces)"
        },
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    let (etcd_peak, api_peak) = env.peak_memory_bytes();
    eprintln!(
        "envtest: stopping (peak memory: etcd {} MiB, kube-apiserver {} MiB)",
        etcd_peak.unwrap_or_default() >> 20,
        api_peak.unwrap_or_default() >> 20
    );
    env.stop();
    Ok(ExitCode::SUCCESS)
}

/// Rewrites the replace block of the kube wrapper module from the
/// `./staging` replaces in k8s.io/kubernetes' own go.mod.
fn gomod() -> Result<ExitCode> {
    let module_dir = workspace_root().join("crates/envtest/go/kube");
    let version = KUBERNETES_VERSION;
    let staging = format!("v0.{}", version.trim_start_matches("v1."));
    let out = Command::new("go")
        .current_dir(&module_dir)
        .env("GOTOOLCHAIN", "local")
        .args([
            "mod",
            "download",
            "-json",
            &format!("k8s.io/kubernetes@{version}"),
        ])
        .output()
        .context("running `go mod download` (is Go installed?)")?;
    if !out.status.success() {
        bail!(
            "go mod download k8s.io/kubernetes@{version} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let json = String::from_utf8_lossy(&out.stdout);
    let gomod_path = json
        .lines()
        .find_map(|l| l.trim().strip_prefix("\"GoMod\": \""))
        .and_then(|l| l.strip_suffix("\","))
        .context("no GoMod in `go mod download -json` output")?;
    let upstream =
        std::fs::read_to_string(gomod_path).with_context(|| format!("reading {gomod_path}"))?;
    let replaces: Vec<String> = upstream
        .lines()
        .filter(|l| l.contains("=> ./staging/"))
        .filter_map(|l| l.split_whitespace().next())
        .map(|m| format!("\t{m} => {m} {staging}"))
        .collect();
    if replaces.is_empty() {
        bail!("no ./staging replaces found in {gomod_path}");
    }
    let path = module_dir.join("go.mod");
    let current =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let start = current
        .find("replace (")
        .context("go.mod has no replace block")?;
    let end = current[start..]
        .find("\n)")
        .map(|i| start + i + 2)
        .context("unterminated replace block")?;
    let updated = format!(
        "{}replace (\n{}\n){}",
        &current[..start],
        replaces.join("\n"),
        &current[end..]
    );
    std::fs::write(&path, updated).with_context(|| format!("writing {}", path.display()))?;
    println!(
        "{}: {} replace lines for {version}",
        path.display(),
        replaces.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// Field `field` (`VmRSS:` now, `VmHWM:` the peak) of
/// `/proc/{process}/status`, in MiB; `process` is a pid or `self`.
fn status_mib(process: &str, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{process}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}
