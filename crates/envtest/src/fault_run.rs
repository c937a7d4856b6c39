//! Fault runs: your controller against this crate's real control plane,
//! through a proxy that injects the faults that break operators, checked
//! against an end state you state.
//!
//! Studies of real operators (Sieve, OSDI 2022; Acto, SOSP 2023) found the
//! same three kinds of bug again and again: acting on a stale view, missing
//! a state the watch never showed, and crashing between two writes and not
//! recovering. A [`FaultRun`] starts your controller (a process of your
//! binary, or a task of your test) with a client that goes through an
//! [`AnsweringProxy`] of the run's own, runs your scenario (the writes a
//! user would make) with the test's direct client once the controller has
//! asked for every recorded kind (or after 10 s), and then waits for the
//! end state: your [`Check`]s over what the API server holds in the run's
//! namespace ([`Snapshot`]), met with the controller quiet (no write tried
//! for [`FaultRun::quiet_for`] since its last write, the scenario's end and
//! its last restart). The [`Fault`]s, alone or combined:
//!
//! - [`Fault::stale_reads`]: the answers to the controller's watches (of
//!   every resource, or of some) held back, so its cache lags its writes;
//! - [`Fault::missed_states`]: its watches go blind for the scenario (the
//!   open ones are closed, new ones held), then are answered 410 Gone, as
//!   is any later watch from a resourceVersion before the scenario's end,
//!   so it relists and sees only the last state;
//! - [`Fault::gone`]: watch requests answered 410 Gone, forcing relists;
//! - [`Fault::conflicts`]: updates and patches (PUT, PATCH) answered 409
//!   Conflict without reaching the server (to a create, a real server's
//!   409 means AlreadyExists, which would be a lie here);
//!   [`Fault::server_errors`]: any write answered 500;
//! - [`FaultRun::crash_after_each_write`]: one clean run counts the
//!   controller's writes; then, for each N up to that count, a run in
//!   which the controller is killed once the answer to its Nth write
//!   arrives and started again. From the moment write N is forwarded, no
//!   other write of it is (one on another connection is closed
//!   unanswered), and nothing at all once the answer is in. Faults can
//!   change how many writes a run makes: a crash point not reached is
//!   said on the test's output and [`Passed::crashes`] counts the crashes
//!   that happened;
//! - [`FaultRun::replicas`]: several replicas, each its own proxy; with the
//!   crash sweep, the one that made write N (the leader) is killed.
//!
//! The writes counted (and so the ones write errors and crashes hit) are
//! the controller's POST, PUT, PATCH and DELETE requests into the run's
//! namespace, less Leases and Events: leader election's renewals and event
//! recording come and go with the clock, and would make no two runs alike.
//!
//! Which requests get a fault is drawn from the run's seed
//! ([`FaultRun::seed`], else `KINFORMER_FAULT_SEED`, else a fresh one),
//! keyed by each request's number among its kind (the 3rd write, the 2nd
//! watch of ConfigMaps) and by replica: a seed replays the same choices for
//! the same requests (timing between your controller's own tasks can still
//! differ). [`Passed::faults_hit`] says how many requests the faults hit:
//! a test should check it is not 0. A run that fails returns a [`FaultRunFailure`]
//! whose text is the whole report: seed, faults, which requests they hit,
//! every request of the controller and what became of it, the recorded
//! objects' history, the checks that failed, and the controller's last
//! output lines.
//!
//! Each run has its own namespace (`<name>-…`), deleted when it ends: the
//! control plane's namespace controller empties and removes it. Runs in one
//! process take turns, even from tests running in parallel: a controller
//! that watches every namespace would otherwise act on another run's
//! objects beside its own. A process
//! is killed with SIGKILL; a task is aborted (its `Drop`s run, which a
//! crashed process's do not, and tasks it spawned without tying them to
//! its own keep running: a process is the faithful crash).
//!
//! What the proxy cannot frame it forwards as it comes, untouched by the
//! faults: a request with a chunked body, an upgrade (exec, port-forward)
//! or an `Expect` header, and anything after it on that connection. The
//! Kubernetes clients send none of these for reads and writes of objects.
//!
//! ```no_run
//! # async fn demo(env: &kinformer_envtest::TestEnv) {
//! use std::time::Duration;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kinformer_envtest::{Check, Fault, FaultRun};
//!
//! FaultRun::process(env, "my-operator", |target| {
//!     let mut command = tokio::process::Command::new("target/debug/my-operator");
//!     command.env("WATCH_NAMESPACE", &target.namespace);
//!     command
//! })
//! .record::<ConfigMap>()
//! .scenario(|client, namespace| async move {
//!     // create the objects a user would, with `client` (direct, no faults)
//!     # let _ = (client, namespace);
//!     Ok(())
//! })
//! .fault(Fault::stale_reads(Duration::from_secs(1)))
//! .crash_after_each_write()
//! .expect(Check::no_duplicate_children::<ConfigMap>())
//! .run()
//! .await
//! .unwrap(); // on failure, panics with the report
//! # }
//! ```

mod check;
mod history;

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube_client::Client;
use kube_client::Resource;
use kube_client::api::{Api, ListParams};
use kube_client::core::{ApiResource, DynamicObject};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinHandle;

pub use check::{Check, Snapshot};

use crate::answering_proxy::faults::{Logged, Plan};
use crate::{AnsweringProxy, EnvtestError, TestEnv};

/// An error a scenario returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// One kind of fault; see the [module docs](self).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Fault {
    /// Answers to the controller's watches of `resources` (plural names;
    /// every resource if empty) held back by `delay`.
    StaleReads {
        /// How long.
        delay: Duration,
        /// Which resources (`configmaps`, `deployments`); all if empty.
        resources: Vec<String>,
    },
    /// The controller's watches blind from the scenario's start to its end,
    /// then answered 410 Gone: it relists and sees only the last state.
    MissedStates,
    /// Each watch request answered 410 Gone with this probability.
    Gone {
        /// Between 0 and 1.
        probability: f64,
    },
    /// Each of the controller's writes answered `status` with this
    /// probability, without reaching the server.
    WriteErrors {
        /// 409, 429, 500 or 503.
        status: u16,
        /// Between 0 and 1.
        probability: f64,
    },
}

impl Fault {
    /// Every watch answer held back by `delay`.
    pub fn stale_reads(delay: Duration) -> Self {
        Self::StaleReads {
            delay,
            resources: Vec::new(),
        }
    }

    /// Watch answers of these resources (plural names) held back by `delay`:
    /// one cache behind while the others keep up, which is when a
    /// controller reading one kind to decide on another goes wrong.
    pub fn stale_reads_of(delay: Duration, resources: &[&str]) -> Self {
        Self::StaleReads {
            delay,
            resources: resources.iter().map(|r| (*r).to_owned()).collect(),
        }
    }

    /// See [`Fault::MissedStates`].
    pub fn missed_states() -> Self {
        Self::MissedStates
    }

    /// See [`Fault::Gone`].
    pub fn gone(probability: f64) -> Self {
        Self::Gone { probability }
    }

    /// Writes answered 409 Conflict with this probability.
    pub fn conflicts(probability: f64) -> Self {
        Self::WriteErrors {
            status: 409,
            probability,
        }
    }

    /// Writes answered 500 Internal Server Error with this probability.
    pub fn server_errors(probability: f64) -> Self {
        Self::WriteErrors {
            status: 500,
            probability,
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::StaleReads { delay, resources } if resources.is_empty() => {
                write!(f, "stale reads: every watch answer held back {delay:?}")
            }
            Self::StaleReads { delay, resources } => write!(
                f,
                "stale reads: watch answers of {} held back {delay:?}",
                resources.join(", ")
            ),
            Self::MissedStates => f.write_str(
                "missed states: watches blind during the scenario, then 410 Gone (relist)",
            ),
            Self::Gone { probability } => {
                write!(
                    f,
                    "410 Gone answered to watch requests with p = {probability}"
                )
            }
            Self::WriteErrors {
                status,
                probability,
            } => write!(f, "{status} answered to writes with p = {probability}"),
        }
    }
}

/// What the controller under test is given: where to reach the API
/// server through the run's fault proxy, and the run's namespace.
#[derive(Clone)]
#[non_exhaustive]
pub struct Target {
    /// An admin client through the fault proxy.
    pub client: Client,
    /// An admin kubeconfig file through the fault proxy, for a process.
    pub kubeconfig: PathBuf,
    /// The run's namespace, where the scenario writes.
    pub namespace: String,
    /// Which replica this is (0 unless [`FaultRun::replicas`] is set): to
    /// give each its own identity.
    pub replica: usize,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("kubeconfig", &self.kubeconfig)
            .field("namespace", &self.namespace)
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

type CommandFn = dyn Fn(&Target) -> tokio::process::Command + Send + Sync;
type TaskFn = dyn Fn(Target) -> BoxFuture<()> + Send + Sync;
type ScenarioFn = dyn Fn(Client, String) -> BoxFuture<Result<(), BoxError>> + Send + Sync;

enum Start {
    Process(Box<CommandFn>),
    Task(Box<TaskFn>),
}

/// A fault run; see the [module docs](self).
pub struct FaultRun<'e> {
    env: &'e TestEnv,
    name: String,
    start: Start,
    scenario: Option<Box<ScenarioFn>>,
    kinds: Vec<ApiResource>,
    checks: Vec<Check>,
    faults: Vec<Fault>,
    crash_sweep: bool,
    seed: Option<u64>,
    settle: Duration,
    quiet: Duration,
    replicas: usize,
}

impl std::fmt::Debug for FaultRun<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultRun")
            .field("name", &self.name)
            .field("faults", &self.faults)
            .field("crash_sweep", &self.crash_sweep)
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

impl<'e> FaultRun<'e> {
    fn new(env: &'e TestEnv, name: &str, start: Start) -> Self {
        Self {
            env,
            name: name.to_owned(),
            start,
            scenario: None,
            kinds: Vec::new(),
            checks: Vec::new(),
            faults: Vec::new(),
            crash_sweep: false,
            seed: None,
            settle: Duration::from_secs(30),
            quiet: Duration::from_secs(1),
            replicas: 1,
        }
    }

    /// Runs the controller as a process: `command` builds it for a
    /// [`Target`]; the run sets `KUBECONFIG` to the target's kubeconfig,
    /// captures its output (the report shows the last lines) and kills it
    /// when the run ends. `name` names the run and prefixes its namespaces.
    pub fn process(
        env: &'e TestEnv,
        name: &str,
        command: impl Fn(&Target) -> tokio::process::Command + Send + Sync + 'static,
    ) -> Self {
        Self::new(env, name, Start::Process(Box::new(command)))
    }

    /// Runs the controller as a task of the test: `controller` returns its
    /// future (a Manager's `run`, say) for a [`Target`]; the task is
    /// aborted to crash it and when the run ends.
    pub fn task<F, Fut>(env: &'e TestEnv, name: &str, controller: F) -> Self
    where
        F: Fn(Target) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let start = move |target: Target| -> BoxFuture<()> { Box::pin(controller(target)) };
        Self::new(env, name, Start::Task(Box::new(start)))
    }

    /// Records kind `K` in the run's namespace: its history goes in the
    /// report, and the [`Snapshot`] the checks read holds it.
    #[must_use]
    pub fn record<K: Resource<DynamicType = ()>>(self) -> Self {
        self.record_resource(ApiResource::erase::<K>(&()))
    }

    /// [`record`](Self::record) for a kind known only at run time (a
    /// custom resource). Namespaced kinds only.
    #[must_use]
    pub fn record_resource(mut self, kind: ApiResource) -> Self {
        if !self.kinds.iter().any(|k| check::same_kind(k, &kind)) {
            self.kinds.push(kind);
        }
        self
    }

    /// What a user does while the controller runs: `scenario` gets the
    /// test's direct client (no faults) and the run's namespace. Run once
    /// per run, so it must work on a fresh namespace each time.
    #[must_use]
    pub fn scenario<F, Fut>(mut self, scenario: F) -> Self
    where
        F: Fn(Client, String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        self.scenario = Some(Box::new(move |client, namespace| {
            Box::pin(scenario(client, namespace))
        }));
        self
    }

    /// Adds a fault (they combine).
    #[must_use]
    pub fn fault(mut self, fault: Fault) -> Self {
        self.faults.push(fault);
        self
    }

    /// Crashes the controller after each of its writes in turn; see the
    /// [module docs](self).
    #[must_use]
    pub fn crash_after_each_write(mut self) -> Self {
        self.crash_sweep = true;
        self
    }

    /// Runs `n` replicas of the controller (each its own [`Target::replica`]
    /// and its own fault proxy, the same faults): for a leader-elected
    /// controller, whose standby must take over. With
    /// [`crash_after_each_write`](Self::crash_after_each_write), the replica
    /// that made the write (the leader) is the one killed: a leader
    /// hand-over in the middle of its reconciles.
    #[must_use]
    pub fn replicas(mut self, n: usize) -> Self {
        self.replicas = n.max(1);
        self
    }

    /// The seed the faults are drawn from; a failing run prints its own.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// A condition the end state must meet (they all must).
    #[must_use]
    pub fn expect(mut self, check: Check) -> Self {
        self.checks.push(check);
        self
    }

    /// How long after the scenario the end state may take before the run
    /// fails (30 s unless set): a bound on a wait for events, not a timing
    /// assertion; a run that passes ends as soon as the state is reached.
    #[must_use]
    pub fn settle_within(mut self, within: Duration) -> Self {
        self.settle = within;
        self
    }

    /// How long the controller must make no write before a met end state
    /// counts (1 s unless set): so that a controller about to undo the
    /// state is not passed too early.
    #[must_use]
    pub fn quiet_for(mut self, quiet: Duration) -> Self {
        self.quiet = quiet;
        self
    }

    fn seed_to_use(&self) -> Result<u64, EnvtestError> {
        if let Some(seed) = self.seed {
            return Ok(seed);
        }
        match std::env::var("KINFORMER_FAULT_SEED") {
            Ok(v) => v.trim().parse().map_err(|_| {
                EnvtestError::Client(format!(
                    "KINFORMER_FAULT_SEED={v:?} is not a number (a u64, as a failing run prints it)"
                ))
            }),
            Err(_) => Ok(std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64 ^ u64::from(std::process::id()))
                .unwrap_or_default()),
        }
    }

    fn plan(&self, seed: u64) -> Result<Plan, EnvtestError> {
        let mut plan = Plan {
            seed,
            ..Plan::default()
        };
        for fault in &self.faults {
            let bad = |what: &str| Err(EnvtestError::Client(format!("fault {fault:?}: {what}")));
            match fault {
                Fault::StaleReads { delay, resources } => {
                    if plan.stale.is_some() {
                        return bad("only one stale-reads fault per run");
                    }
                    plan.stale = Some((*delay, resources.clone()));
                }
                Fault::MissedStates => {}
                Fault::Gone { probability } => {
                    if !(0.0..1.0).contains(probability) {
                        return bad(
                            "the probability must be at least 0 and below 1 (at 1 no watch would ever start)",
                        );
                    }
                    plan.gone = *probability;
                }
                Fault::WriteErrors {
                    status,
                    probability,
                } => {
                    if !matches!(status, 409 | 429 | 500 | 503) {
                        return bad("the status must be 409, 429, 500 or 503");
                    }
                    if !(0.0..1.0).contains(probability) {
                        return bad(
                            "the probability must be at least 0 and below 1 (at 1 no write would ever pass)",
                        );
                    }
                    if plan.write_errors.is_some() {
                        return bad("only one write-error fault per run");
                    }
                    plan.write_errors = Some((*status, *probability));
                }
            }
        }
        Ok(plan)
    }

    /// Runs it: with [`crash_after_each_write`](Self::crash_after_each_write),
    /// a clean run and then one run per crash point; else one run. Returns
    /// at the first failing run.
    pub async fn run(self) -> Result<Passed, FaultRunFailure> {
        let setup = |e| FaultRunFailure::setup(&self.name, e);
        let seed = self.seed_to_use().map_err(setup)?;
        let plan = self.plan(seed).map_err(setup)?;
        if !self.crash_sweep {
            let once = self.run_once(plan, &self.faults, None).await?;
            return Ok(Passed {
                runs: 1,
                writes: once.writes,
                crashes: 0,
                faults_hit: once.hits,
                seed,
            });
        }
        let clean = Plan {
            seed,
            ..Plan::default()
        };
        let writes = self.run_once(clean, &[], None).await?.writes;
        let mut passed = Passed {
            runs: 1,
            writes,
            crashes: 0,
            faults_hit: 0,
            seed,
        };
        for n in 1..=writes {
            let plan = Plan {
                crash_after_write: Some(n),
                ..plan.clone()
            };
            let once = self.run_once(plan, &self.faults, Some((n, writes))).await?;
            passed.runs += 1;
            passed.crashes += once.crashes;
            passed.faults_hit += once.hits;
            if once.crashes == 0 {
                eprintln!(
                    "fault run {:?}: crash point {n} not reached (this run made {} writes, the clean run {writes}); counted in Passed::crashes",
                    self.name, once.writes
                );
            }
        }
        Ok(passed)
    }

    /// One run in a namespace of its own, deleted at the end.
    async fn run_once(
        &self,
        plan: Plan,
        faults: &[Fault],
        crash: Option<(u64, u64)>,
    ) -> Result<Once, FaultRunFailure> {
        let setup = |e| FaultRunFailure::setup(&self.name, e);
        // One run at a time in a process: a controller that watches every
        // namespace would act on another run's objects beside its own.
        let _one_at_a_time = ONE_AT_A_TIME.lock().await;
        // Deleted when dropped, at the end of the run.
        let namespace = self.env.create_namespace(&self.name).await.map_err(setup)?;
        let direct = self.env.client().map_err(setup)?;
        self.run_in(&namespace, &direct, plan, faults, crash).await
    }

    async fn run_in(
        &self,
        namespace: &str,
        direct: &Client,
        plan: Plan,
        faults: &[Fault],
        crash: Option<(u64, u64)>,
    ) -> Result<Once, FaultRunFailure> {
        let setup = |e| FaultRunFailure::setup(&self.name, e);
        let started = Instant::now();
        let mut schedule: Vec<String> = faults.iter().map(ToString::to_string).collect();
        if let Some((n, of)) = crash {
            let whom = if self.replicas > 1 {
                "the replica that made it (the leader) killed"
            } else {
                "the controller killed"
            };
            schedule.push(format!(
                "crash: {whom} once the answer to write {n} (of {of} in the clean run) arrives, then started again"
            ));
        }
        if schedule.is_empty() {
            schedule.push("none (the clean run)".into());
        }
        let missed_states = faults.contains(&Fault::MissedStates);
        // Progress on the test's output (shown by the test harness when the
        // test fails or runs with --nocapture).
        eprintln!(
            "fault run {:?} in {namespace}: {}",
            self.name,
            schedule.join("; ")
        );
        let plan_here = Plan {
            namespace: Some(namespace.to_owned()),
            crash_counter: Arc::default(),
            ..plan.clone()
        };
        let mut proxies = Vec::new();
        let mut targets = Vec::new();
        for replica in 0..self.replicas {
            let proxy = AnsweringProxy::start(self.env).await.map_err(setup)?;
            // Each replica its own choices from the one seed.
            let seed = match replica {
                0 => plan.seed,
                r => plan.seed ^ (r as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            };
            proxy.faults().begin(
                Plan {
                    seed,
                    ..plan_here.clone()
                },
                started,
            );
            targets.push(Target {
                client: self.env.client_via(proxy.port()).map_err(setup)?,
                kubeconfig: self.env.kubeconfig_via(proxy.port()).map_err(setup)?,
                namespace: namespace.to_owned(),
                replica,
            });
            proxies.push(proxy);
        }
        let state = Proxies(&proxies);
        let history =
            history::History::start(direct.clone(), namespace, &self.kinds, started).await;
        let output = Output::default();
        let mut running = Vec::new();
        for target in &targets {
            running
                .push(Running::start(&self.start, target, &output, self.replicas).map_err(setup)?);
        }
        let controllers = tokio::sync::Mutex::new(running);
        // When the controller last started again, or the scenario ended:
        // quiet is counted from the latest of these and the last write.
        let restarted = Mutex::new(None::<Instant>);
        // Kills and starts again a replica that "crashed".
        let supervise = async {
            loop {
                let replica = state.next_crash().await;
                let mut running = controllers.lock().await;
                running[replica].kill(&output).await;
                output.push(format!(
                    "{} --- replica {replica} killed (the crash fault); started again ---",
                    at(started.elapsed())
                ));
                // Forwarding again before it starts, so that its first
                // requests are not turned away.
                state.resume();
                match Running::start(&self.start, &targets[replica], &output, self.replicas) {
                    Ok(again) => running[replica] = again,
                    Err(e) => output.push(format!("--- could not start it again: {e} ---")),
                }
                *restarted.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
            }
        };
        let body = async {
            // The scenario starts once the controller has asked for every
            // kind it records (it is up), or after WATCHING_LIMIT.
            let watching = Instant::now();
            while !self.kinds.iter().all(|k| state.requested(&k.plural))
                && watching.elapsed() < WATCHING_LIMIT
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if missed_states {
                state.blind();
            }
            if let Some(scenario) = &self.scenario {
                let ran = tokio::time::timeout(
                    SCENARIO_LIMIT,
                    scenario(direct.clone(), namespace.to_owned()),
                )
                .await;
                let failed = match ran {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(format!("the scenario failed: {e}")),
                    Err(_) => Some(format!(
                        "the scenario did not end within {SCENARIO_LIMIT:?} (with missed states the controller sees nothing until it ends: a scenario must not wait for the controller)"
                    )),
                };
                if let Some(why) = failed {
                    return Err((why, Vec::new()));
                }
            }
            if missed_states {
                state.see(current_version(direct).await);
            }
            *restarted.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
            eprintln!(
                "fault run {:?} in {namespace}: scenario done at {}, waiting for the end state",
                self.name,
                at(started.elapsed()).trim()
            );
            self.settle(direct, namespace, &state, &history, &output, &restarted)
                .await
        };
        let result = tokio::select! {
            r = body => r,
            () = supervise => unreachable!("the supervisor never returns"),
        };
        let once = Once {
            writes: state.writes_forwarded(),
            crashes: state.crashes(),
            hits: state.hits(),
        };
        for replica in controllers.lock().await.iter_mut() {
            replica.kill(&output).await;
        }
        let Err((why, checks)) = result else {
            return Ok(once);
        };
        let mut text = String::new();
        let _ = writeln!(text, "fault run {:?} failed: {why}", self.name);
        let seed = plan.seed;
        let _ = writeln!(
            text,
            "  seed: {seed} (replay: FaultRun::seed({seed}), or KINFORMER_FAULT_SEED={seed})"
        );
        let _ = writeln!(text, "  namespace: {namespace}");
        if self.replicas > 1 {
            let _ = writeln!(text, "  replicas: {}", self.replicas);
        }
        let _ = writeln!(text, "  faults:");
        for s in &schedule {
            let _ = writeln!(text, "    - {s}");
        }
        if !checks.is_empty() {
            let _ = writeln!(text, "  checks at the end:");
        }
        for c in &checks {
            let _ = writeln!(text, "    {c}");
        }
        write_log(&mut text, &state.log());
        let _ = writeln!(
            text,
            "objects' history (the test's own watch of the recorded kinds in {namespace}):"
        );
        for change in history.changes() {
            let _ = writeln!(text, "  {} {}", at(change.at), change.what);
        }
        let lines = output.lines();
        let lines = &lines[lines.len().saturating_sub(Output::SHOWN)..];
        let _ = match self.start {
            Start::Process(_) => {
                writeln!(text, "controller's output (last {} lines):", lines.len())
            }
            Start::Task(_) => writeln!(
                text,
                "controller's output (a task: its output goes to the test's own; here the run's notes):"
            ),
        };
        for line in lines {
            let _ = writeln!(text, "  {line}");
        }
        Err(FaultRunFailure { report: text })
    }

    /// Waits for the end state with the controller quiet; on failure, why
    /// and each check's verdict.
    async fn settle(
        &self,
        direct: &Client,
        namespace: &str,
        state: &Proxies<'_>,
        history: &history::History,
        output: &Output,
        restarted: &Mutex<Option<Instant>>,
    ) -> Result<(), (String, Vec<String>)> {
        let changed = history.changed();
        let deadline = Instant::now() + self.settle;
        loop {
            let notified = changed.notified();
            let verdicts: Vec<Result<String, String>> =
                match snapshot(direct, namespace, &self.kinds, output).await {
                    Ok(s) => self
                        .checks
                        .iter()
                        .map(|c| match (c.test)(&s) {
                            Ok(()) => Ok(format!("✓ {}", c.name)),
                            Err(e) => Err(format!("✗ {}: {e}", c.name)),
                        })
                        .collect(),
                    Err(e) => vec![Err(format!("✗ reading the end state: {e}"))],
                };
            let met = verdicts.iter().all(Result::is_ok);
            let last = state
                .last_write()
                .max(*restarted.lock().unwrap_or_else(|e| e.into_inner()));
            let quiet = last.is_none_or(|t| t.elapsed() >= self.quiet);
            if met && quiet && !state.any_crashed() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let why = if met {
                    format!(
                        "the controller never went quiet ({:?} without a write) within {:?} of the scenario's end",
                        self.quiet, self.settle
                    )
                } else {
                    format!(
                        "the end state was not reached within {:?} of the scenario's end",
                        self.settle
                    )
                };
                let verdicts = verdicts
                    .into_iter()
                    .map(|v| v.unwrap_or_else(|e| e))
                    .collect();
                return Err((why, verdicts));
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
    }
}

/// What a passed fault run did.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Passed {
    /// Runs made (a crash sweep's clean run included).
    pub runs: usize,
    /// The controller's writes in the (clean, for a sweep) run.
    pub writes: u64,
    /// Crashes that happened: a crash run whose controller made fewer
    /// writes than its crash point (faults can change how many it makes)
    /// has none, and says so on the test's output.
    pub crashes: u64,
    /// Requests the faults hit, crashes included (0 says the faults did
    /// nothing: a test should check it is not).
    pub faults_hit: u64,
    /// The seed the faults were drawn from.
    pub seed: u64,
}

/// What one run did.
struct Once {
    writes: u64,
    crashes: u64,
    hits: u64,
}

/// How long the scenario waits for the controller to ask for the recorded
/// kinds before it starts anyway.
const WATCHING_LIMIT: Duration = Duration::from_secs(10);

/// Held by the run under way; see [`FaultRun::run_once`].
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long a scenario may take.
const SCENARIO_LIMIT: Duration = Duration::from_secs(120);

/// The server's resourceVersion now (0 if it cannot be read: then every
/// later watch from a version is taken as recent).
async fn current_version(client: &Client) -> u64 {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let list = namespaces
        .list_metadata(&ListParams::default().limit(1))
        .await;
    list.ok()
        .and_then(|l| l.metadata.resource_version)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A fault run that failed, or could not be set up. Its `Display` (and its
/// `Debug`, so that `unwrap` prints it) is the whole report.
#[derive(thiserror::Error)]
#[error("{report}")]
pub struct FaultRunFailure {
    report: String,
}

impl std::fmt::Debug for FaultRunFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.report)
    }
}

impl FaultRunFailure {
    fn setup(name: &str, e: EnvtestError) -> Self {
        Self {
            report: format!("fault run {name:?} could not be set up: {e}"),
        }
    }

    /// The report.
    pub fn report(&self) -> &str {
        &self.report
    }
}

/// The recorded kinds in `namespace` now.
async fn snapshot(
    client: &Client,
    namespace: &str,
    kinds: &[ApiResource],
    output: &Output,
) -> Result<Snapshot, kube_client::Error> {
    let mut objects = Vec::new();
    for kind in kinds {
        let api = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, kind);
        objects.push((kind.clone(), api.list(&ListParams::default()).await?.items));
    }
    Ok(Snapshot {
        namespace: namespace.to_owned(),
        objects,
        output: output.lines(),
    })
}

fn at(d: Duration) -> String {
    format!("+{:>7.3}s", d.as_secs_f64())
}

/// The controller's requests: the faults first, then every request.
fn write_log(text: &mut String, log: &[Logged]) {
    let line = |l: &Logged| format!("{} {} {} → {}", at(l.at), l.method, l.target, l.outcome);
    let hit: Vec<&Logged> = log
        .iter()
        .filter(|l| l.outcome.contains("(fault)") || l.outcome.starts_with("held"))
        .collect();
    let _ = writeln!(text, "  requests the faults hit ({}):", hit.len());
    for l in hit {
        let _ = writeln!(text, "    {}", line(l));
    }
    const SHOWN: usize = 400;
    let skipped = log.len().saturating_sub(SHOWN);
    let _ = writeln!(
        text,
        "the controller's requests through the fault proxy ({} in all{}):",
        log.len(),
        if skipped > 0 {
            format!(", the first {skipped} left out")
        } else {
            String::new()
        }
    );
    // A poll repeated many times in a row is shown once, with its count.
    let mut shown = log[skipped..].iter().peekable();
    while let Some(l) = shown.next() {
        let _ = writeln!(text, "  {}", line(l));
        let mut same = 0;
        let mut last = l;
        while let Some(next) = shown
            .next_if(|n| (&n.method, &n.target, &n.outcome) == (&l.method, &l.target, &l.outcome))
        {
            same += 1;
            last = next;
        }
        if same > 0 {
            let _ = writeln!(
                text,
                "  {} … the same {same} more times, the last at {}",
                " ".repeat(9),
                at(last.at).trim()
            );
        }
    }
}

/// The controller's output lines (a process's stdout and stderr, merged
/// as they come), across its restarts, with the run's notes.
#[derive(Clone, Default)]
struct Output(Arc<Mutex<VecDeque<String>>>);

impl Output {
    /// Lines kept for the checks; the report shows the last [`Self::SHOWN`].
    const KEPT: usize = 10_000;
    const SHOWN: usize = 60;

    fn push(&self, line: String) {
        let mut lines = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if lines.len() == Self::KEPT {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    fn lines(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    fn follow(&self, pipe: impl tokio::io::AsyncRead + Unpin + Send + 'static, prefix: String) {
        let output = self.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(pipe).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                output.push(format!("{prefix}{line}"));
            }
        });
    }
}

/// The fault proxies of a run's replicas, seen as one.
struct Proxies<'a>(&'a [AnsweringProxy]);

impl Proxies<'_> {
    fn writes_forwarded(&self) -> u64 {
        self.0.iter().map(|p| p.faults().writes_forwarded()).sum()
    }

    fn last_write(&self) -> Option<Instant> {
        self.0.iter().filter_map(|p| p.faults().last_write()).max()
    }

    fn crashes(&self) -> u64 {
        self.0.iter().map(|p| p.faults().crashes()).sum()
    }

    /// Whether some replica asked for `resource`.
    fn requested(&self, resource: &str) -> bool {
        self.0.iter().any(|p| p.faults().requested(resource))
    }

    fn hits(&self) -> u64 {
        self.0.iter().map(|p| p.faults().hits()).sum()
    }

    fn any_crashed(&self) -> bool {
        self.0.iter().any(|p| *p.faults().crashed().borrow())
    }

    fn blind(&self) {
        for p in self.0 {
            p.faults().blind();
        }
    }

    fn see(&self, now: u64) {
        for p in self.0 {
            p.faults().see(now);
        }
    }

    /// After a crashed replica was started again: no more crashes, in any.
    fn resume(&self) {
        for p in self.0 {
            p.faults().resume();
        }
    }

    /// The next replica to crash.
    async fn next_crash(&self) -> usize {
        let waits = self.0.iter().enumerate().map(|(i, p)| {
            Box::pin(async move {
                let mut crashed = p.faults().crashed();
                if crashed.wait_for(|c| *c).await.is_err() {
                    std::future::pending::<()>().await;
                }
                i
            })
        });
        futures::future::select_all(waits).await.0
    }

    /// Every replica's requests, in time order, each marked with its
    /// replica when there are several.
    fn log(&self) -> Vec<Logged> {
        let several = self.0.len() > 1;
        let mut log: Vec<Logged> = self
            .0
            .iter()
            .enumerate()
            .flat_map(|(i, p)| {
                p.faults().log().into_iter().map(move |mut l| {
                    if several {
                        l.method = format!("[replica {i}] {}", l.method);
                    }
                    l
                })
            })
            .collect();
        log.sort_by_key(|l| l.at);
        log
    }
}

/// The controller, running.
enum Running {
    Process(tokio::process::Child),
    Task(JoinHandle<()>),
}

impl Running {
    fn start(
        start: &Start,
        target: &Target,
        output: &Output,
        replicas: usize,
    ) -> Result<Self, EnvtestError> {
        let prefix = if replicas > 1 {
            format!("[replica {}] ", target.replica)
        } else {
            String::new()
        };
        match start {
            Start::Process(command) => {
                let mut command = command(target);
                command
                    .env("KUBECONFIG", &target.kubeconfig)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .kill_on_drop(true);
                let program = command.as_std().get_program().to_owned();
                let mut child = command.spawn().map_err(|e| {
                    EnvtestError::failed(
                        format!("starting the controller {}", program.to_string_lossy()),
                        e,
                    )
                })?;
                if let Some(out) = child.stdout.take() {
                    output.follow(out, prefix.clone());
                }
                if let Some(err) = child.stderr.take() {
                    output.follow(err, prefix);
                }
                Ok(Self::Process(child))
            }
            Start::Task(controller) => Ok(Self::Task(tokio::spawn(controller(target.clone())))),
        }
    }

    async fn kill(&mut self, output: &Output) {
        match self {
            Self::Process(child) => {
                if let Ok(Some(status)) = child.try_wait() {
                    output.push(format!(
                        "--- the controller had exited on its own: {status} ---"
                    ));
                }
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
            Self::Task(task) => {
                if task.is_finished() {
                    output.push("--- the controller's task had ended on its own ---".into());
                }
                task.abort();
                let _ = task.await;
            }
        }
    }
}
