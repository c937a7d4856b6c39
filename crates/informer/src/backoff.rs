//! Exponential backoff with jitter that resets after a period of health, as
//! client-go's `NewExponentialBackoffManager(800ms, 30s, 2min, 2.0, 1.0)`.

use std::time::Duration;

use tokio::time::Instant;

/// Backoff settings. Defaults: 800 ms doubling to 30 s, full jitter (up to
/// +100%), reset after 2 minutes without a backoff.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct BackoffConfig {
    /// First delay.
    pub initial: Duration,
    /// Largest delay (before jitter).
    pub max: Duration,
    /// The delay resets to `initial` after this long without a backoff.
    pub reset_after: Duration,
    /// Up to `jitter * delay` is added at random.
    pub jitter: f64,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(800),
            max: Duration::from_secs(30),
            reset_after: Duration::from_secs(120),
            jitter: 1.0,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Backoff {
    config: BackoffConfig,
    current: Duration,
    last: Option<Instant>,
}

impl Backoff {
    pub(crate) fn new(config: BackoffConfig) -> Self {
        Self {
            config,
            current: config.initial,
            last: None,
        }
    }

    /// The next delay: doubles on each call, back to `initial` when the
    /// previous call was longer than `reset_after` ago.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now.duration_since(last) > self.config.reset_after)
        {
            self.current = self.config.initial;
        }
        self.last = Some(now);
        let base = self.current;
        self.current = (self.current * 2).min(self.config.max);
        let jitter = base.mul_f64(self.config.jitter.max(0.0) * fastrand::f64());
        base + jitter
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_to_the_cap_and_resets_after_a_healthy_period() {
        let mut b = Backoff::new(BackoffConfig {
            jitter: 0.0,
            ..BackoffConfig::default()
        });
        let got: Vec<u64> = (0..8).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(got, [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]);
        tokio::time::advance(Duration::from_secs(121)).await;
        assert_eq!(b.next_delay(), Duration::from_millis(800));
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_adds_at_most_the_configured_share() {
        let mut b = Backoff::new(BackoffConfig::default());
        for _ in 0..100 {
            let d = b.next_delay();
            assert!(
                d >= Duration::from_millis(800) && d <= Duration::from_secs(60),
                "{d:?}"
            );
        }
    }
}
