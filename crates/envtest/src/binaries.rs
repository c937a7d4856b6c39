//! Building and locating the control-plane binaries.
//!
//! The Go modules under `go/kube` and `go/etcd` pin every dependency
//! (`go.mod` + `go.sum`); `go build` turns them into static binaries in a
//! cache directory outside the repository, once per version. A file lock
//! keeps concurrent test binaries from building twice.

use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::EnvtestError;

/// The Kubernetes version of kube-apiserver and kubectl.
pub const KUBERNETES_VERSION: &str = "v1.37.2";
/// The etcd version.
pub const ETCD_VERSION: &str = "v3.6.16";

/// Where the binaries live: `$KINFORMER_ENVTEST_BIN`; else
/// `$KUBEBUILDER_ASSETS` (setup-envtest's directory holding `etcd`,
/// `kube-apiserver` and `kubectl`, as controller-runtime's envtest reads
/// it); else `$XDG_CACHE_HOME/kinformer/envtest/<versions>` (`~/.cache` by
/// default), built there from the pinned Go modules when missing, with
/// `kube-controller-manager` beside them. A directory named by either
/// variable is used as it is, never built into; one without
/// `kube-controller-manager` (setup-envtest ships none) gives a control
/// plane without it.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The directory holding them.
    pub dir: PathBuf,
}

impl Binaries {
    /// The cache directory for the pinned versions (it may not exist yet).
    pub fn default_dir() -> PathBuf {
        if let Some((_, dir)) = Self::given_dir() {
            return dir;
        }
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir);
        cache
            .join("kinformer")
            .join("envtest")
            .join(format!("k8s-{KUBERNETES_VERSION}_etcd-{ETCD_VERSION}"))
    }

    /// The directory a variable names, and the variable:
    /// `KINFORMER_ENVTEST_BIN` first, then `KUBEBUILDER_ASSETS`.
    fn given_dir() -> Option<(&'static str, PathBuf)> {
        ["KINFORMER_ENVTEST_BIN", "KUBEBUILDER_ASSETS"]
            .into_iter()
            .find_map(|var| {
                std::env::var_os(var)
                    .filter(|v| !v.is_empty())
                    .map(|v| (var, PathBuf::from(v)))
            })
    }

    /// The binaries in the default directory, without building.
    pub fn locate() -> Result<Self, EnvtestError> {
        let bins = Self {
            dir: Self::default_dir(),
        };
        let mut needed = bins.all().to_vec();
        if Self::given_dir().is_none() {
            needed.push(bins.kube_controller_manager());
        }
        for path in needed {
            if !path.is_file() {
                return Err(EnvtestError::NotBuilt(path));
            }
        }
        Ok(bins)
    }

    /// The binaries, built first if any is missing. Progress goes to stderr.
    pub fn ensure() -> Result<Self, EnvtestError> {
        let located = Self::locate();
        if located.is_ok() || Self::given_dir().is_some() {
            // A directory the user named is theirs: found, or reported missing.
            return located;
        }
        let dir = Self::default_dir();
        fs::create_dir_all(&dir).map_err(|e| EnvtestError::io("creating", &dir, e))?;
        let lock_path = dir.join(".build.lock");
        let lock =
            File::create(&lock_path).map_err(|e| EnvtestError::io("creating", &lock_path, e))?;
        lock.lock()
            .map_err(|e| EnvtestError::io("locking", &lock_path, e))?;
        // Another process may have built them while we waited for the lock.
        if let Ok(bins) = Self::locate() {
            return Ok(bins);
        }
        let bins = Self { dir };
        if bins.all().iter().all(|path| path.is_file()) {
            // A cache from before kube-controller-manager: it alone is built.
            bins.build_controller_manager()?;
        } else {
            bins.build()?;
        }
        Ok(bins)
    }

    /// Builds the four binaries into the directory, replacing what is there.
    pub fn build(&self) -> Result<(), EnvtestError> {
        let go_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("go");
        let started = Instant::now();
        eprintln!(
            "envtest: building kube-apiserver, kube-controller-manager and kubectl {KUBERNETES_VERSION} \
             and etcd {ETCD_VERSION} from pinned Go modules into {}",
            self.dir.display()
        );
        eprintln!(
            "envtest: a cold build (modules downloaded, nothing compiled) takes about 6 min on \
             2 cores and up to 2.5 GB of memory; later runs reuse the binaries"
        );
        fs::create_dir_all(&self.dir).map_err(|e| EnvtestError::io("creating", &self.dir, e))?;
        go_build(
            &go_dir.join("etcd"),
            "etcd",
            &["go.etcd.io/etcd/server/v3"],
            &[("server", "etcd")],
            "-s -w",
            &self.dir,
        )?;
        let version_flags = version_flags();
        go_build(
            &go_dir.join("kube"),
            "kube-apiserver, kube-controller-manager and kubectl",
            &[
                "k8s.io/kubernetes/cmd/kube-apiserver",
                "k8s.io/kubernetes/cmd/kube-controller-manager",
                "k8s.io/kubernetes/cmd/kubectl",
            ],
            &[
                ("kube-apiserver", "kube-apiserver"),
                ("kube-controller-manager", "kube-controller-manager"),
                ("kubectl", "kubectl"),
            ],
            &format!("-s -w {version_flags}"),
            &self.dir,
        )?;
        eprintln!(
            "envtest: built in {:.0} s into {}",
            started.elapsed().as_secs_f64(),
            self.dir.display()
        );
        Ok(())
    }

    /// Builds kube-controller-manager alone into the directory (the others
    /// are there: a cache from before it was part of the control plane).
    fn build_controller_manager(&self) -> Result<(), EnvtestError> {
        let go_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("go");
        eprintln!(
            "envtest: building kube-controller-manager {KUBERNETES_VERSION} beside the binaries in {}",
            self.dir.display()
        );
        go_build(
            &go_dir.join("kube"),
            "kube-controller-manager",
            &["k8s.io/kubernetes/cmd/kube-controller-manager"],
            &[("kube-controller-manager", "kube-controller-manager")],
            &format!("-s -w {}", version_flags()),
            &self.dir,
        )
    }

    /// The etcd binary.
    pub fn etcd(&self) -> PathBuf {
        self.dir.join("etcd")
    }

    /// The kube-apiserver binary.
    pub fn kube_apiserver(&self) -> PathBuf {
        self.dir.join("kube-apiserver")
    }

    /// The kube-controller-manager binary (absent from a directory
    /// setup-envtest filled).
    pub fn kube_controller_manager(&self) -> PathBuf {
        self.dir.join("kube-controller-manager")
    }

    /// The kubectl binary.
    pub fn kubectl(&self) -> PathBuf {
        self.dir.join("kubectl")
    }

    fn all(&self) -> [PathBuf; 3] {
        [self.etcd(), self.kube_apiserver(), self.kubectl()]
    }
}

/// The linker flags that stamp the Kubernetes version into a binary, as
/// its own build does.
fn version_flags() -> String {
    [
        ("k8s.io/component-base/version", KUBERNETES_VERSION),
        ("k8s.io/client-go/pkg/version", KUBERNETES_VERSION),
    ]
    .iter()
    .map(|(pkg, v)| {
        let minor = v.split('.').nth(1).unwrap_or("0");
        format!("-X {pkg}.gitVersion={v} -X {pkg}.gitMajor=1 -X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean")
    })
    .collect::<Vec<_>>()
    .join(" ")
}

/// Runs `go build` for `packages` in module `dir`, into a staging directory,
/// then moves each produced binary into `out`, so a failed or interrupted
/// build never leaves a half-written binary behind.
fn go_build(
    dir: &Path,
    what: &str,
    packages: &[&str],
    outputs: &[(&str, &str)],
    ldflags: &str,
    out: &Path,
) -> Result<(), EnvtestError> {
    let staging = out.join(".staging");
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging).map_err(|e| EnvtestError::io("creating", &staging, e))?;
    let mut cmd = Command::new("go");
    cmd.current_dir(dir)
        .env("GOTOOLCHAIN", "local")
        .env("CGO_ENABLED", "0")
        .arg("build")
        .arg("-v")
        .arg("-trimpath")
        .arg(format!("-ldflags={ldflags}"))
        .arg("-o")
        .arg(format!("{}/", staging.display()))
        .args(packages)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let command = format!(
        "go build -o {}/ {} (in {})",
        staging.display(),
        packages.join(" "),
        dir.display()
    );
    eprintln!("envtest: {command}");
    let started = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(EnvtestError::GoMissing),
        Err(e) => return Err(EnvtestError::io("running go in", dir, e)),
    };
    // `go build -v` names each package as it is compiled: count them as progress
    // and keep the tail for the error message.
    let mut tail: Vec<String> = Vec::new();
    let mut packages_built = 0usize;
    if let Some(stderr) = child.stderr.take() {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !line.starts_with("go: ") && !line.contains(' ') {
                packages_built += 1;
                if packages_built.is_multiple_of(250) {
                    eprintln!(
                        "envtest: {what}: {packages_built} packages compiled ({:.0} s)",
                        started.elapsed().as_secs_f64()
                    );
                }
            }
            tail.push(line);
            if tail.len() > 40 {
                tail.remove(0);
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| EnvtestError::io("waiting for go in", dir, e))?;
    if !status.success() {
        return Err(EnvtestError::GoBuild {
            what: what.to_owned(),
            command,
            status: status.to_string(),
            output: tail.join("\n"),
        });
    }
    for (produced, name) in outputs {
        let from = staging.join(produced);
        let to = out.join(name);
        fs::rename(&from, &to).map_err(|e| EnvtestError::io("moving", &from, e))?;
    }
    let _ = fs::remove_dir_all(&staging);
    eprintln!(
        "envtest: {what} built in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
