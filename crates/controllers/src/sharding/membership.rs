//! Membership of a sharded controller's ring: one coordination.k8s.io/v1
//! Lease per replica, renewed while it runs, and the live members as this
//! replica sees them.
//!
//! Liveness is judged as leader election judges a lease: a member is live
//! while its Lease names a holder and has changed within `lease_duration`
//! by *this* replica's clock, since it first saw that version. Clock skew
//! between replicas therefore does not matter; a Lease seen for the first
//! time counts as live for a whole duration. A replica that leaves cleanly
//! deletes its Lease and drops out at once; one that dies drops out once its
//! Lease has not changed for `lease_duration`.
//!
//! Membership only says which replica *should* hold a slot
//! ([`assign_slots`](crate::ring::assign_slots)); who *may* act on a slot is
//! decided by the slot's own Lease.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube_client::Client;
use kube_client::api::{Api, DeleteParams, ListParams, PostParams};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::ControllerError;

/// The label naming the ring a Lease belongs to.
pub const RING_LABEL: &str = "kinformer.dev/ring";
/// The label saying what a ring's Lease is for: `member` or `slot`.
pub const ROLE_LABEL: &str = "kinformer.dev/ring-role";

/// One replica's membership of a ring.
pub struct RingMembership {
    api: Api<Lease>,
    ring: String,
    identity: String,
    lease_name: String,
    lease_duration: Duration,
    /// Per member Lease name: its resourceVersion last seen and when (on
    /// our clock) that version was first seen.
    observed: Mutex<HashMap<String, (String, Instant)>>,
}

impl std::fmt::Debug for RingMembership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingMembership")
            .field("ring", &self.ring)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl RingMembership {
    /// `identity`'s membership of ring `ring`, its Lease in `namespace`.
    pub fn new(
        client: Client,
        namespace: &str,
        ring: &str,
        identity: &str,
        lease_duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            ring: ring.to_owned(),
            identity: identity.to_owned(),
            lease_name: member_lease_name(ring, identity),
            lease_duration,
            observed: Mutex::new(HashMap::new()),
        }
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn error(&self, what: &'static str, source: kube_client::Error) -> ControllerError {
        ControllerError::Ring {
            ring: self.ring.clone(),
            what,
            source,
        }
    }

    /// Creates or renews this replica's member Lease.
    pub async fn heartbeat(&self) -> Result<(), ControllerError> {
        let now = MicroTime(Timestamp::now());
        let spec = LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.lease_duration.as_secs().max(1) as i32),
            renew_time: Some(now.clone()),
            ..LeaseSpec::default()
        };
        let lease = self
            .api
            .get_opt(&self.lease_name)
            .await
            .map_err(|e| self.error("reading the member Lease", e))?;
        let result = match lease {
            Some(mut lease) => {
                lease.spec = Some(LeaseSpec {
                    acquire_time: lease.spec.and_then(|s| s.acquire_time),
                    ..spec
                });
                self.api
                    .replace(&self.lease_name, &PostParams::default(), &lease)
                    .await
            }
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.lease_name.clone()),
                        labels: Some(
                            [
                                (RING_LABEL.to_owned(), self.ring.clone()),
                                (ROLE_LABEL.to_owned(), "member".to_owned()),
                            ]
                            .into(),
                        ),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        acquire_time: Some(now),
                        ..spec
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
        };
        result
            .map(|_| ())
            .map_err(|e| self.error("writing the member Lease", e))
    }

    /// The identities of the live members, sorted, this replica included
    /// once its Lease exists.
    pub async fn live_members(&self) -> Result<Vec<String>, ControllerError> {
        let selector = format!("{RING_LABEL}={},{ROLE_LABEL}=member", self.ring);
        let leases = self
            .api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| self.error("listing the member Leases", e))?;
        let now = Instant::now();
        let mut observed = self.observed.lock();
        let mut live = Vec::new();
        let mut present = Vec::new();
        for lease in leases.items {
            let (Some(name), Some(rv)) = (lease.metadata.name, lease.metadata.resource_version)
            else {
                continue;
            };
            let seen_at = match observed.get(&name) {
                Some((seen_rv, at)) if *seen_rv == rv => *at,
                _ => {
                    observed.insert(name.clone(), (rv, now));
                    now
                }
            };
            present.push(name);
            let holder = lease.spec.and_then(|s| s.holder_identity);
            if let Some(holder) = holder.filter(|h| !h.is_empty())
                && now.duration_since(seen_at) < self.lease_duration
            {
                live.push(holder);
            }
        }
        observed.retain(|name, _| present.contains(name));
        live.sort();
        live.dedup();
        Ok(live)
    }

    /// Leaves the ring: deletes this replica's member Lease, so the others
    /// drop it at their next look instead of after `lease_duration`.
    pub async fn leave(&self) -> Result<(), ControllerError> {
        match self
            .api
            .delete(&self.lease_name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube_client::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.error("deleting the member Lease", e)),
        }
    }
}

/// The member Lease's name: the ring's name and a hash of the identity
/// (identities need not be valid object names).
pub fn member_lease_name(ring: &str, identity: &str) -> String {
    format!(
        "{ring}-member-{:016x}",
        kinformer_informer::shard_hash(identity)
    )
}
