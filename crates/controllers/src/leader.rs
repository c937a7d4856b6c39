//! Leader election on a coordination.k8s.io/v1 Lease, as client-go's
//! `leaderelection` package (LeaseLock, ReleaseOnCancel).
//!
//! A candidate tries every `retry_period` to take the lease: it may when the
//! lease does not exist, names nobody, names it, or has not been renewed for
//! `lease_duration` as measured on the candidate's own clock since it last
//! saw the lease change (so clock skew between nodes does not matter). The
//! leader renews every `retry_period`; if no renewal succeeds for
//! `renew_deadline` it gives up leadership. On shutdown it releases the lease
//! so a standby can take over at its next try. Writes use the lease's
//! resourceVersion, so two candidates can never both win.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube_client::Client;
use kube_client::api::{Api, PostParams};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Timing and identity of a leader election. Defaults are client-go's:
/// 15 s lease, 10 s renew deadline, 2 s retry period.
#[derive(Debug, Clone)]
pub struct LeaderElectionConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// This candidate's identity (unique per process).
    pub identity: String,
    /// How long a lease is valid after its last renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before giving up.
    pub renew_deadline: Duration,
    /// How often to try to acquire or renew.
    pub retry_period: Duration,
}

impl LeaderElectionConfig {
    /// An election on Lease `namespace/lease_name` for `identity`.
    pub fn new(namespace: &str, lease_name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            lease_name: lease_name.to_owned(),
            identity: identity.to_owned(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// One candidate in a leader election.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    leading: watch::Sender<bool>,
    /// The lease record last seen and when (on our clock) it was first seen.
    observed: Mutex<Option<(Observed, Instant)>>,
    /// While leading: when the last successful renewal was sent, plus the
    /// lease duration.
    valid_until: Mutex<Option<Instant>>,
    /// Whether cancelling `run` releases the lease (client-go's
    /// ReleaseOnCancel); cleared when work may still be running.
    release_on_cancel: AtomicBool,
}

#[derive(Debug, Clone, PartialEq)]
struct Observed {
    holder: Option<String>,
    renew_time: Option<Timestamp>,
    transitions: i32,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("config", &self.config)
            .field("leading", &*self.leading.borrow())
            .finish()
    }
}

impl LeaderElector {
    /// A candidate for `config` talking to the cluster through `client`.
    pub fn new(client: Client, config: LeaderElectionConfig) -> Self {
        Self {
            api: Api::namespaced(client, &config.namespace),
            config,
            leading: watch::channel(false).0,
            observed: Mutex::new(None),
            valid_until: Mutex::new(None),
            release_on_cancel: AtomicBool::new(true),
        }
    }

    /// The instant before which no other candidate can take the lease: when
    /// the last successful renewal was sent, plus the lease duration. It stays
    /// so after leadership is lost (the deadline for stopping work), and is
    /// moved to the moment the lease was found taken or was released. `None`
    /// before this candidate first led.
    pub fn lease_valid_until(&self) -> Option<Instant> {
        *self.valid_until.lock()
    }

    /// On cancel, stop renewing but leave the lease to expire instead of
    /// releasing it: for when reconciles may still be running.
    pub(crate) fn keep_lease_on_cancel(&self) {
        self.release_on_cancel.store(false, Ordering::SeqCst);
    }

    /// Whether this candidate leads now.
    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Follows leadership changes.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    /// The election's timing and identity.
    pub fn config(&self) -> &LeaderElectionConfig {
        &self.config
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.config.identity
    }

    /// Campaigns, then leads, until `shutdown` fires (the lease is then
    /// released) or leadership is lost (then it returns, leading false).
    /// It campaigns once: after a loss a new elector (a new process) must.
    pub async fn run(&self, shutdown: CancellationToken) {
        let retry = self.config.retry_period;
        // Acquire.
        loop {
            let sent = Instant::now();
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    self.renewed(sent);
                    break;
                }
                Ok(false) => {
                    debug!(lease = %self.config.lease_name, "lease held by another candidate")
                }
                Err(e) => warn!(error = %e, "cannot read or write the lease"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(jittered(retry)) => {}
            }
        }
        info!(identity = %self.config.identity, lease = %self.config.lease_name, "became the leader");
        self.leading.send_replace(true);
        // Renew.
        let mut last_renew = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    if self.release_on_cancel.load(Ordering::SeqCst) {
                        self.release().await;
                    } else {
                        warn!(lease = %self.config.lease_name, "not releasing the lease: work may still be running; it expires instead");
                    }
                    self.stop_leading();
                    return;
                }
                _ = tokio::time::sleep(retry) => {}
            }
            // Every attempt ends by the renew deadline, so a hanging request
            // cannot delay the loss past it (client-go bounds the renew loop
            // the same way).
            let remaining = self
                .config
                .renew_deadline
                .saturating_sub(last_renew.elapsed());
            let sent = Instant::now();
            match tokio::time::timeout(remaining, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => {
                    self.renewed(sent);
                    last_renew = Instant::now();
                }
                Ok(Ok(false)) => {
                    warn!("the lease was taken by another candidate");
                    *self.valid_until.lock() = Some(Instant::now());
                    break;
                }
                Ok(Err(e)) => warn!(error = %e, "failed to renew the lease"),
                Err(_) => warn!("renewing the lease timed out"),
            }
            if last_renew.elapsed() >= self.config.renew_deadline {
                warn!(deadline = ?self.config.renew_deadline, "could not renew the lease in time");
                break;
            }
        }
        info!(identity = %self.config.identity, "stopped leading");
        self.stop_leading();
    }

    fn renewed(&self, sent: Instant) {
        *self.valid_until.lock() = Some(sent + self.config.lease_duration);
    }

    fn stop_leading(&self) {
        self.leading.send_replace(false);
    }

    /// One attempt: true if we hold the lease afterwards.
    async fn try_acquire_or_renew(&self) -> Result<bool, kube_client::Error> {
        let now = Timestamp::now();
        let me = &self.config.identity;
        let duration_secs = self.config.lease_duration.as_secs() as i32;
        let Some(mut lease) = self.api.get_opt(&self.config.lease_name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.lease_name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube_client::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let observed = Observed {
            holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
            renew_time: spec.renew_time.as_ref().map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
        };
        let observed_at = {
            let mut seen = self.observed.lock();
            match &*seen {
                Some((record, at)) if *record == observed => *at,
                _ => {
                    let at = Instant::now();
                    *seen = Some((observed.clone(), at));
                    at
                }
            }
        };
        let held_by_me = observed.holder.as_deref() == Some(me.as_str());
        let lease_secs = spec.lease_duration_seconds.unwrap_or(duration_secs).max(0) as u64;
        let expired = observed_at.elapsed() > Duration::from_secs(lease_secs);
        if observed.holder.is_some() && !held_by_me && !expired {
            return Ok(false);
        }
        let mut new_spec = spec;
        if !held_by_me {
            new_spec.acquire_time = Some(MicroTime(now));
            new_spec.lease_transitions = Some(observed.transitions + 1);
        }
        new_spec.holder_identity = Some(me.clone());
        new_spec.lease_duration_seconds = Some(duration_secs);
        new_spec.renew_time = Some(MicroTime(now));
        lease.spec = Some(new_spec);
        match self
            .api
            .replace(&self.config.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube_client::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the lease up (client-go's ReleaseOnCancel): nobody holds it, and
    /// it expires in a second. Bounded by the renew deadline, so a server
    /// that does not answer cannot hold shutdown up.
    async fn release(&self) {
        if tokio::time::timeout(self.config.renew_deadline, self.try_release())
            .await
            .is_err()
        {
            warn!(lease = %self.config.lease_name, "releasing the lease timed out; it expires instead");
        }
    }

    async fn try_release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.lease_name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        let now = MicroTime(Timestamp::now());
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now.clone());
        spec.acquire_time = Some(now);
        match self
            .api
            .replace(&self.config.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                *self.valid_until.lock() = Some(Instant::now());
                info!(lease = %self.config.lease_name, "released the lease");
            }
            Err(e) => warn!(error = %e, "could not release the lease"),
        }
    }
}

fn jittered(d: Duration) -> Duration {
    // client-go's JitterFactor 1.2.
    d + d.mul_f64(1.2 * fastrand::f64())
}
