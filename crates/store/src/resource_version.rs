//! Comparing resourceVersions, as apimachinery's `CompareResourceVersion`
//! (`k8s.io/apimachinery/pkg/util/resourceversion`, v0.37).
//!
//! Since Kubernetes 1.35 (KEP-5504, "Comparable Resource Versions", GA)
//! a resourceVersion of a built-in or custom resource is a decimal integer
//! that grows with every write, checked by conformance up to 2^128 - 1, so
//! two versions *of one resource* can be ordered: a cache synced to a
//! version at or past the one a write returned holds that write or a later
//! state. Versions of different resources are not comparable (they may live
//! in different etcds), and an aggregated API server may still answer
//! versions that are not integers: those are refused, never guessed at.
//!
//! Written by hand: it is ten lines in apimachinery and no crate has it.

use std::cmp::Ordering;

/// A resourceVersion that is not a well-formed one: empty, not all ASCII
/// digits, or with a leading zero ("0" included: it is the list and watch
/// sentinel, never an object's version).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("resource version is not well formed: {0:?}")]
pub struct InvalidResourceVersion(pub String);

/// Orders two resourceVersions of the same resource, as apimachinery's
/// `CompareResourceVersion`: both must be positive decimal integers without
/// leading zeros, of any length; the shorter is the smaller, equal lengths
/// compare digit by digit.
pub fn compare_resource_version(a: &str, b: &str) -> Result<Ordering, InvalidResourceVersion> {
    for rv in [a, b] {
        if !is_well_formed(rv) {
            return Err(InvalidResourceVersion(rv.to_owned()));
        }
    }
    Ok(a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
}

fn is_well_formed(rv: &str) -> bool {
    !rv.is_empty() && !rv.starts_with('0') && rv.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// apimachinery v0.37.2's TestCompareResourceVersion, case by case.
    #[test]
    fn orders_well_formed_versions_and_refuses_the_rest() {
        use Ordering::{Equal, Greater, Less};
        let cases: &[(&str, &str, Option<Ordering>)] = &[
            ("100", "200", Some(Less)),
            ("0", "1", None),
            ("0", "0", None),
            ("200", "100", Some(Greater)),
            ("1", "0", None),
            ("1", "1", Some(Equal)),
            ("100", "100", Some(Equal)),
            ("99", "100", Some(Less)),
            ("100", "99", Some(Greater)),
            ("0100", "100", None),
            ("100", "0100", None),
            ("", "100", None),
            ("100", "", None),
            ("100a", "100", None),
            ("100", "100a", None),
            (
                "99999999999999999999999999999999999999999999999999",
                "100000000000000000000000000000000000000000000000000",
                Some(Less),
            ),
            (
                "100000000000000000000000000000000000000000000000000",
                "99999999999999999999999999999999999999999999999999",
                Some(Greater),
            ),
            (
                "12345678901234567890123456789012345678901234567890",
                "12345678901234567890123456789012345678901234567890",
                Some(Equal),
            ),
            ("١٢٣", "123", None),
            ("-1", "1", None),
            ("+1", "1", None),
        ];
        for &(a, b, expected) in cases {
            assert_eq!(
                compare_resource_version(a, b).ok(),
                expected,
                "{a:?} vs {b:?}"
            );
        }
        assert_eq!(
            compare_resource_version("7", "x").unwrap_err().to_string(),
            "resource version is not well formed: \"x\""
        );
    }
}
