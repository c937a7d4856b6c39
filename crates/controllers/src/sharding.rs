//! Sharding a controller across replicas: a [`ring`] of hash-space slots,
//! each held by one replica through a Lease ([`slots`]), replicas' member
//! Leases ([`membership`]), and which keys of a controller's queue belong
//! to the slots this replica holds ([`key_slots`]).

pub(crate) mod key_slots;
pub(crate) mod membership;
pub mod ring;
pub(crate) mod slots;
