//! `TestEnv`: one etcd and one kube-apiserver on loopback.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube_client::api::{Api, ObjectMeta, PostParams};
use kube_client::config::{KubeConfigOptions, Kubeconfig};
use kube_client::{Client, Config};
use tokio::sync::OnceCell;

use crate::certs::Pki;
use crate::process::Process;
use crate::{Binaries, EnvtestError, TestNamespace, etcd};

/// How a [`TestEnv`] is started. Defaults: build the binaries if missing,
/// 90 s to become ready, no extra kube-apiserver flags.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TestEnvOptions {
    build_if_missing: bool,
    ready_timeout: Duration,
    apiserver_args: Vec<String>,
    feature_gates: Vec<(String, bool)>,
    controller_manager: bool,
}

impl Default for TestEnvOptions {
    fn default() -> Self {
        Self {
            build_if_missing: true,
            ready_timeout: Duration::from_secs(90),
            apiserver_args: Vec::new(),
            feature_gates: Vec::new(),
            controller_manager: true,
        }
    }
}

impl TestEnvOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fails with [`EnvtestError::NotBuilt`] instead of building missing binaries.
    #[must_use]
    pub fn no_build(mut self) -> Self {
        self.build_if_missing = false;
        self
    }

    /// How long etcd and then kube-apiserver may take to become ready.
    #[must_use]
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Serves every list and watch from etcd (`--watch-cache=false`), so an
    /// etcd compaction turns old resource versions and continue tokens into
    /// 410 Gone at once, as a server whose watch cache has moved on would.
    #[must_use]
    pub fn without_watch_cache(self) -> Self {
        self.apiserver_arg("--watch-cache=false")
    }

    /// An extra kube-apiserver flag (`--name=value`); later flags win.
    #[must_use]
    pub fn apiserver_arg(mut self, arg: impl Into<String>) -> Self {
        self.apiserver_args.push(arg.into());
        self
    }

    /// Turns a kube-apiserver feature gate on or off. The gates given this
    /// way go into one `--feature-gates` flag, before the flags of
    /// [`apiserver_arg`](Self::apiserver_arg) (so a `--feature-gates` given
    /// there replaces them).
    #[must_use]
    pub fn feature_gate(mut self, gate: impl Into<String>, enabled: bool) -> Self {
        self.feature_gates.push((gate.into(), enabled));
        self
    }

    /// No kube-controller-manager: nothing collects garbage and a deleted
    /// namespace stays Terminating (controller-runtime's envtest), for a
    /// test that must see objects whose owners are gone, or a bench that
    /// wants the server alone.
    #[must_use]
    pub fn without_controller_manager(mut self) -> Self {
        self.controller_manager = false;
        self
    }

    /// Server-side sharded list and watch (`ShardedListAndWatch`, KEP-5866,
    /// alpha and off by default in v1.37): `shardSelector` is applied and
    /// echoed in `ListMeta.shardInfo`.
    #[must_use]
    pub fn sharded_list_and_watch(self) -> Self {
        self.feature_gate("ShardedListAndWatch", true)
    }
}

/// A running control plane: etcd and kube-apiserver on free loopback ports,
/// with an admin kubeconfig, and kube-controller-manager running only the
/// garbage collector and the namespace controller.
///
/// Those two, because a controller's tests need them and nothing else
/// here would do their work: owned objects are collected when their owner
/// goes (background and foreground deletion, `blockOwnerDeletion`), and a
/// deleted namespace is emptied and removed, so a test can delete what it
/// made. Not the others: with no kubelet nor nodes, the workload
/// controllers would make Pods nothing runs, and the ServiceAccount and
/// root-CA publishers would add a `default` ServiceAccount and a
/// `kube-root-ca.crt` ConfigMap to every namespace, objects a test does
/// not expect among its own. The garbage collector learns new kinds (a
/// CRD installed by a test) when it reads discovery again, every 30 s, so
/// children of a custom resource may wait that long to be collected.
/// [`TestEnvOptions::without_controller_manager`] leaves it out; so does a
/// binary directory without it (setup-envtest's).
///
/// The server authorizes by RBAC and admits with its default plugins,
/// less `ServiceAccount` (no controller manager makes each namespace's
/// `default` account for its pods), plus
/// `OwnerReferencesPermissionEnforcement` (on in OpenShift): setting
/// `blockOwnerDeletion` takes `update` of the owner's `finalizers`, and
/// adding an ownerReference to an existing object `delete` of it.
///
/// Dropping it (or [`stop`](Self::stop)) sends SIGTERM, then SIGKILL, to both
/// and removes their directory. Child processes also die with the process
/// that started them, however it ends.
pub struct TestEnv {
    // Field order is drop order: the controllers, then the server before
    // its store, files last.
    controller_manager: Option<Process>,
    apiserver: Option<Process>,
    etcd: Option<Process>,
    apiserver_cmd: Vec<String>,
    bins: Binaries,
    config: Config,
    kubeconfig: PathBuf,
    api_port: u16,
    etcd_port: u16,
    ready_timeout: Duration,
    /// Deletes the namespaces of [`create_namespace`](Self::create_namespace)
    /// as their tests drop them; started with the first.
    namespace_deleter: Mutex<Option<std::sync::mpsc::Sender<String>>>,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv")
            .field("server", &self.server_url())
            .field("etcd_port", &self.etcd_port)
            .field("dir", &self.dir.path())
            .finish()
    }
}

static SHARED: OnceCell<&'static TestEnv> = OnceCell::const_new();
/// Process groups and directories of the control planes kept until the
/// process exits ([`TestEnv::into_static`]), for the exit hook.
static KEPT: Mutex<Vec<(Vec<u32>, PathBuf)>> = Mutex::new(Vec::new());
static EXIT_HOOK: std::sync::Once = std::sync::Once::new();

/// The directory prefix of every control plane, in the temporary directory.
const DIR_PREFIX: &str = "kinformer-envtest-";
/// The file in a control plane's directory naming the process that made it.
const OWNER_FILE: &str = "owner.pid";

/// What failed when the envtest kubeconfig did not make a client.
const CLIENT: &str = "building a client from the envtest kubeconfig failed";

extern "C" fn cleanup_kept_at_exit() {
    let Ok(entries) = KEPT.lock() else {
        return;
    };
    for (pids, dir) in entries.iter() {
        for &pid in pids {
            #[allow(unsafe_code)]
            // SAFETY: plain syscalls on a process group this process
            // created (each server leads its own), then on the child it
            // reaps: its files are removed only once it is gone, so that
            // a dying etcd writes nothing into a removed directory.
            // waitpid(2) accepts a null status pointer.
            unsafe {
                libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
                libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
            }
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Removes the directories of control planes whose process is gone: one
/// killed (SIGKILL, a timeout) has no chance to remove its own, and each
/// holds an etcd of about 125 MiB. A directory whose owner is alive, or
/// that names none, is left alone.
fn sweep_abandoned_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let owner = std::fs::read_to_string(entry.path().join(OWNER_FILE));
        let Some(pid) = owner.ok().and_then(|o| o.trim().parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl TestEnv {
    /// Starts a control plane with the default options.
    pub async fn start() -> Result<Self, EnvtestError> {
        Self::start_with(TestEnvOptions::default()).await
    }

    /// Starts a control plane. Ports are chosen free; if one is taken by the
    /// time a process binds it, the start is retried on new ports (twice).
    pub async fn start_with(options: TestEnvOptions) -> Result<Self, EnvtestError> {
        let bins = if options.build_if_missing {
            tokio::task::spawn_blocking(Binaries::ensure)
                .await
                .map_err(|e| EnvtestError::failed("the task building the binaries failed", e))??
        } else {
            Binaries::locate()?
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::start_once(&bins, &options).await {
                Err(EnvtestError::PortInUse { .. }) if attempt < 3 => continue,
                other => return other,
            }
        }
    }

    /// One control plane for the whole test process, started on first use.
    /// Tests sharing it should work in namespaces of their own
    /// ([`create_namespace`](Self::create_namespace)). It is torn down when
    /// the process exits.
    pub async fn shared() -> Result<&'static TestEnv, EnvtestError> {
        SHARED
            .get_or_try_init(|| async { Ok(Self::start().await?.into_static()) })
            .await
            .copied()
    }

    /// Keeps this control plane for the rest of the process (a test
    /// binary's own, with options [`shared`](Self::shared) does not take):
    /// it is torn down, directory and all, when the process exits. Put the
    /// reference in a `static` (a `OnceCell`); a `static` holding the
    /// `TestEnv` itself is never dropped, so its directory would stay.
    pub fn into_static(self) -> &'static TestEnv {
        let pids = [&self.controller_manager, &self.apiserver, &self.etcd]
            .into_iter()
            .flatten()
            .map(|p| p.pid())
            .collect();
        KEPT.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((pids, self.dir.path().to_owned()));
        EXIT_HOOK.call_once(|| {
            #[allow(unsafe_code)]
            // SAFETY: atexit(3) takes a plain `extern "C" fn()`, which
            // cannot unwind into libc (a panic in it aborts).
            unsafe {
                libc::atexit(cleanup_kept_at_exit);
            }
        });
        Box::leak(Box::new(self))
    }

    async fn start_once(bins: &Binaries, options: &TestEnvOptions) -> Result<Self, EnvtestError> {
        sweep_abandoned_dirs();
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .map_err(|e| EnvtestError::io("creating a temp dir in", std::env::temp_dir(), e))?;
        let owner = dir.path().join(OWNER_FILE);
        std::fs::write(&owner, std::process::id().to_string())
            .map_err(|e| EnvtestError::io("writing", owner.clone(), e))?;
        let [etcd_port, peer_port, api_port] = free_ports()?;
        let path = |name: &str| dir.path().join(name);
        let write = |name: &str, contents: &str| {
            std::fs::write(path(name), contents)
                .map_err(|e| EnvtestError::io("writing", path(name), e))
        };

        let pki = Pki::generate()?;
        write("ca.crt", &pki.ca_cert)?;
        write("serving.crt", &pki.serving_cert)?;
        write("serving.key", &pki.serving_key)?;
        write("admin.crt", &pki.admin_cert)?;
        write("admin.key", &pki.admin_key)?;
        write("sa.pub", &pki.sa_public_key)?;
        write("sa.key", &pki.sa_private_key)?;

        let etcd_args = vec![
            "--name=envtest".to_owned(),
            format!("--data-dir={}", path("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
            format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-cluster=envtest=http://127.0.0.1:{peer_port}"),
            "--unsafe-no-fsync=true".to_owned(),
            "--log-level=warn".to_owned(),
        ];
        let mut etcd = Process::spawn("etcd", &bins.etcd(), &etcd_args, path("etcd.log"))?;
        let deadline = Instant::now() + options.ready_timeout;
        wait_ready(
            &mut etcd,
            etcd_port,
            deadline,
            options.ready_timeout,
            || etcd::healthy(etcd_port),
        )
        .await?;

        let mut apiserver_cmd = vec![
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={api_port}"),
            format!("--cert-dir={}", path("apiserver-certs").display()),
            format!("--tls-cert-file={}", path("serving.crt").display()),
            format!("--tls-private-key-file={}", path("serving.key").display()),
            format!("--client-ca-file={}", path("ca.crt").display()),
            format!("--service-account-issuer=https://127.0.0.1:{api_port}"),
            format!("--service-account-key-file={}", path("sa.pub").display()),
            format!(
                "--service-account-signing-key-file={}",
                path("sa.key").display()
            ),
            "--service-cluster-ip-range=10.0.0.0/16".to_owned(),
            "--authorization-mode=RBAC".to_owned(),
            "--allow-privileged=true".to_owned(),
            "--disable-admission-plugins=ServiceAccount".to_owned(),
            // In addition to the defaults: OpenShift's, where setting an
            // ownerReference takes rights on the owner and the child.
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement".to_owned(),
            "--endpoint-reconciler-type=none".to_owned(),
            "--profiling=false".to_owned(),
        ];
        if !options.feature_gates.is_empty() {
            let gates: Vec<String> = options
                .feature_gates
                .iter()
                .map(|(gate, on)| format!("{gate}={on}"))
                .collect();
            apiserver_cmd.push(format!("--feature-gates={}", gates.join(",")));
        }
        apiserver_cmd.extend(options.apiserver_args.iter().cloned());

        let kubeconfig = path("kubeconfig");
        write("kubeconfig", &kubeconfig_yaml(api_port, &pki))?;
        let config = config_from_kubeconfig(&kubeconfig).await?;

        let mut env = Self {
            controller_manager: None,
            apiserver: None,
            etcd: Some(etcd),
            apiserver_cmd,
            bins: bins.clone(),
            config,
            kubeconfig,
            api_port,
            etcd_port,
            ready_timeout: options.ready_timeout,
            namespace_deleter: Mutex::new(None),
            dir,
        };
        env.start_apiserver().await?;
        if options.controller_manager && bins.kube_controller_manager().is_file() {
            env.start_controller_manager().await?;
        }
        Ok(env)
    }

    /// Starts kube-controller-manager with the garbage collector and the
    /// namespace controller (see [`TestEnv`]), and waits until it leads
    /// (its Lease `kube-system/kube-controller-manager` names it): it then
    /// runs its controllers.
    async fn start_controller_manager(&mut self) -> Result<(), EnvtestError> {
        let args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            "--controllers=garbage-collector-controller,namespace-controller".to_owned(),
            // No HTTPS endpoint: nothing here reads its metrics or probes.
            "--secure-port=0".to_owned(),
            "--use-service-account-credentials=false".to_owned(),
            // Its Lease says it runs (see the probe below); these times
            // let it ride out a kube-apiserver stopped and started again
            // for up to a minute (`restart_apiserver`), where the defaults'
            // 10 s would make it lose the lease and exit.
            "--leader-elect-lease-duration=75s".to_owned(),
            "--leader-elect-renew-deadline=60s".to_owned(),
            "--profiling=false".to_owned(),
        ];
        let log = self.dir.path().join("kube-controller-manager.log");
        let mut process = Process::spawn(
            "kube-controller-manager",
            &self.bins.kube_controller_manager(),
            &args,
            log,
        )?;
        let client = self.client()?;
        let probe = || {
            let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
            async move {
                let lease = leases
                    .get_opt("kube-controller-manager")
                    .await
                    .map_err(|e| e.to_string())?;
                match lease.and_then(|l| l.spec).and_then(|s| s.holder_identity) {
                    Some(_) => Ok(()),
                    None => Err("kube-controller-manager does not lead yet".to_owned()),
                }
            }
        };
        let deadline = Instant::now() + self.ready_timeout;
        wait_ready(&mut process, 0, deadline, self.ready_timeout, probe).await?;
        self.controller_manager = Some(process);
        Ok(())
    }

    /// Whether kube-controller-manager was started (see [`TestEnv`]).
    pub fn has_controller_manager(&self) -> bool {
        self.controller_manager.is_some()
    }

    /// Starts kube-apiserver (again) and waits until it is ready and the
    /// `default` namespace exists.
    pub async fn start_apiserver(&mut self) -> Result<(), EnvtestError> {
        if self.apiserver.is_some() {
            return Ok(());
        }
        let log = self.dir.path().join("kube-apiserver.log");
        // Keep the log of an earlier run.
        if log.exists() {
            let _ = std::fs::rename(&log, self.dir.path().join("kube-apiserver.previous.log"));
        }
        let mut apiserver = Process::spawn(
            "kube-apiserver",
            &self.bins.kube_apiserver(),
            &self.apiserver_cmd,
            log,
        )?;
        let client = self.client()?;
        let deadline = Instant::now() + self.ready_timeout;
        let probe = || {
            let client = client.clone();
            async move {
                let req = http::Request::get("/readyz")
                    .body(Vec::new())
                    .map_err(|e| e.to_string())?;
                let body = client.request_text(req).await.map_err(|e| e.to_string())?;
                if body.trim() != "ok" {
                    return Err(format!("/readyz answered {body:?}"));
                }
                let namespaces: Api<Namespace> = Api::all(client);
                namespaces
                    .get("default")
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("namespace default: {e}"))
            }
        };
        wait_ready(
            &mut apiserver,
            self.api_port,
            deadline,
            self.ready_timeout,
            probe,
        )
        .await?;
        self.apiserver = Some(apiserver);
        Ok(())
    }

    /// Stops kube-apiserver (SIGTERM, then SIGKILL after 10 s); etcd keeps running.
    pub fn stop_apiserver(&mut self) {
        if let Some(mut p) = self.apiserver.take() {
            p.stop(Duration::from_secs(10));
        }
    }

    /// Kills kube-apiserver at once (SIGKILL), as a crash would.
    pub fn kill_apiserver(&mut self) {
        if let Some(mut p) = self.apiserver.take() {
            p.stop(Duration::ZERO);
        }
    }

    /// Stops and starts kube-apiserver on the same port with the same state.
    pub async fn restart_apiserver(&mut self) -> Result<(), EnvtestError> {
        self.stop_apiserver();
        self.start_apiserver().await
    }

    /// A new client with admin rights. Each test should take its own: a
    /// client's connections belong to the Tokio runtime it was first used on.
    pub fn client(&self) -> Result<Client, EnvtestError> {
        Client::try_from(self.config.clone()).map_err(|e| EnvtestError::failed(CLIENT, e))
    }

    /// A new admin client that connects through `port` on loopback (a
    /// [`Proxy`](crate::Proxy) in front of this server) instead of directly.
    pub fn client_via(&self, port: u16) -> Result<Client, EnvtestError> {
        let mut config = self.config.clone();
        config.cluster_url = format!("https://127.0.0.1:{port}")
            .parse()
            .map_err(|e| EnvtestError::failed(format!("the proxy URL on port {port}"), e))?;
        Client::try_from(config).map_err(|e| EnvtestError::failed(CLIENT, e))
    }

    /// The client configuration (admin, server URL, CA).
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// The admin kubeconfig file (context `envtest`, namespace `default`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// An admin kubeconfig file like [`kubeconfig_path`](Self::kubeconfig_path)'s
    /// whose server is `https://127.0.0.1:<port>` (a proxy in front of this
    /// server, which presents its serving certificate): for a program run
    /// as a separate process through a proxy. Written in the environment's
    /// directory, so it goes with it.
    pub fn kubeconfig_via(&self, port: u16) -> Result<PathBuf, EnvtestError> {
        let direct = std::fs::read_to_string(&self.kubeconfig)
            .map_err(|e| EnvtestError::io("reading", self.kubeconfig.clone(), e))?;
        let server = format!("server: https://127.0.0.1:{}\n", self.api_port);
        if !direct.contains(&server) {
            return Err(EnvtestError::Client(format!(
                "{} names no server https://127.0.0.1:{}",
                self.kubeconfig.display(),
                self.api_port
            )));
        }
        let via = direct.replace(&server, &format!("server: https://127.0.0.1:{port}\n"));
        let path = self.dir.path().join(format!("kubeconfig-via-{port}"));
        std::fs::write(&path, via).map_err(|e| EnvtestError::io("writing", path.clone(), e))?;
        Ok(path)
    }

    /// A kubeconfig file that acts as the ServiceAccount `name` of
    /// `namespace` (which must exist), with a token from the TokenRequest
    /// API valid for an hour: no admin credentials, so a program run with
    /// it has exactly the RBAC bound to that account.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PathBuf, EnvtestError> {
        let request: TokenRequest = serde_json::from_value(serde_json::json!({
            "spec": {"expirationSeconds": 3600},
        }))
        .map_err(|e| EnvtestError::failed("building a TokenRequest", e))?;
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client()?, namespace);
        let answered: TokenRequest = accounts
            .create_subresource("token", name, &PostParams::default(), &request)
            .await
            .map_err(|e| {
                let what = format!("requesting a token for ServiceAccount {namespace}/{name}");
                EnvtestError::failed(what, e)
            })?;
        let token = answered
            .status
            .and_then(|s| s.token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                EnvtestError::Client(format!("no token for ServiceAccount {namespace}/{name}"))
            })?;
        let admin = std::fs::read_to_string(&self.kubeconfig)
            .map_err(|e| EnvtestError::io("reading", self.kubeconfig.clone(), e))?;
        let users = admin.find("users:\n").zip(admin.find("contexts:\n"));
        let Some((users, contexts)) = users else {
            return Err(EnvtestError::Client(format!(
                "{} has no users and contexts",
                self.kubeconfig.display()
            )));
        };
        let kubeconfig = format!(
            "{}users:\n- name: admin\n  user:\n    token: {token}\n{}",
            &admin[..users],
            &admin[contexts..]
        );
        let path = self
            .dir
            .path()
            .join(format!("kubeconfig-{namespace}-{name}"));
        std::fs::write(&path, kubeconfig)
            .map_err(|e| EnvtestError::io("writing", path.clone(), e))?;
        Ok(path)
    }

    /// Runs this control plane's kubectl as admin with `args`, `stdin` on
    /// its standard input (`kubectl apply -f -` applies it); its standard
    /// output. Blocks until kubectl exits; an exit other than 0 is an
    /// error carrying kubectl's standard error.
    pub fn kubectl(&self, args: &[&str], stdin: &str) -> Result<String, EnvtestError> {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let kubectl = self.binaries().kubectl();
        let mut child = Command::new(&kubectl)
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                EnvtestError::failed(
                    format!("kubectl {args:?}: starting {}", kubectl.display()),
                    e,
                )
            })?;
        let written = child
            .stdin
            .take()
            .map(|mut input| input.write_all(stdin.as_bytes()));
        let out = child
            .wait_with_output()
            .map_err(|e| EnvtestError::failed(format!("kubectl {args:?}: waiting for it"), e))?;
        if !out.status.success() {
            return Err(EnvtestError::Client(format!(
                "kubectl {args:?}: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        if let Some(Err(e)) = written {
            return Err(EnvtestError::failed(
                format!("kubectl {args:?}: writing its input"),
                e,
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Applies `manifests` (what a program's `--print-rbac` prints: a
    /// ServiceAccount and the roles bound to it) as admin, and gives a
    /// kubeconfig acting as that ServiceAccount, `account` of `namespace`
    /// ([`service_account_kubeconfig`](Self::service_account_kubeconfig)).
    ///
    /// Returns once the API server's authorizer grants the account every
    /// rule of `manifests` (it learns of RBAC changes a moment after they
    /// are written), so that a program started with the kubeconfig is
    /// never refused for that lag.
    pub async fn bind(
        &self,
        manifests: &str,
        namespace: &str,
        account: &str,
    ) -> Result<PathBuf, EnvtestError> {
        self.kubectl(&["apply", "-f", "-"], manifests)?;
        let list: serde_json::Value = serde_json::from_str(manifests)
            .map_err(|e| EnvtestError::failed("the manifests are not JSON", e))?;
        let user = format!("system:serviceaccount:{namespace}:{account}");
        let groups = [
            "system:serviceaccounts".to_owned(),
            format!("system:serviceaccounts:{namespace}"),
        ];
        let reviews: Api<SubjectAccessReview> = Api::all(self.client()?);
        for (scope, rule) in crate::rbac::granted(&list) {
            let review: SubjectAccessReview = serde_json::from_value(serde_json::json!({
                "spec": {"user": user, "groups": groups, "resourceAttributes": {
                    "namespace": scope, "verb": rule.verb, "group": rule.group,
                    "resource": rule.resource, "subresource": rule.subresource,
                    "name": rule.name,
                }},
            }))
            .map_err(|e| EnvtestError::failed("building a SubjectAccessReview", e))?;
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let answer = reviews
                    .create(&PostParams::default(), &review)
                    .await
                    .map_err(|e| EnvtestError::failed("creating a SubjectAccessReview", e))?;
                if answer.status.is_some_and(|s| s.allowed) {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(EnvtestError::Client(format!(
                        "{user} is still not allowed {rule:?} in {scope:?} 30 s after the RBAC was applied"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        self.service_account_kubeconfig(namespace, account).await
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    /// The kube-apiserver port.
    pub fn api_port(&self) -> u16 {
        self.api_port
    }

    /// The etcd client port.
    pub fn etcd_port(&self) -> u16 {
        self.etcd_port
    }

    /// The binaries in use (for kubectl).
    pub fn binaries(&self) -> &Binaries {
        &self.bins
    }

    /// The directory holding the certificates, data and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The current etcd revision.
    pub async fn etcd_revision(&self) -> Result<i64, EnvtestError> {
        etcd::revision(self.etcd_port).await
    }

    /// Compacts etcd up to its current revision and returns it: any watch or
    /// continue token older than that now gets 410 Gone from kube-apiserver
    /// (once its watch cache has also moved past it).
    pub async fn compact_etcd(&self) -> Result<i64, EnvtestError> {
        let revision = etcd::revision(self.etcd_port).await?;
        etcd::compact(self.etcd_port, revision).await?;
        Ok(revision)
    }

    /// Peak resident memory in bytes of (etcd, kube-apiserver) so far.
    pub fn peak_memory_bytes(&self) -> (Option<u64>, Option<u64>) {
        (
            self.etcd.as_ref().and_then(|p| p.peak_rss_bytes()),
            self.apiserver.as_ref().and_then(|p| p.peak_rss_bytes()),
        )
    }

    /// The process id of kube-controller-manager, if it was started.
    pub fn controller_manager_pid(&self) -> Option<u32> {
        self.controller_manager.as_ref().map(|p| p.pid())
    }

    /// Process ids of (etcd, kube-apiserver).
    pub fn pids(&self) -> (Option<u32>, Option<u32>) {
        (
            self.etcd.as_ref().map(|p| p.pid()),
            self.apiserver.as_ref().map(|p| p.pid()),
        )
    }

    /// Creates a namespace named `<prefix>-<unique suffix>`, for one test:
    /// the [`TestNamespace`] is its name, and deletes it when dropped (at
    /// the end of the test that holds it). Deleted, it is emptied and
    /// removed by the namespace controller (unless the control plane runs
    /// without it: then it stays Terminating).
    pub async fn create_namespace(&self, prefix: &str) -> Result<TestNamespace, EnvtestError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let name = format!("{prefix}-{}-{n}-{:x}", std::process::id(), nanos % 0xffff);
        let namespaces: Api<Namespace> = Api::all(self.client()?);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .map_err(|e| EnvtestError::failed(format!("creating namespace {name}"), e))?;
        let deleter = self
            .namespace_deleter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(|| crate::namespace::deleter(self.config.clone()))
            .clone();
        Ok(TestNamespace::new(name, deleter))
    }

    /// Stops the processes and removes the directory.
    pub fn stop(mut self) {
        if let Some(mut p) = self.controller_manager.take() {
            p.stop(Duration::from_secs(5));
        }
        self.stop_apiserver();
        if let Some(mut p) = self.etcd.take() {
            p.stop(Duration::from_secs(5));
        }
    }
}

fn free_ports() -> Result<[u16; 3], EnvtestError> {
    let bind = || {
        TcpListener::bind("127.0.0.1:0")
            .map_err(|e| EnvtestError::io("binding a free port on", "127.0.0.1", e))
    };
    // All three are held open at once so that they are distinct.
    let listeners = [bind()?, bind()?, bind()?];
    let mut ports = [0u16; 3];
    for (port, l) in ports.iter_mut().zip(&listeners) {
        *port = l
            .local_addr()
            .map_err(|e| EnvtestError::io("reading the address of", "127.0.0.1", e))?
            .port();
    }
    Ok(ports)
}

/// Polls `probe` until it succeeds, the process exits, or the deadline passes.
async fn wait_ready<F, Fut>(
    process: &mut Process,
    port: u16,
    deadline: Instant,
    timeout: Duration,
    probe: F,
) -> Result<(), EnvtestError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let mut last_error;
    loop {
        if let Some(status) = process.exited() {
            let tail = process.log_tail(30);
            if tail.contains("address already in use") {
                return Err(EnvtestError::PortInUse {
                    component: process.component,
                    port,
                });
            }
            return Err(EnvtestError::ExitedEarly {
                component: process.component,
                status: status.to_string(),
                log: process.log.clone(),
                tail,
            });
        }
        match probe().await {
            Ok(()) => return Ok(()),
            Err(e) => last_error = e,
        }
        if Instant::now() >= deadline {
            return Err(EnvtestError::NotReady {
                component: process.component,
                seconds: timeout.as_secs(),
                last_error,
                log: process.log.clone(),
                tail: process.log_tail(30),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn kubeconfig_yaml(api_port: u16, pki: &Pki) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: envtest\n  cluster:\n    server: https://127.0.0.1:{api_port}\n    certificate-authority-data: {ca}\n\
         users:\n\
         - name: admin\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\n\
         contexts:\n\
         - name: envtest\n  context:\n    cluster: envtest\n    user: admin\n    namespace: default\n\
         current-context: envtest\n",
        ca = b64(&pki.ca_cert),
        cert = b64(&pki.admin_cert),
        key = b64(&pki.admin_key),
    )
}

async fn config_from_kubeconfig(path: &Path) -> Result<Config, EnvtestError> {
    let kubeconfig = Kubeconfig::read_from(path)
        .map_err(|e| EnvtestError::failed(format!("reading {}", path.display()), e))?;
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| EnvtestError::failed(format!("loading {}", path.display()), e))
}
