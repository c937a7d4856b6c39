//! RBAC manifests in tests: read what a program prints (`--print-rbac`),
//! take one verb away, and recognise the server's refusal in a log line,
//! to check that a run without a rule fails by naming it.

use std::process::Command;

use serde_json::Value;

use crate::EnvtestError;

/// `manifests` (a `List` of RBAC objects, as `Permissions::manifests`
/// renders them) without `verb` on `resource` in any Role or ClusterRole;
/// a rule left with no verb goes. An error if no rule gave it: a test
/// taking away a rule that was not there would check nothing.
pub fn without(mut manifests: Value, verb: &str, resource: &str) -> Result<Value, EnvtestError> {
    let mut removed = false;
    let items = manifests
        .get_mut("items")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten();
    for item in items {
        let Some(rules) = item.get_mut("rules").and_then(Value::as_array_mut) else {
            continue;
        };
        for rule in rules.iter_mut() {
            let names_it = rule["resources"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r == resource));
            if let (true, Some(verbs)) = (names_it, rule["verbs"].as_array_mut()) {
                let before = verbs.len();
                verbs.retain(|v| v != verb);
                removed |= verbs.len() < before;
            }
        }
        rules.retain(|rule| rule["verbs"].as_array().is_some_and(|v| !v.is_empty()));
    }
    match removed {
        true => Ok(manifests),
        false => Err(EnvtestError::Client(format!(
            "no rule gives {verb} on {resource}"
        ))),
    }
}

/// Whether a log line carries the API server's refusal of `verb` on
/// `resource` (`... cannot watch resource "pods" in API group ...`) as
/// it is or quoted (a log field written with `Debug` escapes the quotes).
pub fn names_refusal(line: &str, verb: &str, resource: &str) -> bool {
    let plain = format!("cannot {verb} resource \"{resource}\"");
    let quoted = format!("cannot {verb} resource \\\"{resource}\\\"");
    line.contains(&plain) || line.contains(&quoted)
}

/// What `command` prints on standard output, read as JSON: the
/// manifests a program's `--print-rbac` gives (a program may need a
/// kubeconfig in its environment to build its client, which it does not
/// use to print). An error carries its standard error.
pub fn printed(command: &mut Command) -> Result<Value, EnvtestError> {
    let what = format!("{command:?}");
    let out = command
        .output()
        .map_err(|e| EnvtestError::Client(format!("running {what}: {e}")))?;
    if !out.status.success() {
        return Err(EnvtestError::Client(format!(
            "{what} exited {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| EnvtestError::Client(format!("what {what} printed is not JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn takes_one_verb_away_and_drops_rules_left_empty() {
        let list = json!({"items": [
            {"kind": "ServiceAccount"},
            {"kind": "Role", "rules": [
                {"resources": ["pods", "services"], "verbs": ["list", "watch"]},
                {"resources": ["leases"], "verbs": ["create"]},
            ]},
        ]});
        let less = without(list.clone(), "watch", "services").unwrap();
        assert_eq!(
            less["items"][1]["rules"][0]["verbs"],
            json!(["list"]),
            "the verb goes from the rule naming the resource"
        );
        let less = without(list.clone(), "create", "leases").unwrap();
        assert_eq!(less["items"][1]["rules"].as_array().unwrap().len(), 1);
        assert!(without(list, "delete", "pods").is_err());
    }

    #[test]
    fn a_refusal_is_recognised_plain_or_quoted() {
        let plain = r#"pods is forbidden: User "x" cannot watch resource "pods" in API group """#;
        let quoted = r#"error="pods is forbidden: User \"x\" cannot watch resource \"pods\"""#;
        for line in [plain, quoted] {
            assert!(names_refusal(line, "watch", "pods"), "{line}");
            assert!(!names_refusal(line, "list", "pods"), "{line}");
            assert!(!names_refusal(line, "watch", "pod"), "{line}");
        }
    }
}
