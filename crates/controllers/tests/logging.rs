//! `logging::init` in a process of its own (a subscriber is global).

use kinformer_controllers::logging::{self, LoggingError};

#[test]
fn init_shows_info_not_debug_and_refuses_a_second_subscriber() {
    logging::init().unwrap();
    if std::env::var_os("RUST_LOG").is_none() {
        assert!(tracing::enabled!(tracing::Level::INFO));
        assert!(!tracing::enabled!(tracing::Level::DEBUG));
    }
    assert!(matches!(
        logging::init(),
        Err(LoggingError::AlreadyInstalled(_))
    ));
}
