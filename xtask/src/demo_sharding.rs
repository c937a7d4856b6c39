//! `cargo xtask demo --sharding`: the pod-stdout controller sharded over
//! three replicas (processes of the kinformer binary, each with its own ring
//! membership and slot Leases): they split the Pods between them; one is
//! killed (SIGKILL) and the others take its slots once their Leases
//! expire; a fourth joins and takes its share. After each step the terminal
//! shows who holds which slot (read from the slot Leases on the server) and
//! which Pods each replica reconciled.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube_client::Client;
use kube_client::api::{Api, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::demo::{free_port, pod, step, wait_ready_on};

const RING: &str = "demo";
const SLOTS: u32 = 6;
const PODS: usize = 24;

/// replica -> Pods it reconciled since the last `clear`.
type Reconciled = Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>;

struct Replica {
    id: String,
    child: Child,
    port: u16,
}

pub async fn scenario(binary: &Path, kubeconfig: &Path, client: &Client, ns: &str) -> Result<()> {
    let reconciled: Reconciled = Arc::default();
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    step(&format!(
        "sharding: three replicas of pod-stdout form the ring {RING:?} ({SLOTS} slots of the uid hash space, one Lease per slot and per replica)"
    ));
    let mut replicas = Vec::new();
    for id in ["r1", "r2", "r3"] {
        replicas.push(spawn(binary, kubeconfig, ns, id, &reconciled).await?);
    }
    for r in &replicas {
        wait_ready(r).await?;
    }
    let live: Vec<&str> = replicas.iter().map(|r| r.id.as_str()).collect();
    settled(&leases, &live).await?;
    show_slots(&leases).await?;

    step(&format!(
        "{PODS} Pods created: each replica lists, watches and reconciles only those of its slots"
    ));
    for i in 0..PODS {
        pods.create(&PostParams::default(), &pod(&format!("web-{i:02}")))
            .await?;
    }
    all_reconciled(&reconciled).await?;
    show_work(&leases, &reconciled).await?;

    step(
        "r2 is killed (SIGKILL), releasing nothing: the others see its member Lease unchanged for the lease duration (15 s), then campaign for its slots, each taken once its Lease has been seen unchanged for the lease duration too",
    );
    let mut r2 = replicas.remove(1);
    r2.child.start_kill()?;
    let _ = r2.child.wait().await;
    let started = std::time::Instant::now();
    settled(&leases, &["r1", "r3"]).await?;
    println!(
        "    r1 and r3 hold every slot {:.0} s after the kill",
        started.elapsed().as_secs_f64()
    );
    show_slots(&leases).await?;
    touch_all(&pods, &reconciled, "1").await?;
    show_work(&leases, &reconciled).await?;

    step(
        "r4 joins: the ring gives it its share; r1 and r3 hand those slots over once their reconciles have ended",
    );
    replicas.push(spawn(binary, kubeconfig, ns, "r4", &reconciled).await?);
    wait_ready(&replicas[2]).await?;
    settled(&leases, &["r1", "r3", "r4"]).await?;
    show_slots(&leases).await?;
    touch_all(&pods, &reconciled, "2").await?;
    show_work(&leases, &reconciled).await?;

    step("SIGTERM to every replica: each hands its slots over and leaves the ring");
    for r in &mut replicas {
        if let Some(pid) = r.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
    }
    for r in &mut replicas {
        let status = tokio::time::timeout(Duration::from_secs(40), r.child.wait())
            .await
            .context("a replica did not exit")??;
        println!("    {} exited with {status}", r.id);
        if !status.success() {
            bail!("{} exited with {status}", r.id);
        }
    }
    Ok(())
}

async fn spawn(
    binary: &Path,
    kubeconfig: &Path,
    ns: &str,
    id: &str,
    reconciled: &Reconciled,
) -> Result<Replica> {
    let port = free_port()?;
    let mut child = Command::new(binary)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--namespace", ns, "--workers", "2"])
        .args(["--shard-ring", RING, "--shard-slots", &SLOTS.to_string()])
        .args(["--identity", id])
        .args(["--metrics-bind-address", &format!("127.0.0.1:{port}")])
        .args(["--health-probe-bind-address", &format!("127.0.0.1:{port}")])
        .arg("pod-stdout")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let stderr = child.stderr.take().context("no stderr")?;
    let (who, record) = (id.to_owned(), Arc::clone(reconciled));
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(pod) = line.strip_prefix("Sync/Add/Update for Pod ") {
                record
                    .lock()
                    .entry(who.clone())
                    .or_default()
                    .insert(pod.to_owned());
            }
        }
    });
    let who = id.to_owned();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            // The ring's own account of what it did.
            for (needle, say) in [
                ("took the slot's Lease", "took"),
                ("handed the slot over", "handed over"),
            ] {
                if line.contains(needle) {
                    let slot = line
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("slot="))
                        .unwrap_or("?");
                    println!("    [{who}] {say} slot {slot}");
                }
            }
            if line.contains("ERROR") {
                println!("    [{who}] {line}");
            }
        }
    });
    Ok(Replica {
        id: id.to_owned(),
        child,
        port,
    })
}

async fn wait_ready(r: &Replica) -> Result<()> {
    wait_ready_on(r.port, &r.id).await
}

/// slot -> holder, from the slot Leases.
async fn holders(leases: &Api<Lease>) -> Result<BTreeMap<u32, String>> {
    let mut out = BTreeMap::new();
    for slot in 0..SLOTS {
        let holder = match leases.get_opt(&format!("{RING}-slot-{slot}")).await? {
            Some(lease) => lease
                .spec
                .and_then(|s| s.holder_identity)
                .unwrap_or_default(),
            None => String::new(),
        };
        out.insert(slot, holder);
    }
    Ok(out)
}

/// Waits (up to 60 s) until the replicas `live` hold every slot, none more
/// than its share.
async fn settled(leases: &Api<Lease>, live: &[&str]) -> Result<()> {
    let share = (SLOTS as usize).div_ceil(live.len());
    for _ in 0..600 {
        let held = holders(leases).await?;
        let all_live = held.values().all(|h| live.contains(&h.as_str()));
        let fair = live
            .iter()
            .all(|r| held.values().filter(|h| h == r).count() <= share);
        if all_live && fair {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the ring did not settle on {live:?} in 60 s")
}

async fn show_slots(leases: &Api<Lease>) -> Result<()> {
    let mut by: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (slot, holder) in holders(leases).await? {
        by.entry(holder).or_default().push(slot);
    }
    for (holder, slots) in by {
        println!("    {holder} holds slots {slots:?}");
    }
    Ok(())
}

/// Waits (up to 60 s) until every Pod was reconciled since the last clear.
async fn all_reconciled(reconciled: &Reconciled) -> Result<()> {
    for _ in 0..600 {
        let done: BTreeSet<String> = reconciled.lock().values().flatten().cloned().collect();
        if done.len() >= PODS {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("not every Pod was reconciled in 60 s")
}

/// Changes every Pod (an annotation), then waits until each is reconciled.
async fn touch_all(pods: &Api<Pod>, reconciled: &Reconciled, round: &str) -> Result<()> {
    reconciled.lock().clear();
    println!("    every Pod annotated (round {round})");
    for i in 0..PODS {
        let patch = serde_json::json!({"metadata": {"annotations": {"demo/round": round}}});
        pods.patch(
            &format!("web-{i:02}"),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await?;
    }
    all_reconciled(reconciled).await
}

async fn show_work(leases: &Api<Lease>, reconciled: &Reconciled) -> Result<()> {
    let held = holders(leases).await?;
    let work = reconciled.lock().clone();
    let mut twice = 0;
    let mut seen = BTreeSet::new();
    for (replica, pods) in &work {
        let slots: Vec<u32> = held
            .iter()
            .filter(|(_, h)| *h == replica)
            .map(|(s, _)| *s)
            .collect();
        let names: Vec<&str> = pods.iter().map(|p| p.trim_start_matches("web-")).collect();
        println!(
            "    {replica} (slots {slots:?}) reconciled {} Pods: web-{}",
            pods.len(),
            names.join(",")
        );
        for p in pods {
            if !seen.insert(p.clone()) {
                twice += 1;
            }
        }
    }
    println!(
        "    {} Pods, {twice} reconciled by more than one replica in this round",
        seen.len()
    );
    Ok(())
}
