use super::*;

fn internal() -> ListWatchError {
    ListWatchError::Api {
        code: 500,
        reason: "InternalError".into(),
        message: "etcd: corrupt value".into(),
        causes: Vec::new(),
    }
}

#[tokio::test(start_paused = true)]
async fn internal_errors_are_retried_within_the_window_from_the_first_then_no_more() {
    let mut retry = InternalErrorRetry::new(Duration::from_secs(30));
    retry.after(&internal());
    assert!(retry.should_retry());
    tokio::time::sleep(Duration::from_secs(20)).await;
    retry.after(&internal());
    assert!(retry.should_retry(), "20 s after the first");
    tokio::time::sleep(Duration::from_secs(20)).await;
    retry.after(&internal());
    assert!(!retry.should_retry(), "40 s after the first");
    // The window starts again with the next error.
    retry.after(&internal());
    assert!(retry.should_retry());
}

#[tokio::test(start_paused = true)]
async fn the_internal_error_window_restarts_after_a_quiet_minute() {
    let mut retry = InternalErrorRetry::new(Duration::from_secs(30));
    retry.after(&internal());
    tokio::time::sleep(Duration::from_secs(61)).await;
    retry.after(&internal());
    assert!(retry.should_retry(), "a new run of errors");
    // Other errors neither start nor extend it.
    let mut other = InternalErrorRetry::new(Duration::from_secs(30));
    other.after(&ListWatchError::Gone("expired".into()));
    assert!(other.first.is_none());
}

#[tokio::test(start_paused = true)]
async fn without_an_internal_error_recorded_there_is_nothing_to_retry() {
    let mut retry = InternalErrorRetry::new(Duration::from_secs(30));
    assert!(!retry.should_retry());
    retry.after(&ListWatchError::Gone("expired".into()));
    assert!(!retry.should_retry());
}

#[test]
fn without_a_window_an_internal_error_is_never_retried() {
    let mut retry = InternalErrorRetry::new(Duration::ZERO);
    retry.after(&internal());
    assert!(!retry.should_retry());
}
