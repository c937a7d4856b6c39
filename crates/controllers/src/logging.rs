//! One call to see the logs. kinformer logs through `tracing`, which
//! prints nothing until a subscriber is installed; [`init`] installs one
//! (tracing-subscriber's `fmt`) that writes INFO and above to standard
//! error, or what `RUST_LOG` asks for (`RUST_LOG=debug`,
//! `RUST_LOG=kinformer_controllers=debug,info`), in colour only on a
//! terminal (and not with `NO_COLOR` set). A `RUST_LOG` that does not
//! parse is an error; one that parses as something else than was meant
//! (`RUST_LOG=warning` is a target named `warning`, not a level) is taken
//! as written, as tracing-subscriber takes it. It is controller-runtime's
//! `ctrl.SetLogger(zap.New())` step.
//! Behind the default feature `logging`; a program with a subscriber of its
//! own (JSON, OpenTelemetry) installs that instead.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Why [`init`] installed nothing; tracing-subscriber's reason is its
/// `source()`.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// `RUST_LOG` does not parse as a level or filter.
    #[error("RUST_LOG={value:?} is not a level or filter; try RUST_LOG=info or RUST_LOG=debug")]
    InvalidFilter {
        /// What `RUST_LOG` holds.
        value: String,
        /// tracing-subscriber's reason.
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber was installed before.
    #[error("a tracing subscriber is installed already; call logging::init once, first")]
    AlreadyInstalled(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Installs the subscriber described in the module docs, for the whole
/// process. Once, before anything logs:
///
/// ```no_run
/// # fn main() -> Result<(), kinformer_controllers::logging::LoggingError> {
/// kinformer_controllers::logging::init()?;
/// # Ok(()) }
/// ```
pub fn init() -> Result<(), LoggingError> {
    let rust_log = std::env::var("RUST_LOG").ok();
    tracing_subscriber::fmt()
        .with_env_filter(filter(rust_log.as_deref())?)
        .with_writer(std::io::stderr)
        .with_ansi(colour(std::env::var_os("NO_COLOR").as_deref()))
        .try_init()
        .map_err(LoggingError::AlreadyInstalled)
}

/// Colour on a terminal, unless `NO_COLOR` is set to something
/// (<https://no-color.org>).
fn colour(no_color: Option<&std::ffi::OsStr>) -> bool {
    std::io::stderr().is_terminal() && no_color.is_none_or(|v| v.is_empty())
}

/// The filter `RUST_LOG` asks for: INFO and above when unset or empty.
fn filter(rust_log: Option<&str>) -> Result<EnvFilter, LoggingError> {
    match rust_log.filter(|v| !v.trim().is_empty()) {
        None => Ok(EnvFilter::new("info")),
        Some(value) => EnvFilter::try_new(value).map_err(|source| LoggingError::InvalidFilter {
            value: value.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_by_default_what_rust_log_says_otherwise_and_nonsense_named() {
        assert_eq!(filter(None).unwrap().to_string(), "info");
        assert_eq!(filter(Some(" ")).unwrap().to_string(), "info");
        assert_eq!(filter(Some("debug")).unwrap().to_string(), "debug");
        let e = filter(Some("kinformer=loud")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "RUST_LOG=\"kinformer=loud\" is not a level or filter; try RUST_LOG=info or RUST_LOG=debug"
        );
        // tracing-subscriber's reason is the source, said by the chain.
        let reason = std::error::Error::source(&e)
            .expect("the parse error")
            .to_string();
        assert!(
            !reason.is_empty() && crate::error_chain(&e).ends_with(&reason),
            "{reason}"
        );
        assert!(!colour(Some(std::ffi::OsStr::new("1"))));
    }
}
