//! Runs the example and checks what it printed.

use std::process::Command;

#[test]
fn every_job_is_worked_once_and_the_flaky_one_is_retried_then_dropped() {
    let out = Command::new(env!("CARGO_BIN_EXE_workqueue"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    for job in ["a", "b", "c", "d"] {
        let done = lines
            .iter()
            .filter(|l| l.ends_with(&format!(": {job} done")))
            .count();
        assert_eq!(done, 1, "{job} worked {done} times:\n{stdout}");
    }
    for retry in 1..=3 {
        let line = format!(": flaky failed, retry {retry} after backoff");
        assert!(
            lines.iter().any(|l| l.ends_with(&line)),
            "no{line}:\n{stdout}"
        );
    }
    assert!(
        lines
            .iter()
            .any(|l| l.ends_with(": flaky failed 4 times, dropped")),
        "{stdout}"
    );
    assert_eq!(
        lines.last(),
        Some(&"queue drained; 0 jobs left"),
        "{stdout}"
    );
}
