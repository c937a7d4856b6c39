//! Leader election on a coordination.k8s.io/v1 Lease, as client-go's
//! `leaderelection` package (LeaseLock, ReleaseOnCancel).
//!
//! A candidate tries every `retry_period` to take the lease: it may when the
//! lease does not exist, names nobody, names it, or has not been renewed for
//! `lease_duration` as measured on the candidate's own clock since it last
//! saw the lease change (so clock skew between nodes does not matter).
//! Unlike client-go, a candidate also watches the Lease while it waits, so
//! it sees each renewal when it is written rather than at its next try, and
//! it tries again the moment the lease it saw expires or is released: a
//! standby takes over a dead leader's lease within `lease_duration` of its
//! last renewal, not up to two jittered retry periods later. Without the
//! `watch` verb on Leases it sees the lease only through its own reads, and
//! still tries again when the lease it last read expires. The
//! leader renews every `retry_period`; if no renewal succeeds for
//! `renew_deadline` it gives up leadership. On shutdown it releases the lease
//! so a standby can take over at once. Writes use the lease's
//! resourceVersion, so two candidates can never both win.
//!
//! # A deleted Lease is still held
//!
//! A Lease that disappears (`kubectl delete lease`, a namespace clean-up, a
//! backup restore) is treated by every candidate that saw it as held by its
//! last holder for a whole `lease_duration` from the moment the candidate
//! learnt it was gone (its watch's DELETED event, a list without it, or a
//! read answered 404), measured on the candidate's own clock. The leader
//! itself re-creates it at its next renewal and goes on leading. Without
//! this, a standby that saw the deletion on its watch created a fresh Lease
//! within milliseconds and led while the old leader, which had not yet
//! tried to renew, still worked: two leaders for up to a retry period.
//! Counting from the deletion rather than from the last renewal seen also
//! covers a candidate that cannot watch: the holder's last renewal was
//! written before the deletion, so its lease is over before the candidate
//! takes it, whatever renewals the candidate missed.
//!
//! The protection outlasts the records that follow the deletion: a Lease
//! re-created empty (a manifest applied again) or restored from a backup
//! naming anyone, this candidate included, is still taken only once the
//! deleted record's holder is over.
//!
//! What no candidate can know is a holder it never saw: a process started
//! after the Lease was deleted creates it at once, as with client-go; the
//! old leader finds the new holder at its next renewal (within
//! `retry_period`). A sharded ring's slot campaigns, which start with a new
//! candidate whenever slots move, take a missing slot Lease as held by
//! someone unknown for a lease duration instead.
//!
//! # When work may go on
//!
//! [`LeaderElector::may_work`] is true only while the last successful
//! renewal is recent: its send time plus `lease_duration`, less a margin of
//! half the gap between lease duration and renew deadline. Another
//! candidate may take the lease only after it has seen the same record
//! unchanged (or the Lease gone) for `lease_duration` on its own clock,
//! which starts after that send: so no instant exists at which two
//! candidates' `may_work` are both true, whatever the two hosts' clocks
//! read. A release makes `may_work` false before it is written.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube_client::Client;
use kube_client::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::ControllerError;
use crate::reconcile::is_denied;

/// Timing and identity of a leader election. Defaults are client-go's:
/// 15 s lease, 10 s renew deadline, 2 s retry period.
#[derive(Debug, Clone)]
#[non_exhaustive]
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
    /// Checks the timings as client-go does: the lease must outlast the renew
    /// deadline, which must exceed 1.2 retry periods; the gap between lease
    /// and renew deadline is the time a lost leader has to stop its work.
    pub fn validate(&self) -> Result<(), ControllerError> {
        let invalid = |why: String| {
            Err(ControllerError::InvalidLeaderElection {
                lease: format!("{}/{}", self.namespace, self.lease_name),
                why,
            })
        };
        if self.namespace.is_empty() {
            return invalid(
                "the Lease's namespace is empty (out of a pod there is none to default to): \
                 name one with LeaderElectionConfig::namespace (for a ring, RingConfig's namespace)"
                    .into(),
            );
        }
        if self.identity.is_empty() {
            return invalid("the identity is empty".into());
        }
        if self.retry_period.is_zero() {
            return invalid("the retry period is zero".into());
        }
        if self.lease_duration <= self.renew_deadline {
            return invalid(format!(
                "the lease duration ({:?}) must be longer than the renew deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        if self.renew_deadline <= self.retry_period.mul_f64(1.2) {
            return invalid(format!(
                "the renew deadline ({:?}) must be longer than 1.2 retry periods ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.lease_duration > Duration::from_secs(i32::MAX as u64) {
            return invalid(format!(
                "the lease duration ({:?}) is too long",
                self.lease_duration
            ));
        }
        Ok(())
    }

    /// An election on Lease `lease_name` with controller-runtime's defaults
    /// for who and where: this process's
    /// [`default_identity`](Self::default_identity) and the namespace of the pod it runs in
    /// ([`pod_namespace`](Self::pod_namespace)). Out of a cluster there is
    /// no such namespace: an error says to name one with
    /// [`namespace`](Self::namespace). [`new`](Self::new) does the same,
    /// leaving the error to [`validate`](Self::validate) (and so to the
    /// Manager that is given it).
    ///
    /// ```no_run
    /// use kinformer_controllers::LeaderElectionConfig;
    /// let election = LeaderElectionConfig::in_cluster("my-controller")?;
    /// # Ok::<(), kinformer_controllers::ControllerError>(())
    /// ```
    pub fn in_cluster(lease_name: &str) -> Result<Self, ControllerError> {
        let namespace = Self::pod_namespace().ok_or_else(|| {
            ControllerError::InvalidOptions(format!(
                "leader election on Lease {lease_name:?}: not running in a cluster ({SERVICE_ACCOUNT_NAMESPACE} \
                 is not there), so there is no namespace of its own: name one with \
                 LeaderElectionConfig::new(..).namespace(..)"
            ))
        })?;
        Ok(Self::new(lease_name).namespace(&namespace))
    }

    /// This process's identity in an election: its host name, `_` and a
    /// random 128-bit suffix (controller-runtime's hostname and UUID), so
    /// two replicas never share one, even on one host.
    pub fn default_identity() -> String {
        let host = std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
            .unwrap_or_else(|| "unknown-host".into());
        format!(
            "{host}_{:016x}{:016x}",
            fastrand::u64(..),
            fastrand::u64(..)
        )
    }

    /// The namespace of the pod this process runs in, from its service
    /// account (`None` out of a cluster).
    pub fn pod_namespace() -> Option<String> {
        namespace_in(SERVICE_ACCOUNT_NAMESPACE)
    }

    /// An election on the Lease `lease_name` (controller-runtime's
    /// `LeaderElectionID`), with its defaults for the rest: in the namespace
    /// of the pod this runs in ([`pod_namespace`](Self::pod_namespace);
    /// out of a pod, [`validate`](Self::validate) asks for
    /// [`namespace`](Self::namespace)), as this process
    /// ([`default_identity`](Self::default_identity)), with client-go's
    /// timings.
    ///
    /// ```
    /// use kinformer_controllers::LeaderElectionConfig;
    /// let election = LeaderElectionConfig::new("my-controller").namespace("ops");
    /// assert_eq!((election.namespace.as_str(), election.lease_name.as_str()), ("ops", "my-controller"));
    /// ```
    pub fn new(lease_name: &str) -> Self {
        Self {
            namespace: Self::pod_namespace().unwrap_or_default(),
            lease_name: lease_name.to_owned(),
            identity: Self::default_identity(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// The Lease's namespace (controller-runtime's
    /// `LeaderElectionNamespace`) rather than the pod's.
    #[must_use]
    pub fn namespace(mut self, namespace: &str) -> Self {
        namespace.clone_into(&mut self.namespace);
        self
    }

    /// This candidate's identity rather than
    /// [`default_identity`](Self::default_identity)'s: unique per process.
    #[must_use]
    pub fn identity(mut self, identity: &str) -> Self {
        identity.clone_into(&mut self.identity);
        self
    }
}

/// Resolves once `elector` has lost its lease, by its word (`leading`
/// turns false) or by our own clock (past [`LeaderElector::safe_until`]
/// without a renewal).
pub(crate) async fn lease_lost(elector: &LeaderElector, leading: &mut watch::Receiver<bool>) {
    loop {
        let Some(safe) = elector.safe_until() else {
            return;
        };
        tokio::select! {
            _ = leading.wait_for(|leading| !*leading) => return,
            _ = tokio::time::sleep_until(safe) => {
                if !elector.may_work() {
                    return;
                }
            }
        }
    }
}

/// Where a pod's service account says which namespace it runs in.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

fn namespace_in(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|ns| ns.trim().to_owned())
        .filter(|ns| !ns.is_empty())
}

/// One candidate in a leader election.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    leading: watch::Sender<bool>,
    /// The lease record last seen and when (on our clock) it was first seen.
    observed: Mutex<Option<Sighting>>,
    /// Told when the watch of the Lease sees a new record.
    observed_changed: Notify,
    /// While leading: when the last successful renewal was sent, plus the
    /// lease duration.
    valid_until: Mutex<Option<Instant>>,
    /// Whether cancelling `run` releases the lease (client-go's
    /// ReleaseOnCancel); cleared when work may still be running.
    release_on_cancel: AtomicBool,
    /// Whether a Lease missing before this candidate ever saw it is held
    /// by someone unknown for a lease duration (see
    /// [`presume_missing_lease_held`](Self::presume_missing_lease_held)).
    presume_missing_held: AtomicBool,
    /// Requests for the Lease the server refused (401, 403).
    denied: Counter,
}

/// What one acquire-or-renew attempt found.
enum Attempt {
    /// We hold the lease.
    Held,
    /// Another candidate holds an unexpired lease.
    Other,
    /// Our write lost a race (409): the lease changed since we read it.
    Conflict,
}

#[derive(Debug, Clone, PartialEq)]
struct Observed {
    holder: Option<String>,
    renew_time: Option<Timestamp>,
    transitions: i32,
    /// The lease duration the record states, in seconds.
    lease_secs: u64,
    /// The Lease object's uid: a Lease deleted and restored with the same
    /// record between two reads is a new record, first seen at the second.
    uid: Option<String>,
    /// The Lease was found deleted: this is its last record, held by its
    /// holder for `lease_secs` from when the deletion was seen.
    gone: bool,
}

/// A lease record and when this candidate first saw it.
#[derive(Debug, Clone)]
struct Sighting {
    record: Observed,
    /// When it was first seen, on this candidate's clock.
    at: Instant,
    /// A deleted Lease seen before this record still protects its last
    /// holder until then, whatever this record says (a Lease re-created
    /// empty by a manifest, a restore of an older record).
    not_before: Option<Instant>,
}

impl Sighting {
    /// Until when someone else holds the lease as far as `me` can tell:
    /// `None` if it may be taken now (nobody holds it, or `me` does).
    /// It may be taken strictly after the instant returned.
    fn taken_until(&self, me: &str) -> Option<Instant> {
        let held = match self.record.holder.as_deref() {
            // A record naming this candidate that follows a deletion (a
            // restore) still waits for the deleted Lease's holder.
            Some(h) if h == me => return self.not_before,
            Some(_) => Some(self.at + Duration::from_secs(self.record.lease_secs)),
            None => None,
        };
        held.max(self.not_before)
    }

    fn may_take(&self, me: &str) -> bool {
        self.taken_until(me).is_none_or(|t| Instant::now() > t)
    }
}

impl Observed {
    fn of(lease: &Lease, own_secs: i32) -> Self {
        let spec = lease.spec.as_ref();
        Self {
            uid: lease.metadata.uid.clone(),
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty()),
            renew_time: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
            transitions: spec.and_then(|s| s.lease_transitions).unwrap_or(0),
            lease_secs: spec
                .and_then(|s| s.lease_duration_seconds)
                .unwrap_or(own_secs)
                .max(0) as u64,
            gone: false,
        }
    }
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
            observed_changed: Notify::new(),
            valid_until: Mutex::new(None),
            release_on_cancel: AtomicBool::new(true),
            presume_missing_held: AtomicBool::new(false),
            denied: Counter::default(),
        }
    }

    /// Counts refused requests into `counter` (the Manager's metric)
    /// rather than a counter of its own.
    pub(crate) fn count_denied_in(mut self, counter: Counter) -> Self {
        self.denied = counter;
        self
    }

    /// How many requests for the Lease (read, acquire, renew, watch,
    /// release) the server refused for the credentials (401, 403: RBAC
    /// without that verb on the Lease). Each is logged with the server's
    /// message, which names the verb, resource and namespace; a candidate
    /// refused keeps trying, and never leads on a Lease it cannot write.
    pub fn denied(&self) -> u64 {
        self.denied.get()
    }

    /// Counts `error` if it is a refusal.
    fn note(&self, error: &kube_client::Error) {
        if is_denied(error) {
            self.denied.inc();
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

    /// Until when work may go on: the lease's validity less a safety margin
    /// of half the gap between lease duration and renew deadline (2.5 s with
    /// client-go's timings), for timers that fire late on a loaded machine.
    /// `None` before this candidate first led.
    pub fn safe_until(&self) -> Option<Instant> {
        let margin = self
            .config
            .lease_duration
            .saturating_sub(self.config.renew_deadline)
            / 2;
        let valid = self.lease_valid_until()?;
        Some(valid.checked_sub(margin).unwrap_or(valid))
    }

    /// Whether this candidate leads and its lease is safely its own now.
    pub fn may_work(&self) -> bool {
        self.is_leader() && self.safe_until().is_some_and(|t| Instant::now() < t)
    }

    /// On cancel, stop renewing but leave the lease to expire instead of
    /// releasing it: for when reconciles may still be running.
    pub(crate) fn keep_lease_on_cancel(&self) {
        self.release_on_cancel.store(false, Ordering::SeqCst);
    }

    /// A Lease found missing before this candidate ever saw it is taken
    /// as held by someone unknown until a lease duration later: for a
    /// candidate that may campaign for a Lease deleted under a holder it
    /// never watched (a ring's slot after a rebalance), at the cost of that
    /// wait when the Lease never existed.
    pub(crate) fn presume_missing_lease_held(&self) {
        self.presume_missing_held.store(true, Ordering::SeqCst);
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

    /// Who holds the lease as this candidate last saw it (client-go's
    /// `GetLeader`): through its own reads and writes and, while it waits,
    /// its watch of the Lease. `None` before it has seen the Lease, or when
    /// nobody holds it.
    pub fn leader(&self) -> Option<String> {
        self.observed.lock().as_ref()?.record.holder.clone()
    }

    /// Campaigns, then leads, until `shutdown` fires (the lease is then
    /// released) or leadership is lost (then it returns, leading false).
    /// It campaigns once: after a loss a new elector (a new process) must.
    pub async fn run(&self, shutdown: CancellationToken) {
        let retry = self.config.retry_period;
        // Acquire: try, then wait for the next retry or for the lease seen
        // to expire, whichever comes first, following the Lease meanwhile.
        let mut last_renew = {
            let watching = self.watch_lease();
            tokio::pin!(watching);
            loop {
                let sent = Instant::now();
                let held_by_other = tokio::select! {
                    // The attempt cut off may have written the Lease: give
                    // it back if so, rather than leave it to expire.
                    _ = shutdown.cancelled() => {
                        self.release().await;
                        return;
                    }
                    never = &mut watching => match never {},
                    attempt = self.attempt(self.config.renew_deadline) => match attempt {
                        Ok(Attempt::Held) => {
                            self.renewed(sent);
                            break sent;
                        }
                        Ok(Attempt::Other) => {
                            debug!(lease = %self.config.lease_name, "lease held by another candidate");
                            true
                        }
                        Ok(Attempt::Conflict) => false,
                        Err(e) => {
                            warn!(error = %e, "cannot read or write the lease");
                            false
                        }
                    },
                };
                let retry_at = Instant::now() + jittered(retry);
                loop {
                    // After an error, only the retry period: never a busy loop.
                    // A little jitter, so standbys woken by one event do
                    // not all write at once.
                    let wake = match self.expiry().filter(|_| held_by_other) {
                        Some(expiry) => {
                            let jitter = Duration::from_millis(fastrand::u64(0..25));
                            (expiry + jitter).min(retry_at)
                        }
                        None => retry_at,
                    };
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        () = tokio::time::sleep_until(wake) => break,
                        () = self.observed_changed.notified() => {}
                        never = &mut watching => match never {},
                    }
                }
            }
        };
        info!(identity = %self.config.identity, lease = %self.config.lease_name, "became the leader");
        self.leading.send_replace(true);
        // Renew. The deadline counts from when the last successful renewal
        // was sent, as its validity does; every attempt ends by it, so a
        // hanging request cannot delay the loss past it.
        loop {
            let attempt = async {
                tokio::time::sleep(retry).await;
                let remaining = self
                    .config
                    .renew_deadline
                    .saturating_sub(last_renew.elapsed());
                let sent = Instant::now();
                (sent, self.attempt(remaining).await)
            };
            let (sent, attempt) = tokio::select! {
                _ = shutdown.cancelled() => {
                    if self.release_on_cancel.load(Ordering::SeqCst) {
                        self.release().await;
                    } else {
                        warn!(lease = %self.config.lease_name, "not releasing the lease: work may still be running; it expires instead");
                    }
                    self.stop_leading();
                    return;
                }
                done = attempt => done,
            };
            match attempt {
                Ok(Attempt::Held) => {
                    self.renewed(sent);
                    last_renew = sent;
                }
                Ok(Attempt::Other) => {
                    warn!("the lease was taken by another candidate");
                    *self.valid_until.lock() = Some(Instant::now());
                    break;
                }
                // Our own earlier write may have landed, or someone edited
                // the Lease: read it again at the next try.
                Ok(Attempt::Conflict) => warn!("conflict renewing the lease; retrying"),
                Err(e) => warn!(error = %e, "failed to renew the lease"),
            }
            if last_renew.elapsed() >= self.config.renew_deadline {
                warn!(deadline = ?self.config.renew_deadline, "could not renew the lease in time");
                break;
            }
        }
        info!(identity = %self.config.identity, "stopped leading");
        self.stop_leading();
    }

    /// One attempt to acquire or renew, ended after `limit`.
    async fn attempt(&self, limit: Duration) -> Result<Attempt, String> {
        match tokio::time::timeout(limit, self.try_acquire_or_renew()).await {
            Ok(result) => result.map_err(|e| {
                self.note(&e);
                e.to_string()
            }),
            Err(_) => Err(format!("no answer within {limit:?}")),
        }
    }

    fn renewed(&self, sent: Instant) {
        *self.valid_until.lock() = Some(sent + self.config.lease_duration);
    }

    fn stop_leading(&self) {
        self.leading.send_replace(false);
    }

    /// One attempt: whether we hold the lease afterwards.
    async fn try_acquire_or_renew(&self) -> Result<Attempt, kube_client::Error> {
        let now = Timestamp::now();
        let me = &self.config.identity;
        let duration_secs = lease_seconds(self.config.lease_duration);
        let Some(mut lease) = self.api.get_opt(&self.config.lease_name).await? else {
            // Gone: held by its last holder until a lease duration after we
            // learnt so (see the module docs); the leader re-creates it.
            let last = self.observe_gone().or_else(|| {
                self.presume_missing_held
                    .load(Ordering::SeqCst)
                    .then(|| self.presume_held_by_someone())
            });
            if last.as_ref().is_some_and(|seen| !seen.may_take(me)) {
                return Ok(Attempt::Other);
            }
            let transitions = last.map_or(0, |seen| {
                seen.record.transitions + i32::from(seen.record.holder.as_ref() != Some(me))
            });
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
                    lease_transitions: Some(transitions),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(written) => {
                    self.observe(&written);
                    Ok(Attempt::Held)
                }
                Err(kube_client::Error::Api(s)) if s.code == 409 => Ok(Attempt::Conflict),
                Err(e) => Err(e),
            };
        };
        let seen = self.observe(&lease);
        let spec = lease.spec.take().unwrap_or_default();
        let held_by_me = seen.record.holder.as_deref() == Some(me.as_str());
        if !seen.may_take(me) {
            return Ok(Attempt::Other);
        }
        let observed = seen.record;
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
            Ok(written) => {
                self.observe(&written);
                Ok(Attempt::Held)
            }
            // 404: deleted since we read it; read again at the next try.
            Err(kube_client::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                Ok(Attempt::Conflict)
            }
            Err(e) => Err(e),
        }
    }

    /// Records the record of `lease` as seen now, unless it is the one
    /// already seen: that keeps its first sighting. Returns the record and
    /// when it was first seen.
    fn observe(&self, lease: &Lease) -> Sighting {
        self.record(Observed::of(
            lease,
            lease_seconds(self.config.lease_duration),
        ))
    }

    /// Records that the Lease is gone: its last record, if any was seen,
    /// marked gone, first seen now unless its deletion was seen before.
    /// A Lease last seen free is presumed held by someone unknown instead:
    /// someone may have taken it since (a candidate that cannot watch sees
    /// only its own reads).
    fn observe_gone(&self) -> Option<Sighting> {
        let last = self.observed.lock().as_ref()?.record.clone();
        if last.holder.is_none() && !last.gone {
            return Some(self.presume_held_by_someone());
        }
        Some(self.record(Observed { gone: true, ..last }))
    }

    /// Records a missing Lease never seen before as held by someone unknown
    /// for a lease duration from now.
    fn presume_held_by_someone(&self) -> Sighting {
        let now = Instant::now();
        let sighting = Sighting {
            record: Observed {
                holder: None,
                renew_time: None,
                transitions: 0,
                lease_secs: 0,
                uid: None,
                gone: true,
            },
            at: now,
            not_before: Some(now + self.config.lease_duration),
        };
        *self.observed.lock() = Some(sighting.clone());
        sighting
    }

    fn record(&self, observed: Observed) -> Sighting {
        let mut seen = self.observed.lock();
        if let Some(same) = seen.as_ref().filter(|s| s.record == observed) {
            return same.clone();
        }
        let now = Instant::now();
        // A deletion protects its last holder past the records that follow.
        let not_before = seen.as_ref().and_then(|prev| {
            let gone = (prev.record.gone
                && prev.record.holder.as_ref() != Some(&self.config.identity))
            .then(|| prev.taken_until(&self.config.identity))
            .flatten();
            gone.max(prev.not_before).filter(|t| *t > now)
        });
        let sighting = Sighting {
            record: observed,
            at: now,
            not_before,
        };
        *seen = Some(sighting.clone());
        sighting
    }

    /// When the lease last seen may be taken: at once if it names nobody,
    /// else just after its duration since it was first seen (or, for a
    /// deleted Lease, since its deletion was seen). `None` if no lease has
    /// been seen or it names this candidate.
    fn expiry(&self) -> Option<Instant> {
        let seen = self.observed.lock();
        let seen = seen.as_ref()?;
        match seen.taken_until(&self.config.identity) {
            // `may_take` is strictly after.
            Some(until) => Some(until + EXPIRY_MARGIN),
            None if seen.record.holder.is_none() => Some(seen.at),
            None => None,
        }
    }

    /// Follows the Lease, recording each new record when it is written and
    /// telling the campaign. It starts from a list of the one Lease (whose
    /// version is current however long ago the Lease was written), resumes
    /// at once after the server ends a watch, lists again when the version
    /// has expired, and waits longer after each failure in a row (warning
    /// at the first), so a candidate not allowed to watch Leases costs a
    /// request every few retry periods and goes on by its reads alone.
    async fn watch_lease(&self) -> std::convert::Infallible {
        let fields = format!("metadata.name={}", self.config.lease_name);
        let params = WatchParams::default().fields(&fields).timeout(290);
        let (mut from, mut failures) = (None::<String>, 0u32);
        loop {
            let began = Instant::now();
            let ended = match from.take() {
                Some(version) => self.follow(&params, version).await,
                None => match self.api.list(&ListParams::default().fields(&fields)).await {
                    Ok(list) => {
                        if list.items.is_empty() {
                            self.seen_gone();
                        }
                        for lease in list.items {
                            self.seen(&lease);
                        }
                        let version = list.metadata.resource_version.unwrap_or_default();
                        self.follow(&params, version).await
                    }
                    Err(e) => {
                        self.note(&e);
                        Ended::Failed(e.to_string())
                    }
                },
            };
            let why = match ended {
                // A watch that lasted: go on from where it ended.
                Ended::Resume(version) if began.elapsed() >= self.config.retry_period => {
                    (from, failures) = (Some(version), 0);
                    continue;
                }
                Ended::Resume(version) => {
                    from = Some(version);
                    "the watch ended at once".to_owned()
                }
                // An expired version: list again, at once if the watch
                // lasted (a watch that expires at once counts as a failure,
                // so a server doing that is not asked in a busy loop).
                Ended::Relist if began.elapsed() >= self.config.retry_period => {
                    failures = 0;
                    continue;
                }
                Ended::Relist => "the watch's version expired at once".to_owned(),
                Ended::Failed(why) => why,
            };
            failures += 1;
            if failures == 1 {
                warn!(lease = %self.config.lease_name, error = %why, "cannot watch the Lease; going on with reads, and trying again");
            }
            tokio::time::sleep(self.config.retry_period * failures.min(8)).await;
        }
    }

    /// One watch of the Lease from `version`, until it ends.
    async fn follow(&self, params: &WatchParams, version: String) -> Ended {
        let events = match self.api.watch(params, &version).await {
            Ok(events) => events,
            Err(e) => {
                self.note(&e);
                return Ended::Failed(e.to_string());
            }
        };
        tokio::pin!(events);
        let mut last = version;
        while let Some(event) = events.next().await {
            match event {
                Ok(WatchEvent::Added(lease) | WatchEvent::Modified(lease)) => {
                    last = lease.metadata.resource_version.clone().unwrap_or(last);
                    self.seen(&lease);
                }
                Ok(WatchEvent::Deleted(lease)) => {
                    last = lease.metadata.resource_version.clone().unwrap_or(last);
                    // Its last state, in case a renewal was missed; still
                    // held by that holder (see the module docs).
                    self.observe(&lease);
                    self.seen_gone();
                }
                Ok(WatchEvent::Bookmark(b)) => last = b.metadata.resource_version,
                Ok(WatchEvent::Error(e)) if e.code == 410 => return Ended::Relist,
                Ok(WatchEvent::Error(e)) => {
                    if matches!(e.code, 401 | 403) {
                        self.denied.inc();
                    }
                    return Ended::Failed(e.message);
                }
                Err(e) => {
                    self.note(&e);
                    return Ended::Failed(e.to_string());
                }
            }
        }
        Ended::Resume(last)
    }

    /// Records `lease` as seen now (see [`observe`](Self::observe)) and
    /// tells the campaign.
    fn seen(&self, lease: &Lease) {
        self.observe(lease);
        self.observed_changed.notify_one();
    }

    /// Records the Lease as gone (see [`observe_gone`](Self::observe_gone))
    /// and tells the campaign.
    fn seen_gone(&self) {
        self.observe_gone();
        self.observed_changed.notify_one();
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
        // A renewal cut off by the shutdown may land between our read and
        // our write (409): read again, a few times.
        for _ in 0..3 {
            if !self.try_release_once().await {
                return;
            }
        }
        warn!(lease = %self.config.lease_name, "could not release the lease: it kept changing; it expires instead");
    }

    /// One read and release; whether it lost a race and may be tried again.
    async fn try_release_once(&self) -> bool {
        let mut lease = match self.api.get_opt(&self.config.lease_name).await {
            Ok(Some(lease)) => lease,
            Ok(None) => return false,
            Err(e) => {
                self.note(&e);
                warn!(error = %e, "could not read the lease to release it; it expires instead");
                return false;
            }
        };
        let Some(spec) = lease.spec.as_mut() else {
            return false;
        };
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return false;
        }
        // Work stops before the lease is offered: a standby may take it the
        // moment the write lands, before its answer reaches us.
        *self.valid_until.lock() = Some(Instant::now());
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
            Ok(written) => {
                // As client-go, the release is what this candidate last saw.
                self.observe(&written);
                info!(lease = %self.config.lease_name, "released the lease");
                false
            }
            Err(kube_client::Error::Api(s)) if s.code == 409 => true,
            Err(e) => {
                self.note(&e);
                warn!(error = %e, "could not release the lease; it expires instead");
                false
            }
        }
    }
}

/// The lease duration as written into the Lease: whole seconds, rounded up,
/// so a standby never waits less than this candidate counts on.
fn lease_seconds(d: Duration) -> i32 {
    let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    i32::try_from(secs).unwrap_or(i32::MAX)
}

/// How one watch of the Lease ended.
enum Ended {
    /// The server ended it: go on from this version.
    Resume(String),
    /// Its version expired (410): list again.
    Relist,
    /// It failed, for this reason.
    Failed(String),
}

/// How long after a lease's expiry (as this candidate counts it) it tries:
/// the expiry test is strict, and timers may fire a little early.
const EXPIRY_MARGIN: Duration = Duration::from_millis(5);

fn jittered(d: Duration) -> Duration {
    // client-go's JitterFactor 1.2.
    d + d.mul_f64(1.2 * fastrand::f64())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kinformer_informer::testing::FakeApiServer;

    use super::*;

    #[test]
    fn default_identities_are_the_host_name_and_a_suffix_never_shared() {
        let (a, b) = (
            LeaderElectionConfig::default_identity(),
            LeaderElectionConfig::default_identity(),
        );
        assert_ne!(a, b, "two replicas on one host");
        let (host, suffix) = a.rsplit_once('_').unwrap();
        assert!(!host.is_empty());
        assert_eq!(suffix.len(), 32, "{a}");
    }

    #[test]
    fn the_pods_namespace_is_read_from_its_service_account_and_absent_out_of_a_cluster() {
        let dir = std::env::temp_dir().join(format!("kinformer-ns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("namespace");
        std::fs::write(&file, "web\n").unwrap();
        assert_eq!(namespace_in(file.to_str().unwrap()).as_deref(), Some("web"));
        assert_eq!(namespace_in(dir.join("absent").to_str().unwrap()), None);
        std::fs::remove_dir_all(&dir).unwrap();
        if LeaderElectionConfig::pod_namespace().is_none() {
            let e = LeaderElectionConfig::in_cluster("c")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("not running in a cluster")
                    && e.contains("LeaderElectionConfig::new(..).namespace(..)"),
                "{e}"
            );
        }
    }

    fn config(lease: u64, renew: u64, retry: u64) -> LeaderElectionConfig {
        let mut c = LeaderElectionConfig::new("lease")
            .namespace("ns")
            .identity("me");
        c.lease_duration = Duration::from_millis(lease);
        c.renew_deadline = Duration::from_millis(renew);
        c.retry_period = Duration::from_millis(retry);
        c
    }

    #[test]
    fn a_lease_without_a_namespace_is_refused_naming_what_to_set() {
        let election = LeaderElectionConfig::new("mine").namespace("");
        let e = election.validate().unwrap_err().to_string();
        assert!(
            e.contains("namespace is empty") && e.contains("LeaderElectionConfig::namespace"),
            "{e}"
        );
        let named = LeaderElectionConfig::new("mine")
            .namespace("ops")
            .identity("me");
        assert!(named.validate().is_ok());
        assert_eq!(
            (named.namespace.as_str(), named.identity.as_str()),
            ("ops", "me")
        );
        let default = LeaderElectionConfig::new("mine");
        assert_eq!(
            Some(default.namespace),
            LeaderElectionConfig::pod_namespace().or(Some(String::new()))
        );
        assert!(!default.identity.is_empty());
    }

    #[test]
    fn timings_that_leave_a_lost_leader_no_time_to_stop_are_rejected() {
        assert!(config(15_000, 10_000, 2_000).validate().is_ok());
        for (bad, what) in [
            (config(10_000, 10_000, 2_000), "lease duration"),
            (config(15_000, 2_000, 2_000), "1.2 retry periods"),
            (config(15_000, 10_000, 0), "retry period is zero"),
        ] {
            let err = bad.validate().unwrap_err().to_string();
            assert!(err.contains(what) && err.contains("ns/lease"), "{err}");
        }
    }

    /// A client whose every request is answered with one status: 404 for
    /// the tests that only look at what a candidate records.
    fn answering(code: u16) -> Client {
        let api = FakeApiServer::new();
        api.refuse("*", "*", code);
        api.client()
    }

    fn candidate(identity: &str) -> LeaderElector {
        let mut config = config(3_000, 2_000, 500);
        config.identity = identity.into();
        LeaderElector::new(answering(404), config)
    }

    #[tokio::test]
    async fn the_leader_gate_stops_a_worker_of_a_candidate_that_does_not_lead() {
        use crate::gate::{Admission, Gate, Leader};
        let gate = Leader(Arc::new(candidate("a")));
        assert_eq!(
            gate.admit(
                &"ns/a".parse().unwrap(),
                kinformer_workqueue::Priority::High
            ),
            Admission::Stop
        );
    }

    #[tokio::test(start_paused = true)]
    async fn refused_requests_for_the_lease_are_counted_and_it_never_leads() {
        let forbidden = answering(403);
        let elector = Arc::new(LeaderElector::new(forbidden, config(3_000, 2_000, 500)));
        let stop = CancellationToken::new();
        let running = tokio::spawn({
            let (elector, stop) = (Arc::clone(&elector), stop.clone());
            async move { elector.run(stop).await }
        });
        let mut leading = elector.subscribe();
        // Retried every retry period (under paused time: at once): its
        // reads of the Lease, and its list for the watch.
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(elector.denied() >= 10, "{}", elector.denied());
        assert!(!*leading.borrow_and_update() && !elector.is_leader());
        stop.cancel();
        running.await.unwrap();
    }

    fn lease(uid: &str, holder: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("lease".into()),
                uid: Some(uid.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(3),
                ..LeaseSpec::default()
            }),
        }
    }

    /// A Lease deleted and restored with the very record a candidate saw
    /// before (a backup) between two of its reads is a new object: its
    /// duration counts from the second read, not the first, since its
    /// holder may have renewed in between. Before, the same record kept its
    /// first sighting.
    #[tokio::test(start_paused = true)]
    async fn a_lease_restored_with_a_record_seen_before_is_timed_from_when_the_restore_is_seen() {
        let me = candidate("me");
        let first = me.observe(&lease("1", Some("other")));
        tokio::time::advance(Duration::from_secs(2)).await;
        let restored = me.observe(&lease("2", Some("other")));
        assert!(
            restored.at > first.at,
            "the restore kept the first sighting"
        );
        assert!(!restored.may_take("me"));
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert!(!restored.may_take("me"), "taken 3.5 s after the first read");
        // The same object read again keeps its sighting.
        assert_eq!(me.observe(&lease("2", Some("other"))).at, restored.at);
    }

    /// A Lease last seen free and then found deleted may have been taken in
    /// between by someone this candidate did not see (it cannot watch, or
    /// lost the race to take it): held by someone unknown for a lease
    /// duration. Before, it was created at once.
    #[tokio::test(start_paused = true)]
    async fn a_lease_last_seen_free_then_found_deleted_is_presumed_held_for_a_lease_duration() {
        let me = candidate("me");
        me.observe(&lease("1", None));
        let gone = me.observe_gone().unwrap();
        assert!(!gone.may_take("me"));
        tokio::time::advance(Duration::from_millis(2_900)).await;
        assert!(!me.observe_gone().unwrap().may_take("me"));
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(me.observe_gone().unwrap().may_take("me"));
        assert_eq!(me.leader(), None);
    }

    /// A deleted Lease protects its holder through what follows: a Lease
    /// re-created empty, or restored naming this very candidate, is not
    /// taken before the deleted holder's lease duration from the deletion.
    #[tokio::test(start_paused = true)]
    async fn records_that_follow_a_deletion_wait_for_the_deleted_holder() {
        for (holder, uid) in [(None, "2"), (Some("me"), "3"), (Some("stranger"), "4")] {
            let me = candidate("me");
            me.observe(&lease("1", Some("leader")));
            me.observe_gone();
            tokio::time::advance(Duration::from_millis(500)).await;
            let next = me.observe(&lease(uid, holder));
            assert!(!next.may_take("me"), "{holder:?} taken at once");
            tokio::time::advance(Duration::from_millis(2_600)).await;
            assert!(
                me.observe(&lease(uid, holder)).may_take("me") == (holder != Some("stranger")),
                "{holder:?}"
            );
        }
    }

    #[test]
    fn the_written_lease_duration_is_rounded_up_to_whole_seconds() {
        assert_eq!(lease_seconds(Duration::from_millis(2_500)), 3);
        assert_eq!(lease_seconds(Duration::from_millis(900)), 1);
        assert_eq!(lease_seconds(Duration::from_secs(15)), 15);
        assert_eq!(lease_seconds(Duration::MAX), i32::MAX);
    }
}
