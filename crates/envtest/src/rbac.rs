//! RBAC manifests in tests: read what a program prints (`--print-rbac`),
//! take one verb away, follow the program's log and recognise the
//! server's refusal in a line, to check that a run without a rule fails
//! by naming it (and that one with every rule logs no refusal).

use std::process::Command;

use serde_json::Value;

use crate::EnvtestError;

/// `manifests` (a `List` of RBAC objects, as `Permissions::manifests`
/// renders them) without `verb` on `resource` in any Role or ClusterRole,
/// and nothing else taken away: a rule naming other resources too keeps
/// `verb` for them (`resource` moves to a rule of its own with the other
/// verbs), and a rule left with no verb goes. An error if no rule gave
/// it: a test taking away a rule that was not there would check nothing.
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
        let mut split = Vec::new();
        for rule in rules.iter_mut() {
            let gives = |rule: &Value, key: &str, value: &str| {
                rule[key]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|v| v == value))
            };
            if !gives(rule, "resources", resource) || !gives(rule, "verbs", verb) {
                continue;
            }
            removed = true;
            let mut alone = rule.clone();
            alone["resources"] = Value::from(vec![resource]);
            if let Some(verbs) = alone["verbs"].as_array_mut() {
                verbs.retain(|v| v != verb);
            }
            if let Some(others) = rule["resources"].as_array_mut() {
                others.retain(|r| r != resource);
            }
            split.push(alone);
        }
        rules.extend(split);
        rules.retain(|rule| {
            let some = |key: &str| rule[key].as_array().is_some_and(|a| !a.is_empty());
            some("verbs") && some("resources")
        });
    }
    match removed {
        true => Ok(manifests),
        false => Err(EnvtestError::Client(format!(
            "no rule gives {verb} on {resource}"
        ))),
    }
}

/// `manifests` with each ClusterRole and ClusterRoleBinding named
/// `NAME-suffix`: cluster-wide names of their own for one run, so that
/// the API server's authorizer, which learns of RBAC changes a moment
/// later, never judges a run by the rules of the run before it.
pub fn unique(mut manifests: Value, suffix: &str) -> Value {
    let items = manifests
        .get_mut("items")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten();
    for item in items {
        let cluster_role = item["kind"] == "ClusterRole";
        let binding = item["kind"] == "ClusterRoleBinding";
        if cluster_role || binding {
            let name = format!(
                "{}-{suffix}",
                item["metadata"]["name"].as_str().unwrap_or("")
            );
            item["metadata"]["name"] = Value::from(name);
        }
        if binding {
            let role = format!(
                "{}-{suffix}",
                item["roleRef"]["name"].as_str().unwrap_or("")
            );
            item["roleRef"]["name"] = Value::from(role);
        }
    }
    manifests
}

/// A program's log lines, read as they come from its standard error (or
/// any pipe): wait for one, or look at all so far.
pub struct Log {
    lines: tokio::sync::watch::Receiver<Vec<String>>,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("lines", &self.lines.borrow().len())
            .finish()
    }
}

impl Log {
    /// Follows `pipe` until it closes (a task on the current runtime).
    pub fn follow(pipe: impl tokio::io::AsyncRead + Unpin + Send + 'static) -> Self {
        use tokio::io::AsyncBufReadExt;
        let (tx, lines) = tokio::sync::watch::channel(Vec::new());
        tokio::spawn(async move {
            let mut pipe = tokio::io::BufReader::new(pipe).lines();
            while let Ok(Some(line)) = pipe.next_line().await {
                tx.send_modify(|lines| lines.push(line));
            }
        });
        Self { lines }
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.borrow().clone()
    }

    /// The first line, so far or within 30 s, carrying the server's refusal
    /// of `verb` on `resource` ([`names_refusal`]).
    pub async fn wait_for_refusal(
        &self,
        verb: &str,
        resource: &str,
    ) -> Result<String, EnvtestError> {
        let limit = std::time::Duration::from_secs(30);
        self.wait_for(limit, |l| names_refusal(l, verb, resource))
            .await
    }

    /// The lines so far that carry an authorization refusal by the API
    /// server: none for a program bound to every rule it needs.
    pub fn refusals(&self) -> Vec<String> {
        let refused = |l: &&String| is_refusal(l);
        self.lines
            .borrow()
            .iter()
            .filter(refused)
            .cloned()
            .collect()
    }

    /// The first line, so far or to come within `limit`, that `wanted`
    /// accepts; an error listing what was logged if none comes.
    pub async fn wait_for(
        &self,
        limit: std::time::Duration,
        wanted: impl Fn(&str) -> bool,
    ) -> Result<String, EnvtestError> {
        let mut lines = self.lines.clone();
        let found = tokio::time::timeout(limit, async {
            loop {
                if let Some(line) = lines.borrow_and_update().iter().find(|l| wanted(l)) {
                    return Some(line.clone());
                }
                if lines.changed().await.is_err() {
                    return None;
                }
            }
        })
        .await;
        match found {
            Ok(Some(line)) => Ok(line),
            _ => Err(EnvtestError::Client(format!(
                "no such line within {limit:?}; logged:\n{}",
                self.lines().join("\n")
            ))),
        }
    }
}

/// One request a rule grants, as a SubjectAccessReview asks about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    /// The verb.
    pub verb: String,
    /// The API group ("" for the core group).
    pub group: String,
    /// The resource, without its subresource.
    pub resource: String,
    /// The subresource ("" for none).
    pub subresource: String,
    /// The object's name, for a rule limited to names ("" otherwise).
    pub name: String,
}

/// Every request the Roles and ClusterRoles of `manifests` grant, with
/// the namespace a Role's apply in (`None` for a ClusterRole's), one per
/// verb, group, resource and name.
pub fn granted(manifests: &Value) -> Vec<(Option<String>, Granted)> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| Some(s.as_str()?.to_owned()))
            .collect()
    };
    let mut out = Vec::new();
    for item in manifests["items"].as_array().into_iter().flatten() {
        let scope = match item["kind"].as_str() {
            Some("Role") => item["metadata"]["namespace"].as_str().map(str::to_owned),
            Some("ClusterRole") => None,
            _ => continue,
        };
        for rule in item["rules"].as_array().into_iter().flatten() {
            let names = match strings(&rule["resourceNames"]) {
                names if names.is_empty() => vec![String::new()],
                names => names,
            };
            for verb in strings(&rule["verbs"]) {
                for group in strings(&rule["apiGroups"]) {
                    for resource in strings(&rule["resources"]) {
                        let (resource, subresource) = match resource.split_once('/') {
                            Some((r, s)) => (r.to_owned(), s.to_owned()),
                            None => (resource, String::new()),
                        };
                        for name in &names {
                            out.push((
                                scope.clone(),
                                Granted {
                                    verb: verb.clone(),
                                    group: group.clone(),
                                    resource: resource.clone(),
                                    subresource: subresource.clone(),
                                    name: name.clone(),
                                },
                            ));
                        }
                    }
                }
            }
        }
    }
    out
}

/// A kubeconfig acting as the ServiceAccount `account` of `namespace`,
/// bound to what `print` prints (a program's `--print-rbac`, run with the
/// test environment's kubeconfig) less `take_away` (verb, resource), its
/// ClusterRoles named for `namespace` ([`unique`]); returned once the
/// authorizer grants every rule ([`TestEnv::bind`](crate::TestEnv::bind)).
pub async fn bind_as_printed(
    env: &crate::TestEnv,
    print: &mut Command,
    account: &str,
    namespace: &str,
    take_away: Option<(&str, &str)>,
) -> Result<std::path::PathBuf, EnvtestError> {
    let mut manifests = printed(print.env("KUBECONFIG", env.kubeconfig_path()))?;
    if let Some((verb, resource)) = take_away {
        manifests = without(manifests, verb, resource)?;
    }
    let manifests = unique(manifests, namespace).to_string();
    env.bind(&manifests, namespace, account).await
}

/// Starts `program` (args, environment and standard output as the caller
/// set them) as the ServiceAccount `account` of `namespace`, bound to what
/// `program print_args` prints (its `--print-rbac`; run as the program
/// alone, without `program`'s own args and environment: put in
/// `print_args` what the printing needs) less `take_away`
/// (verb, resource), as [`bind_as_printed`] binds it; returns once the
/// authorizer grants every rule, with its standard error followed. The
/// child is killed when dropped.
pub async fn start_as_printed(
    env: &crate::TestEnv,
    mut program: tokio::process::Command,
    print_args: &[&str],
    account: &str,
    namespace: &str,
    take_away: Option<(&str, &str)>,
) -> Result<(tokio::process::Child, Log), EnvtestError> {
    let mut print = Command::new(program.as_std().get_program());
    print.args(print_args);
    let kubeconfig = bind_as_printed(env, &mut print, account, namespace, take_away).await?;
    let mut child = program
        .env("KUBECONFIG", kubeconfig)
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| EnvtestError::failed(format!("starting {program:?}"), e))?;
    let stderr = child.stderr.take().ok_or_else(|| {
        EnvtestError::Client(format!("{program:?} has no standard error to follow"))
    })?;
    Ok((child, Log::follow(stderr)))
}

/// Whether a log line carries an authorization refusal by the API server:
/// RBAC's `... is forbidden: User "..." cannot ...` (plain or quoted), or
/// 401 Unauthorized. Not a 403 for another cause, such as a quota's
/// `is forbidden: exceeded quota`.
pub fn is_refusal(line: &str) -> bool {
    line.contains("is forbidden: User ")
        || line.contains("is forbidden: User \\\"")
        || line.contains("Unauthorized")
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
        .map_err(|e| EnvtestError::failed(format!("running {what}"), e))?;
    if !out.status.success() {
        return Err(EnvtestError::Client(format!(
            "{what} exited {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| EnvtestError::failed(format!("what {what} printed is not JSON"), e))
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
            less["items"][1]["rules"],
            json!([
                {"resources": ["pods"], "verbs": ["list", "watch"]},
                {"resources": ["leases"], "verbs": ["create"]},
                {"resources": ["services"], "verbs": ["list"]},
            ]),
            "the verb goes for that resource alone"
        );
        let less = without(list.clone(), "create", "leases").unwrap();
        assert_eq!(less["items"][1]["rules"].as_array().unwrap().len(), 1);
        assert!(without(list, "delete", "pods").is_err());
    }

    #[test]
    fn cluster_roles_and_their_bindings_get_names_of_their_own() {
        let list = json!({"items": [
            {"kind": "ServiceAccount", "metadata": {"name": "c"}},
            {"kind": "ClusterRole", "metadata": {"name": "c"}},
            {"kind": "ClusterRoleBinding", "metadata": {"name": "c"}, "roleRef": {"name": "c"}},
            {"kind": "Role", "metadata": {"name": "c"}},
        ]});
        let list = unique(list, "ns1");
        let names: Vec<&str> = (0..4)
            .map(|i| list["items"][i]["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["c", "c-ns1", "c-ns1", "c"]);
        assert_eq!(list["items"][2]["roleRef"]["name"], "c-ns1");
    }

    #[test]
    fn every_request_a_role_grants_is_listed_with_its_scope() {
        let list = json!({"items": [
            {"kind": "ServiceAccount"},
            {"kind": "Role", "metadata": {"namespace": "ops"}, "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                 "verbs": ["get", "update"], "resourceNames": ["l"]},
            ]},
            {"kind": "ClusterRole", "rules": [
                {"apiGroups": ["x.dev"], "resources": ["sites/status"], "verbs": ["patch"]},
            ]},
        ]});
        let granted = granted(&list);
        assert_eq!(granted.len(), 3);
        assert_eq!(granted[0].0.as_deref(), Some("ops"));
        assert_eq!(
            (granted[1].1.verb.as_str(), granted[1].1.name.as_str()),
            ("update", "l")
        );
        let status = &granted[2];
        assert_eq!(status.0, None);
        assert_eq!(
            (status.1.resource.as_str(), status.1.subresource.as_str()),
            ("sites", "status")
        );
    }

    #[test]
    fn a_refusal_is_recognised_plain_or_quoted() {
        let quota = r#"deployments.apps "x" is forbidden: exceeded quota: q, requested: pods=1"#;
        assert!(!is_refusal(quota));
        let plain = r#"pods is forbidden: User "x" cannot watch resource "pods" in API group """#;
        let quoted = r#"error="pods is forbidden: User \"x\" cannot watch resource \"pods\"""#;
        for line in [plain, quoted] {
            assert!(is_refusal(line), "{line}");
            assert!(names_refusal(line, "watch", "pods"), "{line}");
            assert!(!names_refusal(line, "list", "pods"), "{line}");
            assert!(!names_refusal(line, "watch", "pod"), "{line}");
        }
    }
}
