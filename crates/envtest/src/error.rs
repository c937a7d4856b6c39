//! What can go wrong when building or running the control plane. Each
//! error says what failed; the cause, when there is one, is its `source()`.

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
    #[error("could not start {component} ({path})")]
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
    #[error("generating certificates failed")]
    Certs(#[from] rcgen::Error),
    /// A file could not be read or written.
    #[error("{action} {path}")]
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
    /// A step of using the control plane failed because of another error
    /// (a client or request, kubectl, a TLS setup): the step is named, the
    /// error is the source.
    #[error("{what}")]
    Failed {
        /// The step, and what it was about.
        what: String,
        /// Why it failed.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// An etcd maintenance call (compaction) failed.
    #[error("etcd request {path} failed: {message}")]
    Etcd {
        /// The endpoint called.
        path: &'static str,
        /// What went wrong.
        message: String,
        /// The error that made it go wrong, if any.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl EnvtestError {
    /// `what` failed because of `source`.
    pub(crate) fn failed(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Failed {
            what: what.into(),
            source: source.into(),
        }
    }

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

/// `error` and its causes, `a: b: c`, for a message kept as text (a
/// readiness probe's last failure).
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let causes = std::iter::successors(Some(error), |e| e.source()).take(64);
    causes
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_failed_step_is_named_and_its_cause_is_the_source_only() {
        let e = EnvtestError::failed("creating namespace t-1", std::io::Error::other("refused"));
        assert_eq!(e.to_string(), "creating namespace t-1");
        assert_eq!(
            e.source().map(|s| s.to_string()).as_deref(),
            Some("refused")
        );
        assert_eq!(error_chain(&e), "creating namespace t-1: refused");
        let e = EnvtestError::io("reading", "/tmp/x", std::io::Error::other("gone"));
        assert_eq!(e.to_string(), "reading /tmp/x");
        assert_eq!(error_chain(&e), "reading /tmp/x: gone");
    }
}
