//! `cargo xtask bench --webhooks`: the Website example's webhooks in
//! kinformer, controller-runtime and kube-runtime, called by the same
//! kube-apiserver. The programs are the three of the Website comparison
//! (examples/website and bench/peers/website-*), each run as a replica that
//! is not the leader (the bench holds their Lease), so its webhooks serve
//! and its controller waits: what is measured is the webhook server alone.
//!
//! Three measures, each program a fresh process per round, rounds rotating:
//! - creates through the validating webhook, one at a time, timed at the
//!   client: p50 and p99;
//! - the same through the defaulting (mutating) webhook;
//! - 10 000 Websites stored in v1, converted to v2 when the CRD's
//!   conversion is pointed at the program: the API server converts what it
//!   reads from etcd object by object, and fills its v2 cache so; timed
//!   until a list in v2 has them all.
//!
//! Beside the client's times, the API server's own measure of each webhook
//! call (`apiserver_admission_webhook_admission_duration_seconds`,
//! `apiserver_crd_conversion_webhook_duration_seconds`: the call alone,
//! without the rest of the request), and the webhook process's CPU time.
//! The same creates with no webhook give the API server's floor.

use k8s_openapi::api::coordination::v1::Lease;
use kinformer_webhook::dev_certs::DevCerts;
use kube_client::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams};

use super::programs::{Programs, Running};
use super::*;
use crate::demo::free_port;

const BEGIN: &str = "<!-- BEGIN cargo xtask bench --webhooks -->";
const END: &str = "<!-- END cargo xtask bench --webhooks -->";

const GROUP: &str = "example.kinformer.dev";
const CRD: &str = "websites.example.kinformer.dev";
const MUTATE: &str = "/mutate-example-kinformer-dev-v1-website";
const VALIDATE: &str = "/validate-example-kinformer-dev-v1-website";
/// The webhook configurations' name, and their webhooks' names' stem.
const CONFIG: &str = "bench-website";

fn build(root: &Path) -> Result<Programs> {
    println!(
        "==> building the Website programs (release): kinformer's, its kube-runtime and controller-runtime peers"
    );
    super::programs::cargo(root, "example-website")?;
    let bench = root.join("bench");
    super::programs::cargo(&bench, "website-kube-runtime")?;
    let controller_runtime = bench.join("target/release/website-controller-runtime");
    go_build(
        &bench.join("peers/website-controller-runtime"),
        &controller_runtime,
    )?;
    Ok(Programs {
        kinformer: root.join("target/release/website"),
        controller_runtime,
        kube_runtime: bench.join("target/release/website-kube-runtime"),
    })
}

fn websites(client: &Client, ns: &str, version: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(GROUP, version, "Website");
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, "websites"),
    )
}

fn website(name: &str, host: Option<&str>, replicas: i32) -> Result<DynamicObject> {
    let mut spec = serde_json::json!({"image": "nginx:1.27", "replicas": replicas});
    if let Some(host) = host {
        spec["host"] = host.into();
    }
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": format!("{GROUP}/v1"), "kind": "Website",
        "metadata": {"name": name}, "spec": spec,
    }))?)
}

/// A webhook configuration of `kind` (`Mutating` or `Validating`) calling
/// `url`, for Websites created in `ns`.
fn configuration(kind: &str, url: &str, ca: &str, ns: &str) -> Value {
    let short = if kind == "Mutating" {
        "mutate"
    } else {
        "validate"
    };
    serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": format!("{kind}WebhookConfiguration"),
        "metadata": {"name": CONFIG},
        "webhooks": [{
            "name": format!("{short}.{CONFIG}.kinformer.dev"),
            "clientConfig": {"url": url, "caBundle": base64(ca.as_bytes())},
            "rules": [{"apiGroups": [GROUP], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["websites"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
        }],
    })
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn configurations(client: &Client, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        "v1",
        &format!("{kind}WebhookConfiguration"),
    );
    let plural = format!("{}webhookconfigurations", kind.to_ascii_lowercase());
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, &plural),
    )
}

/// Only `kind`'s configuration in force (none for `None`): the other one
/// deleted, this one applied.
async fn configure(
    client: &Client,
    kind: Option<&str>,
    url: &str,
    ca: &str,
    ns: &str,
) -> Result<()> {
    for other in ["Mutating", "Validating"] {
        let api = configurations(client, other);
        if Some(other) == kind {
            let params = PatchParams::apply("kinformer-bench").force();
            api.patch(
                CONFIG,
                &params,
                &Patch::Apply(configuration(other, url, ca, ns)),
            )
            .await?;
        } else if api.get_opt(CONFIG).await?.is_some() {
            api.delete(CONFIG, &DeleteParams::default()).await?;
        }
    }
    Ok(())
}

/// The CRD's conversion to `None` (the API server only relabels the
/// apiVersion): the admission rows call no conversion webhook.
async fn no_conversion(client: &Client) -> Result<()> {
    let patch = serde_json::json!({"spec": {"conversion": {"strategy": "None", "webhook": null}}});
    crds(client)
        .patch(CRD, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

fn crds(client: &Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    )
}

/// Points the CRD's conversion at `url`.
async fn convert_at(client: &Client, url: &str, ca: &str) -> Result<()> {
    let patch = serde_json::json!({"spec": {"conversion": {"strategy": "Webhook", "webhook": {
        "conversionReviewVersions": ["v1"],
        "clientConfig": {"url": url, "caBundle": base64(ca.as_bytes())},
    }}}});
    crds(client)
        .patch(CRD, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// Retries `check` every 100 ms for up to 30 s: a new webhook
/// configuration is picked up by the API server from a watch.
async fn in_force(what: &str, mut check: impl AsyncFnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check().await {
        if Instant::now() > deadline {
            bail!("{what} not in force after 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A histogram's `_sum` and `_count` in kube-apiserver's `/metrics`, over
/// the samples whose labels contain every one of `labels`.
async fn histogram(client: &Client, name: &str, labels: &[&str]) -> Result<(f64, f64)> {
    let text = super::programs::apiserver_metrics(client).await?;
    let (mut sum, mut count) = (0.0, 0.0);
    for line in text.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some(rest) = series.strip_prefix(name) else {
            continue;
        };
        if !labels.iter().all(|l| rest.contains(l)) {
            continue;
        }
        let value: f64 = value.parse().unwrap_or(0.0);
        if rest.starts_with("_sum{") {
            sum += value;
        } else if rest.starts_with("_count{") {
            count += value;
        }
    }
    Ok((sum, count))
}

/// The `p`th percentile (0 to 1) of `samples`, sorted.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// What one set of creates measured.
struct Creates {
    p50_ms: f64,
    p99_ms: f64,
    /// The API server's mean of the webhook's calls, ms.
    call_ms: f64,
}

/// `n` creates, one at a time, in `ns`, timed; then deleted. With `webhook`
/// (its type label and the configuration's webhook name), the API server's
/// measure of its calls too.
async fn creates(
    client: &Client,
    ns: &str,
    n: usize,
    host: bool,
    webhook: Option<(&str, &str)>,
) -> Result<Creates> {
    let api = websites(client, ns, "v1");
    let metric = "apiserver_admission_webhook_admission_duration_seconds";
    let labels =
        |(type_, name): (&str, &str)| [format!("name=\"{name}\""), format!("type=\"{type_}\"")];
    let before = match webhook {
        Some(w) => histogram(client, metric, &labels(w).each_ref().map(String::as_str)).await?,
        None => (0.0, 0.0),
    };
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("site-{i:05}");
        let object = website(&name, host.then_some("bench.example.com"), 1)?;
        let started = Instant::now();
        api.create(&PostParams::default(), &object).await?;
        times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let call_ms = match webhook {
        Some(w) => {
            let (sum, count) =
                histogram(client, metric, &labels(w).each_ref().map(String::as_str)).await?;
            let calls = count - before.1;
            if calls < n as f64 {
                bail!(
                    "the API server made {calls} calls to {} for {n} creates",
                    w.1
                );
            }
            (sum - before.0) / calls * 1e3
        }
        None => 0.0,
    };
    times.sort_by(f64::total_cmp);
    Ok(Creates {
        p50_ms: percentile(&times, 0.5),
        p99_ms: percentile(&times, 0.99),
        call_ms,
    })
}

/// Fills `ns` with `n` Websites, 16 creates at a time.
async fn fill(client: &Client, ns: &str, n: usize) -> Result<()> {
    let api = websites(client, ns, "v1");
    let mut creates = stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let object = website(&format!("site-{i:05}"), Some("bench.example.com"), 1)?;
                api.create(&PostParams::default(), &object).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16);
    while let Some(created) = creates.next().await {
        created?;
    }
    Ok(())
}

/// Holds the Lease `website-controller` in `ns` for an hour, so that no
/// program leads: their webhooks serve, their controllers wait.
async fn hold_lease(client: &Client, ns: &str) -> Result<()> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "website-controller"},
        "spec": {
            "holderIdentity": "kinformer-bench",
            "leaseDurationSeconds": 3600,
            "acquireTime": now.to_string(),
            "renewTime": now.to_string(),
        },
    }))?;
    Api::<Lease>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &lease)
        .await?;
    Ok(())
}

pub async fn run_alone(quick: bool, root: &Path) -> Result<()> {
    let started = Instant::now();
    let programs = build(root)?;
    let (n, listed, rounds) = if quick {
        (200, 2_000, 1)
    } else {
        (1_000, 10_000, 3)
    };
    println!("\n==> starting the control plane (kube-apiserver {KUBERNETES_VERSION} + etcd)");
    // The server alone, as every bench has it (see `settled_env`).
    let env = TestEnv::start_with(TestEnvOptions::new().without_controller_manager()).await?;
    let client = env.client()?;
    let crd = std::process::Command::new(env.binaries().kubectl())
        .env("KUBECONFIG", env.kubeconfig_path())
        .args(["apply", "-f"])
        .arg(root.join("examples/website/crd.yaml"))
        .status()
        .context("kubectl apply -f examples/website/crd.yaml")?;
    if !crd.success() {
        bail!("kubectl apply -f examples/website/crd.yaml failed");
    }
    let lease_ns = env.create_namespace("bench-webhooks-lease").await?;
    hold_lease(&client, &lease_ns).await?;
    let create_ns = env.create_namespace("bench-webhooks-creates").await?;
    let list_ns = env.create_namespace("bench-webhooks-list").await?;
    // The CRD must be served before the first create.
    in_force("the Website CRD", async || {
        websites(&client, &create_ns, "v1")
            .list(&ListParams::default().limit(1))
            .await
            .is_ok()
    })
    .await?;
    // No conversion webhook but while the conversion row is measured.
    no_conversion(&client).await?;
    println!("==> {listed} Websites to list");
    fill(&client, &list_ns, listed).await?;

    let certs = DevCerts::new(&["127.0.0.1"])?;
    let cert_dir =
        std::env::temp_dir().join(format!("kinformer-bench-webhooks-{}", std::process::id()));
    std::fs::create_dir_all(&cert_dir)?;
    certs.write(&cert_dir)?;

    let mut results = Results::default();
    let validating = format!("create through the validating webhook, {n} one at a time");
    let mutating = format!("create through the defaulting (mutating) webhook, {n} one at a time");
    let conversion = format!(
        "{listed} Websites stored in v1, listed in v2 once the conversion webhook changed (the API server converts each object)"
    );
    let mut floor = (Vec::new(), Vec::new());
    let systems = [System::Kinformer, System::ClientGo, System::KubeRuntime];
    let conversions = "apiserver_crd_conversion_webhook_duration_seconds";
    let to_v2 = [r#"to_version="v2""#, r#"succeeded="true""#];
    for round in 0..rounds {
        for k in 0..systems.len() {
            let system = systems[(k + round) % systems.len()];
            let who = super::programs::name(system);
            let (port, metrics, probes) = (free_port()?, free_port()?, free_port()?);
            let webhook_addr = format!("127.0.0.1:{port}");
            let metrics_addr = format!("127.0.0.1:{metrics}");
            let probe_addr = format!("127.0.0.1:{probes}");
            let cert_dir = cert_dir.to_string_lossy();
            let running = Running::start(
                programs.path(system),
                env.kubeconfig_path(),
                &[
                    ("LEASE_NAMESPACE", &lease_ns),
                    ("WEBHOOK_ADDR", &webhook_addr),
                    ("CERT_DIR", &cert_dir),
                    ("METRICS_ADDR", &metrics_addr),
                    ("PROBE_ADDR", &probe_addr),
                ],
            )?;
            let url = |path: &str| format!("https://{webhook_addr}{path}");
            let cpu = |running: &Running| running.cpu_ms();
            let v1 = websites(&client, &create_ns, "v1");

            // Started, its informers listed (kinformer's and
            // controller-runtime's run while they stand by), idle.
            let mut running = running;
            running
                .settled()
                .await
                .with_context(|| format!("{who} starting"))?;
            let deleted = |api: Api<DynamicObject>| async move {
                api.delete_collection(&DeleteParams::default(), &ListParams::default())
                    .await
                    .map(|_| ())
            };

            // The API server alone: no admission webhook.
            configure(&client, None, "", &certs.ca, &create_ns).await?;
            let alone = creates(&client, &create_ns, n, true, None).await?;
            deleted(v1.clone()).await?;
            floor.0.push(alone.p50_ms);
            floor.1.push(alone.p99_ms);

            // Validating.
            configure(
                &client,
                Some("Validating"),
                &url(VALIDATE),
                &certs.ca,
                &create_ns,
            )
            .await?;
            let dry = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            let refused = async || {
                let Ok(object) = website("probe", Some("h"), 11) else {
                    return false;
                };
                matches!(v1.create(&dry, &object).await,
                    Err(kube_client::Error::Api(s)) if s.message.contains("spec.replicas must be 0 to 10"))
            };
            in_force("the validating webhook", refused)
                .await
                .with_context(|| who.to_owned())?;
            let cpu_before = cpu(&running);
            let v = creates(
                &client,
                &create_ns,
                n,
                true,
                Some(("validating", &format!("validate.{CONFIG}.kinformer.dev"))),
            )
            .await?;
            let v_cpu = cpu(&running) - cpu_before;
            deleted(v1.clone()).await?;

            // Mutating, once the validating webhook is no longer called.
            configure(
                &client,
                Some("Mutating"),
                &url(MUTATE),
                &certs.ca,
                &create_ns,
            )
            .await?;
            in_force("the validating webhook's removal", async || {
                !refused().await
            })
            .await
            .with_context(|| who.to_owned())?;
            in_force("the defaulting webhook", async || {
                let Ok(object) = website("probe", None, 1) else {
                    return false;
                };
                v1.create(&dry, &object)
                    .await
                    .is_ok_and(|o| o.data["spec"]["host"] == "probe.example.com")
            })
            .await
            .with_context(|| who.to_owned())?;
            let cpu_before = cpu(&running);
            let m = creates(
                &client,
                &create_ns,
                n,
                false,
                Some(("admit", &format!("mutate.{CONFIG}.kinformer.dev"))),
            )
            .await?;
            let m_cpu = cpu(&running) - cpu_before;
            deleted(v1.clone()).await?;
            configure(&client, None, "", &certs.ca, &create_ns).await?;

            // Conversion: the CRD's conversion pointed at this program; the
            // API server rebuilds its storage of each version and fills its
            // v2 cache converting every object; timed until a list in v2
            // has them all.
            let before = histogram(&client, conversions, &to_v2).await?;
            let t0 = Instant::now();
            convert_at(&client, &url("/convert"), &certs.ca).await?;
            let v2 = websites(&client, &list_ns, "v2");
            loop {
                // Converted, not relabelled by the storage of the strategy
                // None it replaces (the CRD's change reaches the handler
                // after the patch returns).
                match v2.list(&ListParams::default()).await {
                    Ok(list)
                        if list.items.len() == listed
                            && list
                                .items
                                .iter()
                                .all(|w| w.data["spec"].get("pods").is_some()) =>
                    {
                        break;
                    }
                    _ if t0.elapsed() > Duration::from_secs(600) => {
                        bail!(
                            "{who}: no full list in v2 600 s after the conversion webhook changed"
                        )
                    }
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            let fill_s = t0.elapsed().as_secs_f64();
            // The cache may still be filling if the first list was read
            // from etcd: the calls are counted once they stop.
            let mut after = histogram(&client, conversions, &to_v2).await?;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let now = histogram(&client, conversions, &to_v2).await?;
                if now.1 == after.1 {
                    break;
                }
                after = now;
            }
            let calls = after.1 - before.1;
            let call_ms = (after.0 - before.0) / calls.max(1.0) * 1e3;
            no_conversion(&client).await?;
            running.kill().await;

            let per_thousand = |ms: f64, of: f64| ms / of * 1e3;
            for (row, c, cpu_ms) in [(&validating, &v, v_cpu), (&mutating, &m, m_cpu)] {
                results.add(row, "p50 ms", system, c.p50_ms);
                results.add(row, "p99 ms", system, c.p99_ms);
                results.add(
                    row,
                    "webhook call ms (API server's mean)",
                    system,
                    c.call_ms,
                );
                results.add(
                    row,
                    "webhook CPU ms per 1 000 calls",
                    system,
                    per_thousand(cpu_ms, n as f64),
                );
            }
            results.add(&conversion, "until listed in v2, s", system, fill_s);
            results.add(
                &conversion,
                "conversion calls (API server's count)",
                system,
                calls,
            );
            results.add(
                &conversion,
                "conversion call ms (API server's mean)",
                system,
                call_ms,
            );
            println!(
                "    round {} {who}: validating p50 {:.2} ms p99 {:.2} ms (call {:.2} ms); mutating p50 {:.2} ms p99 {:.2} ms (call {:.2} ms); no webhook p50 {:.2} ms; {listed} in v2 after {fill_s:.2} s ({calls} calls of {call_ms:.2} ms)",
                round + 1,
                v.p50_ms,
                v.p99_ms,
                v.call_ms,
                m.p50_ms,
                m.p99_ms,
                m.call_ms,
                alone.p50_ms,
            );
        }
    }
    env.stop();
    let _ = std::fs::remove_dir_all(&cert_dir);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (p50, p99) = (median(&mut floor.0), median(&mut floor.1));
    let table = render_with(&results, ["controller-runtime", "kube-runtime"]);
    println!("\n{table}");
    let section = format!(
        "{BEGIN}\n## Webhooks: the Website example's, in kinformer, controller-runtime v0.25.3, kube-runtime 5.0\n\n\
         Command: `cargo xtask bench --webhooks{}` ({:.0} s). Machine: {}. Server: kube-apiserver {KUBERNETES_VERSION} \
         with etcd on loopback. The programs are the Website comparison's (examples/website, bench/peers/website-*; \
         docs/controllers.md), release builds, each serving its webhooks over TLS with the same certificate, and each \
         run as a replica that does not lead (the bench holds their Lease): the webhook server works, the controller \
         waits. A fresh process per round, {rounds} rounds rotating; medians. Creates are made one at a time by the \
         bench and timed at the client, with only one webhook configuration in force (`failurePolicy: Fail`). \
         Each program is measured once idle (its informers listed). The admission rows run with the CRD's \
         conversion off (strategy None), so that no conversion call reaches the program meanwhile. Conversion: \
         the API server converts what it reads from etcd object by object (one review per object, not one per \
         list), so the {listed} Websites are converted when the CRD's conversion is pointed at the program: the \
         API server rebuilds its storage of each version and fills its v2 cache; timed from that change until a \
         list in v2 has them all. The call times are the API server's own \
         (`apiserver_admission_webhook_admission_duration_seconds`, \
         `apiserver_crd_conversion_webhook_duration_seconds`): from its request to the answer read, TLS and JSON \
         both ways included, and, for conversion, the wait of calls made several at a time. The CPU is the \
         webhook process's over the creates (user and system; /proc, 10 ms ticks), and includes what its standby \
         informers do with each create's watch event. The API server alone, the same creates with no admission \
         webhook: p50 {p50:.2} ms, p99 {p99:.2} ms.\n\n{table}\n{END}\n",
        if quick { " --quick" } else { "" },
        started.elapsed().as_secs_f64(),
        machine(),
    );
    replace_block(root, BEGIN, END, &section)?;
    println!("==> docs/benchmarks.md updated");
    Ok(())
}
