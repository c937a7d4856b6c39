//! What can go wrong when building or running the control plane.

use std::path::PathBuf;

use thiserror::Error;

/// Building or running the test control plane failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum EnvtestError {
    /// The Go toolchain is not installed or not on `PATH`.
    #[error(
        "the Go toolchain (`go`) was not found on PATH; it is needed once to build \
         kube-apiserver, kubectl and etcd from Go modules (install Go 1.26 or newer, \
         or point KINFORMER_ENVTEST_BIN at a directory holding the three binaries)"
    )]
    GoMissing,
    /// `go build` failed; the output names the module or package at fault.
    #[error(
        "building {what} with `{command}` failed ({status}); last lines of Go's output:\n{output}"
    )]
    GoBuild {
        /// What was being built.
        what: String,
        /// The command run.
        command: String,
        /// Its exit status.
        status: String,
        /// The tail of its output.
        output: String,
    },
    /// The binaries are not where they should be and building was not allowed.
    #[error(
        "{0} not found; run `cargo xtask envtest build` to build the control plane \
         (or, if KINFORMER_ENVTEST_BIN or KUBEBUILDER_ASSETS is set, point it at a \
         directory holding etcd, kube-apiserver and kubectl)"
    )]
    NotBuilt(PathBuf),
    /// A process of the control plane could not be started.
    #[error("could not start {component} ({path}): {source}")]
    Spawn {
        /// `etcd` or `kube-apiserver`.
        component: &'static str,
        /// The binary.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A port the control plane needs is taken.
    #[error("{component} could not listen on 127.0.0.1:{port}: the port is in use")]
    PortInUse {
        /// `etcd` or `kube-apiserver`.
        component: &'static str,
        /// The port.
        port: u16,
    },
    /// A process of the control plane exited before it was ready.
    #[error("{component} exited early ({status}); last lines of {log}:\n{tail}")]
    ExitedEarly {
        /// `etcd` or `kube-apiserver`.
        component: &'static str,
        /// Its exit status.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// The tail of the log.
        tail: String,
    },
    /// A process did not become ready in time.
    #[error(
        "{component} was not ready after {seconds} s ({last_error}); last lines of {log}:\n{tail}"
    )]
    NotReady {
        /// `etcd` or `kube-apiserver`.
        component: &'static str,
        /// How long we waited.
        seconds: u64,
        /// The last readiness probe's failure.
        last_error: String,
        /// Its log file.
        log: PathBuf,
        /// The tail of the log.
        tail: String,
    },
    /// Certificates or keys could not be generated.
    #[error("generating certificates failed: {0}")]
    Certs(#[from] rcgen::Error),
    /// A file could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The kubeconfig could not be turned into a client.
    #[error("building a client from the envtest kubeconfig failed: {0}")]
    Client(String),
    /// An etcd maintenance call (compaction) failed.
    #[error("etcd request {path} failed: {message}")]
    Etcd {
        /// The endpoint called.
        path: &'static str,
        /// What went wrong.
        message: String,
    },
}

impl EnvtestError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
