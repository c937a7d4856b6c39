//! The ring of a sharded controller: the hash space cut into slots, and the
//! rule that gives each slot to one live replica.
//!
//! The 64-bit hash space of [`shard_hash`]
//! (FNV-1a of `metadata.uid`, what kube-apiserver's sharded list and watch
//! hash) is cut into `slots` equal ranges ([`slot_range`]). Every replica
//! computes the same assignment from the same member list, with no central
//! component ([`assign_slots`]): rendezvous hashing (each slot ranks the
//! members by a hash of member and slot, and goes to the best ranked) with
//! bounded load (a member already holding `ceil(slots / members)` slots is
//! skipped). The rank of a member for a slot does not depend on the other
//! members, so a member coming or going moves the slots it takes or leaves
//! and, through the load bound, few others.
//!
//! Who may *act* on a slot is not this rule but the slot's Lease: a replica
//! takes a slot's Lease only when it is free or expired, and releases it
//! only once its reconciles of that slot have ended (see docs/sharding.md).
//! The rule only says which replica should try.

use kinformer_informer::{HASH_SPACE_END, HashRange, ShardField, ShardSelector, shard_hash};

/// The range of hashes slot `slot` of `slots` covers; `None` unless
/// `slot < slots`.
pub fn slot_range(slot: u32, slots: u32) -> Option<HashRange> {
    HashRange::split(u64::from(slot), u64::from(slots)).ok()
}

/// The slot of `slots` whose range holds `hash`.
pub fn slot_of_hash(hash: u64, slots: u32) -> u32 {
    let slots = u64::from(slots.max(1));
    // The ranges are split at multiples of floor(2^64 / slots), the last
    // one running to 2^64; so the slot is the quotient, capped at the last.
    let span = HASH_SPACE_END / u128::from(slots);
    ((u128::from(hash) / span).min(u128::from(slots - 1))) as u32
}

/// The slot of `slots` an object with this uid belongs to.
pub fn slot_of_uid(uid: &str, slots: u32) -> u32 {
    slot_of_hash(shard_hash(uid), slots)
}

/// The shard selector of a set of slots (by uid); `None` for no slot.
pub fn slots_selector(held: impl IntoIterator<Item = u32>, slots: u32) -> Option<ShardSelector> {
    ShardSelector::new(
        ShardField::Uid,
        held.into_iter().filter_map(|s| slot_range(s, slots)),
    )
    .ok()
}

/// The shard a replica holding `held` watches: the selector of those
/// slots, or, holding none, the range of the single hash 0. A shard cannot
/// be empty; no object's uid hashes to 0 in practice, and one that did
/// would belong to slot 0, which this replica does not hold, so its key
/// would not be reconciled here.
pub fn held_selector(held: impl IntoIterator<Item = u32>, slots: u32) -> ShardSelector {
    slots_selector(held, slots).unwrap_or_else(|| {
        let zero = HashRange::new(0, 1).expect("0..1 is a valid range");
        ShardSelector::new(ShardField::Uid, [zero]).expect("one range makes a selector")
    })
}

/// A member's rank for a slot: higher is better. FNV-1a of the member's
/// name, a NUL and the slot number, then a 64-bit finaliser so that names
/// differing in their last byte still rank independently.
fn rank(member: &str, slot: u32) -> u64 {
    let mut h = shard_hash(&format!("{member}\0{slot}"));
    // splitmix64's finaliser.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58476d1ce4e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d049bb133111eb);
    h ^ (h >> 31)
}

/// Which member should hold each slot: `result[slot]` is an index into
/// `members`. Every replica that sees the same members (in any order, with
/// repeats) computes the same assignment. Each member gets at most
/// `ceil(slots / members)` slots. Empty when there are no members.
pub fn assign_slots(slots: u32, members: &[impl AsRef<str>]) -> Vec<usize> {
    // Work on the sorted, distinct names, then map back to `members`.
    let mut names: Vec<&str> = members.iter().map(AsRef::as_ref).collect();
    names.sort_unstable();
    names.dedup();
    if names.is_empty() {
        return Vec::new();
    }
    let cap = (slots as usize).div_ceil(names.len());
    let mut load = vec![0usize; names.len()];
    let mut owner = Vec::with_capacity(slots as usize);
    let mut ranked: Vec<(u64, usize)> = Vec::with_capacity(names.len());
    for slot in 0..slots {
        ranked.clear();
        ranked.extend(names.iter().enumerate().map(|(i, m)| (rank(m, slot), i)));
        // Best rank first; equal ranks (all but impossible) by name order.
        ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let chosen = ranked
            .iter()
            .map(|&(_, i)| i)
            .find(|&i| load[i] < cap)
            .unwrap_or(ranked[0].1);
        load[chosen] += 1;
        owner.push(chosen);
    }
    owner
        .into_iter()
        .map(|i| {
            members
                .iter()
                .position(|m| m.as_ref() == names[i])
                .unwrap_or_default()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("replica-{i}")).collect()
    }

    fn owners(slots: u32, members: &[String]) -> Vec<String> {
        assign_slots(slots, members)
            .into_iter()
            .map(|i| members[i].clone())
            .collect()
    }

    #[test]
    fn every_replica_computes_the_same_assignment_whatever_the_order() {
        let mut m = members(5);
        let a = owners(64, &m);
        m.reverse();
        m.push("replica-2".into());
        assert_eq!(owners(64, &m), a);
    }

    #[test]
    fn no_member_holds_more_than_its_share() {
        for n in 1..=9 {
            for slots in [1u32, 7, 16, 64, 100] {
                let m = members(n);
                let assigned = assign_slots(slots, &m);
                assert_eq!(assigned.len(), slots as usize);
                let cap = (slots as usize).div_ceil(n);
                for i in 0..n {
                    let held = assigned.iter().filter(|&&o| o == i).count();
                    assert!(held <= cap, "{n} members, {slots} slots: {held} > {cap}");
                }
            }
        }
        assert!(assign_slots(8, &Vec::<String>::new()).is_empty());
    }

    #[test]
    fn a_member_joining_or_leaving_moves_few_slots() {
        let slots = 64;
        for n in 2..=8 {
            let before = owners(slots, &members(n));
            let after = owners(slots, &members(n + 1));
            let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count();
            // At least slots/(n+1) must move to the newcomer; the load bound
            // moves a few more. Far from reshuffling everything.
            let least = slots as usize / (n + 1);
            assert!(moved >= least, "{n}->{}: {moved} moved", n + 1);
            assert!(moved <= 2 * least + n + 1, "{n}->{}: {moved} moved", n + 1);
        }
    }

    #[test]
    fn slots_cover_the_hash_space_once_and_slot_of_hash_agrees_with_the_ranges() {
        for slots in [1u32, 3, 16, 1000] {
            for hash in [0, 1, u64::MAX / 3, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
                let slot = slot_of_hash(hash, slots);
                assert!(slot < slots);
                assert!(
                    slot_range(slot, slots).unwrap().contains(hash),
                    "{hash:#x} in {slots}"
                );
            }
        }
        let all = slots_selector(0..16, 16).unwrap();
        assert_eq!(all.ranges().len(), 1);
        assert!(slots_selector([], 16).is_none());
    }
}
