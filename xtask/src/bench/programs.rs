//! What the controller benches share: the three programs of one
//! controller, a running program whose output lines are stamped as read,
//! and kube-apiserver's own request counts.

use tokio::sync::mpsc;

use super::*;

/// One controller written three ways: kinformer's and its peers'.
pub(crate) struct Programs {
    pub(crate) kinformer: PathBuf,
    pub(crate) controller_runtime: PathBuf,
    pub(crate) kube_runtime: PathBuf,
}

/// The framework `s` stands for here.
pub(crate) fn name(s: System) -> &'static str {
    match s {
        System::ClientGo => "controller-runtime",
        other => other.name(),
    }
}

impl Programs {
    /// In the table's columns: controller-runtime where client-go stands.
    pub(crate) fn path(&self, s: System) -> &Path {
        match s {
            System::Kinformer => &self.kinformer,
            System::ClientGo => &self.controller_runtime,
            System::KubeRuntime => &self.kube_runtime,
        }
    }
}

pub(crate) fn cargo(dir: &Path, package: &str) -> Result<()> {
    let status =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(dir)
            .args(["build", "--release", "--quiet", "-p", package])
            .status()
            .with_context(|| format!("running cargo build -p {package}"))?;
    if !status.success() {
        bail!("building {package} failed");
    }
    Ok(())
}

/// A controller process, and the lines it prints, each stamped when the
/// bench read it.
pub(crate) struct Running {
    pub(crate) child: tokio::process::Child,
    lines: mpsc::UnboundedReceiver<(Instant, String)>,
    /// Where its standard error goes.
    log: PathBuf,
}

impl Running {
    /// Starts `program`; its standard error goes to a file in the temporary directory,
    /// `{program's name}.{the bench's pid}.{a count}.log`.
    pub(crate) fn start(program: &Path, kubeconfig: &Path, env: &[(&str, &str)]) -> Result<Self> {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let log = std::env::temp_dir().join(format!(
            "{}.{}.{}.log",
            program.file_name().unwrap_or_default().to_string_lossy(),
            std::process::id(),
            STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let path = log;
        let log =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let mut child = Command::new(program)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            lines,
            log: path,
        })
    }

    /// The next Deployment the program says it patched: when, and its index.
    pub(crate) async fn next_patch(&mut self, deadline: Instant) -> Result<(Instant, usize)> {
        loop {
            let (at, line) = tokio::time::timeout_at(deadline.into(), self.lines.recv())
                .await
                .context("no patch in time")?
                .context("the controller exited")?;
            let index = line
                .split_once(": config hash ")
                .and_then(|(name, _)| name.rsplit_once("/web-")?.1.parse().ok());
            if let Some(index) = index {
                return Ok((at, index));
            }
        }
    }

    pub(crate) fn cpu_ms(&self) -> f64 {
        self.child.id().map_or(0.0, process_cpu_ms)
    }

    /// Waits until the process is idle: under 2% of a core over 2 s (a
    /// standby renewing nothing, a leader done with its initial reconciles).
    /// A process that exits meanwhile is an error naming its log.
    pub(crate) async fn settled(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(900);
        let mut before = self.cpu_ms();
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            if let Some(status) = self.child.try_wait()? {
                bail!("it exited ({status}); its log: {}", self.log.display());
            }
            let now = self.cpu_ms();
            if now - before < 40.0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("still busy after 900 s");
            }
            before = now;
        }
    }

    pub(crate) async fn kill(mut self) {
        let _ = self.child.start_kill(); // SIGKILL
        let _ = self.child.wait().await;
    }
}

/// Environment variables for a program.
pub(crate) type Vars<'a> = [(&'a str, &'a str)];

/// kube-apiserver's request counts for some resources: reads (gets and
/// lists; a watch is counted only when it ends, so watches are left out),
/// write attempts (refused ones too), and the 409 Conflicts among them.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct Served {
    pub reads: f64,
    pub writes: f64,
    pub conflicts: f64,
}

impl std::ops::Sub for Served {
    type Output = Served;
    fn sub(self, o: Served) -> Served {
        Served {
            reads: self.reads - o.reads,
            writes: self.writes - o.writes,
            conflicts: self.conflicts - o.conflicts,
        }
    }
}

/// The value of label `name` in a Prometheus sample's label set (what is
/// between its braces): `name` whole, not the end of a longer label's.
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let quoted = format!("{name}=\"");
    let start = labels.match_indices(&quoted).find_map(|(at, _)| {
        (at == 0 || labels.as_bytes()[at - 1] == b',').then_some(at + quoted.len())
    })?;
    let len = labels[start..].find('"')?;
    Some(&labels[start..start + len])
}

/// kube-apiserver's `/metrics` text.
pub(crate) async fn apiserver_metrics(client: &Client) -> Result<String> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    Ok(client.request_text(request).await?)
}

/// Each `apiserver_request_total` sample in `text`: its labels (between
/// the braces) and its count.
fn request_samples(text: &str) -> impl Iterator<Item = (&str, f64)> {
    text.lines().filter_map(|line| {
        let (labels, value) = line
            .strip_prefix("apiserver_request_total{")?
            .rsplit_once("} ")?;
        Some((labels, value.parse().ok()?))
    })
}

/// The sum of kube-apiserver's `apiserver_request_total` counters: every
/// request it has answered.
pub(crate) async fn apiserver_requests(client: &Client) -> Result<f64> {
    Ok(request_samples(&apiserver_metrics(client).await?)
        .map(|(_, count)| count)
        .sum())
}

/// The counts for `resources` (plural names) so far.
pub(crate) async fn served(client: &Client, resources: &[&str]) -> Result<Served> {
    let text = apiserver_metrics(client).await?;
    let mut served = Served::default();
    for (labels, value) in request_samples(&text) {
        if !label(labels, "resource").is_some_and(|r| resources.contains(&r)) {
            continue;
        }
        match label(labels, "verb") {
            Some("GET" | "LIST") => served.reads += value,
            Some("POST" | "PUT" | "PATCH" | "APPLY" | "DELETE") => served.writes += value,
            _ => {}
        }
        if label(labels, "code") == Some("409") {
            served.conflicts += value;
        }
    }
    Ok(served)
}
