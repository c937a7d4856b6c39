//! `--print-manifests`, offline: the Deployment it prints looks for its
//! Leases (its election's, its ring's) in the namespace where the Role it
//! prints grants them, whatever flags place the ServiceAccount and the
//! Leases.

use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_kinformer");

/// What `kinformer service-strategy ARGS --print-manifests` prints.
fn manifests(args: &[&str]) -> Value {
    let out = Command::new(BIN)
        .arg("service-strategy")
        .args(args)
        .arg("--print-manifests")
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The value after `flag` in `args`.
fn flag<'a>(args: &'a [Value], flag: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1)?.as_str()
}

/// The namespaces of the Roles that grant something on Leases.
fn lease_roles(items: &[Value]) -> Vec<&str> {
    items
        .iter()
        .filter(|i| i["kind"] == "Role")
        .filter(|i| i["rules"].to_string().contains("\"leases\""))
        .map(|i| i["metadata"]["namespace"].as_str().unwrap())
        .collect()
}

#[test]
fn the_printed_deployment_uses_its_leases_where_the_printed_role_grants_them() {
    let modes: [&[&str]; 3] = [&["--leader-elect"], &["--shard-ring", "ring"], &[]];
    let scopes: [&[&str]; 2] = [&["--namespace", "web"], &["--all-namespaces"]];
    let lease_namespaces: [&[&str]; 2] = [&["--leader-election-namespace", "leases"], &[]];
    let account_namespaces: [&[&str]; 2] = [&["--service-account-namespace", "ops"], &[]];
    for mode in modes {
        for scope in scopes {
            for lease_ns in lease_namespaces {
                for account_ns in account_namespaces {
                    let args = [mode, scope, lease_ns, account_ns].concat();
                    let printed = manifests(&args);
                    let items = printed["items"].as_array().unwrap();
                    let deployment = items.iter().find(|i| i["kind"] == "Deployment").unwrap();
                    let pod_ns = deployment["metadata"]["namespace"].as_str().unwrap();
                    let account = items.iter().find(|i| i["kind"] == "ServiceAccount");
                    assert_eq!(account.unwrap()["metadata"]["namespace"], pod_ns);
                    let pod_args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
                        .as_array()
                        .unwrap();
                    // In a pod, without the flag, the Leases are in its own namespace.
                    let leases_used =
                        flag(pod_args, "--leader-election-namespace").unwrap_or(pod_ns);
                    let roles = lease_roles(items);
                    if mode.is_empty() {
                        assert_eq!(roles, Vec::<&str>::new(), "{args:?}");
                    } else {
                        assert_eq!(roles, [leases_used], "{args:?}: {pod_args:?}");
                        let bound = items.iter().any(|i| {
                            i["kind"] == "RoleBinding"
                                && i["metadata"]["namespace"] == leases_used
                                && i["subjects"][0]["namespace"] == pod_ns
                        });
                        assert!(bound, "{args:?}: no RoleBinding in {leases_used}");
                    }
                }
            }
        }
    }
}
