//! What a fault run does to single requests, decided as each one arrives,
//! and the log of every request and what became of it.
//!
//! Choices are drawn from the run's seed with SplitMix64, keyed by the kind
//! of choice and the request's number among its kind (the 3rd write, the
//! 5th watch), not by arrival order across kinds: a seed replays the same
//! choices for the same requests. Written here rather than taken from
//! `rand` because a seed printed in a failing run must replay the same run
//! after a dependency upgrade, and `rand`'s seeded generators promise no
//! value stability across its versions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// The head of one HTTP/1.1 request.
#[derive(Debug)]
pub(crate) struct Head {
    pub method: String,
    pub target: String,
    /// Bytes of the head, its closing blank line included.
    pub len: usize,
    pub content_length: usize,
    /// A chunked body or an upgrade: not framed here, forwarded as it comes.
    pub unframed: bool,
}

pub(crate) enum Parsed {
    Incomplete,
    Head(Head),
    NotHttp,
}

pub(crate) fn parse_head(buf: &[u8]) -> Parsed {
    let Some(end) = super::find(buf, b"\r\n\r\n") else {
        return match super::find(buf, b"\r\n") {
            Some(line_end) if request_line(&buf[..line_end]).is_none() => Parsed::NotHttp,
            _ => Parsed::Incomplete,
        };
    };
    let Ok(text) = std::str::from_utf8(&buf[..end]) else {
        return Parsed::NotHttp;
    };
    let mut lines = text.split("\r\n");
    let Some((method, target)) = lines.next().and_then(|l| request_line(l.as_bytes())) else {
        return Parsed::NotHttp;
    };
    let mut head = Head {
        method,
        target,
        len: end + 4,
        content_length: 0,
        unframed: false,
    };
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Parsed::NotHttp;
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        match name.as_str() {
            "content-length" => match value.parse() {
                Ok(n) => head.content_length = n,
                Err(_) => return Parsed::NotHttp,
            },
            "transfer-encoding" if !value.eq_ignore_ascii_case("identity") => {
                head.unframed = true;
            }
            // An upgrade, or a body sent only after a 100 Continue.
            "upgrade" | "expect" => head.unframed = true,
            _ => {}
        }
    }
    Parsed::Head(head)
}

/// `(method, target)` of an HTTP/1.x request line.
fn request_line(line: &[u8]) -> Option<(String, String)> {
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || !version.starts_with("HTTP/1.")
        || method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
    {
        return None;
    }
    Some((method.to_owned(), target.to_owned()))
}

/// Whether a request target asks for a watch (`watch=true` or `watch=1`).
pub(crate) fn is_watch(target: &str) -> bool {
    let query = target.split_once('?').map_or("", |(_, q)| q);
    query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1")
}

/// The resource a request's path names (`configmaps`, `deployments`,
/// `namespaces`), if it names one.
pub(crate) fn resource_of(target: &str) -> Option<&str> {
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    let mut segments = path.trim_matches('/').split('/');
    let rest: Vec<&str> = match segments.next()? {
        "api" => segments.skip(1).collect(),
        "apis" => segments.skip(2).collect(),
        _ => return None,
    };
    match rest.as_slice() {
        ["namespaces", _, resource, ..] => Some(resource),
        [resource, ..] => Some(resource),
        [] => None,
    }
}

/// A write the run counts as the controller's own: a POST, PUT, PATCH or
/// DELETE on anything but Leases, Events and the review APIs (leader
/// election's renewals and event recording come and go with the clock, so
/// counting them would make no two runs alike).
pub(crate) fn is_counted_write(head: &Head) -> bool {
    matches!(head.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
        && resource_of(&head.target)
            .is_some_and(|r| !matches!(r, "leases" | "events") && !r.ends_with("reviews"))
}

/// What to do with a request.
pub(crate) enum Decision {
    /// Pass it on; its answer's status goes to log entry `entry`, its
    /// answer is held back `delay` (a watch under stale reads), and with
    /// `crash_point` the controller crashes once that answer arrives.
    Forward {
        entry: Option<usize>,
        delay: Duration,
        crash_point: bool,
    },
    /// Answer it with these bytes instead; it never reaches the server.
    Answer(Vec<u8>),
    /// Close the connection without an answer (the controller crashed).
    Close,
}

/// The faults in force; everything off by default.
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    pub seed: u64,
    /// Only writes into this namespace are counted (and so can fail or
    /// crash the controller), if set.
    pub namespace: Option<String>,
    /// Each counted write is answered with this status, unforwarded, with
    /// this probability.
    pub write_errors: Option<(u16, f64)>,
    /// Each watch request is answered 410 Gone with this probability.
    pub gone: f64,
    /// Answers to watches of these resources (all, if empty) are held back
    /// this long.
    pub stale: Option<(Duration, Vec<String>)>,
    /// The controller "crashes" once the answer to its Nth forwarded
    /// counted write arrives: from then on its requests are not forwarded.
    pub crash_after_write: Option<u64>,
    /// Forwarded counted writes, shared by the proxies of a run's replicas
    /// (the Nth write is the Nth of them all).
    pub crash_counter: Arc<AtomicU64>,
}

/// One request and what became of it, for a run's report.
#[derive(Clone, Debug)]
pub(crate) struct Logged {
    pub at: Duration,
    pub method: String,
    pub target: String,
    pub outcome: String,
}

struct Inner {
    plan: Plan,
    writes_seen: u64,
    writes_forwarded: u64,
    /// Watch requests so far, per resource.
    watches: HashMap<String, u64>,
    /// Resources requested so far.
    requested: std::collections::HashSet<String>,
    log: Option<Vec<Logged>>,
    log_start: Instant,
    /// Write N is forwarded and its answer not in yet: other writes are
    /// not forwarded meanwhile (the process is as good as dead).
    crash_pending: bool,
    crashes: u64,
    hits: u64,
    /// The last counted write tried (forwarded or answered by a fault).
    last_write: Option<Instant>,
    /// Watches from a resourceVersion before this are answered 410: the
    /// blind window's states are never replayed.
    stale_before: Option<u64>,
}

impl Inner {
    fn new(plan: Plan, log: Option<Vec<Logged>>, log_start: Instant) -> Self {
        Self {
            plan,
            writes_seen: 0,
            writes_forwarded: 0,
            watches: HashMap::new(),
            requested: std::collections::HashSet::new(),
            log,
            log_start,
            crash_pending: false,
            crashes: 0,
            hits: 0,
            last_write: None,
            stale_before: None,
        }
    }
}

/// The fault state of one proxy, shared by its connections.
pub(crate) struct Faults {
    inner: Mutex<Inner>,
    /// While true, watch requests are held, and answered 410 once it turns false.
    blind: watch::Sender<bool>,
    /// Bumped to close the connections serving a watch.
    watch_cut: watch::Sender<u64>,
    crashed: watch::Sender<bool>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner::new(Plan::default(), None, Instant::now())),
            blind: watch::channel(false).0,
            watch_cut: watch::channel(0).0,
            crashed: watch::channel(false).0,
        }
    }
}

/// The log keeps at most this many entries; later ones are counted only.
const LOG_LIMIT: usize = 100_000;

impl Faults {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a run: this plan, counters and log from zero, not crashed,
    /// watches not blind.
    pub fn begin(&self, plan: Plan, start: Instant) {
        *self.inner() = Inner::new(plan, Some(Vec::new()), start);
        self.blind.send_replace(false);
        self.crashed.send_replace(false);
    }

    /// The log so far (empty unless a run began).
    pub fn log(&self) -> Vec<Logged> {
        self.inner().log.clone().unwrap_or_default()
    }

    /// Counted writes forwarded since the run began.
    pub fn writes_forwarded(&self) -> u64 {
        self.inner().writes_forwarded
    }

    /// When the last counted write was tried (forwarded or answered by a
    /// fault), if one was.
    pub fn last_write(&self) -> Option<Instant> {
        self.inner().last_write
    }

    /// Whether the controller asked for `resource` (a list, a watch, a
    /// get) since the run began.
    pub fn requested(&self, resource: &str) -> bool {
        self.inner().requested.contains(resource)
    }

    /// Crashes that happened since the run began.
    pub fn crashes(&self) -> u64 {
        self.inner().crashes
    }

    /// A live watch was closed by [`blind`](Self::blind): a hit.
    pub fn watch_closed(&self) {
        self.inner().hits += 1;
    }

    /// Requests a fault hit since the run began.
    pub fn hits(&self) -> u64 {
        self.inner().hits
    }

    /// Makes the watches blind, closing the open ones.
    pub fn blind(&self) {
        self.blind.send_replace(true);
        self.watch_cut.send_modify(|g| *g += 1);
    }

    /// Lets the watches see again: the held ones, and any later one from a
    /// resourceVersion before `now` (the server's when the window ends),
    /// are answered 410, so that their clients relist and see only the
    /// last state.
    pub fn see(&self, now: u64) {
        self.inner().stale_before = Some(now);
        self.blind.send_replace(false);
    }

    pub fn watch_cuts(&self) -> watch::Receiver<u64> {
        self.watch_cut.subscribe()
    }

    /// Turns true when the controller has crashed (see [`Plan::crash_after_write`]).
    pub fn crashed(&self) -> watch::Receiver<bool> {
        self.crashed.subscribe()
    }

    /// Once a crash was handled: no more crashes this run; requests are
    /// forwarded again (call it before starting the controller again).
    pub fn resume(&self) {
        let mut inner = self.inner();
        inner.plan.crash_after_write = None;
        inner.crash_pending = false;
        drop(inner);
        self.crashed.send_replace(false);
    }

    fn record(inner: &mut Inner, head: &Head, outcome: String) -> Option<usize> {
        let at = inner.log_start.elapsed();
        let log = inner.log.as_mut()?;
        if log.len() >= LOG_LIMIT {
            return None;
        }
        log.push(Logged {
            at,
            method: head.method.clone(),
            target: head.target.clone(),
            outcome,
        });
        Some(log.len() - 1)
    }

    /// Decides what becomes of a request; a watch while the watches are
    /// blind waits here until they see again.
    pub async fn decide(&self, head: &Head) -> Decision {
        let mut blind = self.blind.subscribe();
        let forward = |entry| Decision::Forward {
            entry,
            delay: Duration::ZERO,
            crash_point: false,
        };
        {
            let mut inner = self.inner();
            if let Some(resource) = resource_of(&head.target)
                && !inner.requested.contains(resource)
            {
                inner.requested.insert(resource.to_owned());
            }
            if *self.crashed.borrow() {
                let why = "not forwarded: the controller crashed";
                Self::record(&mut inner, head, why.into());
                return Decision::Close;
            }
            if is_watch(&head.target) {
                let resource = resource_of(&head.target).unwrap_or_default().to_owned();
                let n = {
                    let n = inner.watches.entry(resource.clone()).or_default();
                    *n += 1;
                    *n
                };
                let from = query_value(&head.target, "resourceVersion")
                    .and_then(|v| v.parse::<u64>().ok())
                    .filter(|v| *v > 0);
                // A streaming list (sendInitialEvents) is a list, not a
                // watch from a version: the blind window's 410 is not for
                // it (a real server does not answer it so, and kinformer's
                // informer takes any error on one as streaming lists being
                // unsupported, for good). Fault::gone does hit it: that
                // relists too, by a plain list.
                let streaming_list = query_value(&head.target, "sendInitialEvents") == Some("true");
                if *blind.borrow_and_update() {
                    inner.hits += 1;
                    Self::record(&mut inner, head, "held: watches blind (fault)".into());
                } else if let (Some(from), Some(before), false) =
                    (from, inner.stale_before, streaming_list)
                    && from < before
                {
                    inner.hits += 1;
                    let why = "answered 410 Gone: from before the blind window's end (fault)";
                    Self::record(&mut inner, head, why.into());
                    return Decision::Answer(status_response(410));
                } else if chance(inner.plan.seed ^ fnv(&resource), GONE, n, inner.plan.gone) {
                    inner.hits += 1;
                    Self::record(&mut inner, head, "answered 410 Gone (fault)".into());
                    return Decision::Answer(status_response(410));
                } else {
                    let delay = match &inner.plan.stale {
                        Some((delay, only)) if only.is_empty() || only.contains(&resource) => {
                            *delay
                        }
                        _ => Duration::ZERO,
                    };
                    let mut pending = String::from("…");
                    if !delay.is_zero() {
                        inner.hits += 1;
                        pending.push_str(&format!(" answer held back {delay:?} (fault)"));
                    }
                    let entry = Self::record(&mut inner, head, pending);
                    return Decision::Forward {
                        entry,
                        delay,
                        crash_point: false,
                    };
                }
            } else if is_counted_write(head) && in_namespace(head, inner.plan.namespace.as_deref())
            {
                if inner.crash_pending {
                    let why = "not forwarded: the controller is crashing (its last write is answered, the crash pending)";
                    Self::record(&mut inner, head, why.into());
                    return Decision::Close;
                }
                inner.writes_seen += 1;
                inner.last_write = Some(Instant::now());
                let n = inner.writes_seen;
                if let Some((status, p)) = inner.plan.write_errors
                    // A real server answers 409 Conflict to an update or a
                    // patch (a stale resourceVersion, an apply conflict);
                    // to a create it would mean AlreadyExists, a lie here.
                    && (status != 409 || matches!(head.method.as_str(), "PUT" | "PATCH"))
                    && chance(inner.plan.seed, WRITE, n, p)
                {
                    inner.hits += 1;
                    Self::record(&mut inner, head, format!("answered {status} (fault)"));
                    return Decision::Answer(status_response(status));
                }
                inner.writes_forwarded += 1;
                let total = inner.plan.crash_counter.fetch_add(1, Ordering::SeqCst) + 1;
                let crash_point = inner.plan.crash_after_write == Some(total);
                inner.crash_pending |= crash_point;
                let entry = Self::record(&mut inner, head, "…".into());
                return Decision::Forward {
                    entry,
                    delay: Duration::ZERO,
                    crash_point,
                };
            } else {
                let entry = Self::record(&mut inner, head, "…".into());
                return forward(entry);
            }
        }
        // A watch while blind: held until the watches see again.
        while *blind.borrow_and_update() {
            if blind.changed().await.is_err() {
                return Decision::Close;
            }
        }
        Decision::Answer(status_response(410))
    }

    /// The answer to a forwarded request began with `status`; with
    /// `crash_point`, the controller crashes now.
    pub fn responded(&self, entry: Option<usize>, status: Option<u16>, crash_point: bool) {
        let mut inner = self.inner();
        if let Some(logged) = entry.and_then(|e| inner.log.as_mut()?.get_mut(e)) {
            // What decide noted after the "…" (a fault on the answer) stays.
            let note = logged
                .outcome
                .strip_prefix('…')
                .unwrap_or_default()
                .to_owned();
            logged.outcome = match status {
                Some(s) => format!("{s}{note}"),
                None => format!("answered (status unreadable){note}"),
            };
            if crash_point {
                logged
                    .outcome
                    .push_str(" — then the controller crashed (fault)");
            }
        }
        if crash_point {
            inner.crashes += 1;
            inner.hits += 1;
            drop(inner);
            self.crashed.send_replace(true);
        }
    }
}

/// Whether a request's path is in `namespace` (any, if `None`).
fn in_namespace(head: &Head, namespace: Option<&str>) -> bool {
    namespace.is_none_or(|ns| {
        let path = head
            .target
            .split_once('?')
            .map_or(head.target.as_str(), |(p, _)| p);
        path.contains(&format!("/namespaces/{ns}/"))
    })
}

/// The value of `name` in a request target's query, if there.
fn query_value<'a>(target: &'a str, name: &str) -> Option<&'a str> {
    let query = target.split_once('?')?.1;
    query
        .split('&')
        .find_map(|p| p.strip_prefix(name)?.strip_prefix('='))
}

/// FNV-1a of a string: a resource's own stream of choices from one seed.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

const GONE: u64 = 1;
const WRITE: u64 = 2;

/// Whether the choice `class` for the `index`th request of its kind comes
/// out true, with probability `p`, for `seed`.
fn chance(seed: u64, class: u64, index: u64, p: f64) -> bool {
    if p <= 0.0 {
        return false;
    }
    let x = splitmix64(seed ^ splitmix64(class.wrapping_mul(0x9e37_79b9) ^ index));
    // 53 random bits as a fraction in [0, 1).
    #[allow(clippy::cast_precision_loss)]
    let fraction = (x >> 11) as f64 / (1u64 << 53) as f64;
    fraction < p
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A whole response carrying a Kubernetes `Status` for `code`, as the API
/// server words it.
pub(crate) fn status_response(code: u16) -> Vec<u8> {
    let (phrase, reason, message) = match code {
        409 => (
            "Conflict",
            "Conflict",
            "the object has been modified; please apply your changes to the latest version and try again",
        ),
        410 => ("Gone", "Expired", "too old resource version"),
        429 => ("Too Many Requests", "TooManyRequests", "too many requests"),
        500 => (
            "Internal Server Error",
            "InternalError",
            "an error on the server",
        ),
        503 => (
            "Service Unavailable",
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        ),
        _ => ("Error", "", "an error"),
    };
    let body = format!(
        r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"{message} (answered by the envtest fault run)","reason":"{reason}","code":{code}}}"#
    );
    format!(
        "HTTP/1.1 {code} {phrase}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The status code at the start of a response, if the bytes start one.
pub(crate) fn response_status(bytes: &[u8]) -> Option<u16> {
    let rest = bytes.strip_prefix(b"HTTP/1.")?;
    let code = rest.get(2..5)?;
    std::str::from_utf8(code).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Head {
        match parse_head(text.as_bytes()) {
            Parsed::Head(h) => h,
            Parsed::Incomplete => panic!("incomplete: {text:?}"),
            Parsed::NotHttp => panic!("not HTTP: {text:?}"),
        }
    }

    #[test]
    fn a_request_head_is_framed_and_a_chunked_or_upgraded_one_is_not() {
        let h = head(
            "PATCH /api/v1/namespaces/a/configmaps/x HTTP/1.1\r\nHost: h\r\nContent-Length: 12\r\n\r\n{\"data\":{}}",
        );
        assert_eq!(
            (h.method.as_str(), h.content_length, h.unframed),
            ("PATCH", 12, false)
        );
        assert_eq!(h.len, "PATCH /api/v1/namespaces/a/configmaps/x HTTP/1.1\r\nHost: h\r\nContent-Length: 12\r\n\r\n".len());
        assert!(head("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n").unframed);
        assert!(
            head("GET /x HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n").unframed
        );
        assert!(matches!(
            parse_head(b"GET /x HTTP/1.1\r\nHost"),
            Parsed::Incomplete
        ));
        assert!(matches!(
            parse_head(b"\x16\x03\x01 binary\r\n"),
            Parsed::NotHttp
        ));
        assert!(matches!(
            parse_head(b"GET /x HTTP/1.1\r\nContent-Length: ten\r\n\r\n"),
            Parsed::NotHttp
        ));
        assert!(matches!(
            parse_head(b"GET /x HTTP/1.1\r\nno colon\r\n\r\n"),
            Parsed::NotHttp
        ));
    }

    #[test]
    fn a_watch_is_told_from_its_query() {
        assert!(is_watch("/api/v1/configmaps?watch=true&resourceVersion=5"));
        assert!(is_watch("/api/v1/pods?labelSelector=a&watch=1"));
        assert!(!is_watch("/api/v1/configmaps?limit=500"));
        // A field selector naming "watch" is not a watch.
        assert!(!is_watch(
            "/api/v1/configmaps?fieldSelector=metadata.name%3Dwatch=true"
        ));
    }

    #[test]
    fn counted_writes_leave_out_leases_events_and_reviews() {
        let write =
            |m: &str, t: &str| is_counted_write(&head(&format!("{m} {t} HTTP/1.1\r\n\r\n")));
        assert!(write("PATCH", "/apis/apps/v1/namespaces/a/deployments/d"));
        assert!(write("POST", "/api/v1/namespaces/a/configmaps"));
        assert!(write(
            "PUT",
            "/apis/example.dev/v1/namespaces/a/greetings/g/status"
        ));
        assert!(write("DELETE", "/api/v1/namespaces/a"));
        assert!(write("POST", "/api/v1/namespaces"));
        assert!(!write("GET", "/api/v1/namespaces/a/configmaps"));
        assert!(!write(
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/a/leases/l"
        ));
        assert!(!write("POST", "/apis/events.k8s.io/v1/namespaces/a/events"));
        assert!(!write("POST", "/api/v1/namespaces/a/events"));
        assert!(!write(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
        ));
    }

    #[test]
    fn a_seed_draws_the_same_choices_and_another_seed_others() {
        let draws = |seed| {
            (1..=64)
                .map(|i| chance(seed, WRITE, i, 0.5))
                .collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        let hits = draws(7).iter().filter(|h| **h).count();
        assert!((16..=48).contains(&hits), "{hits} of 64 at p = 0.5");
        assert!(!(1..=64).any(|i| chance(7, WRITE, i, 0.0)));
        assert!((1..=64).all(|i| chance(7, WRITE, i, 1.0)));
    }

    #[test]
    fn a_status_response_is_framed_and_read_back() {
        let r = status_response(409);
        let text = String::from_utf8(r.clone()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        let status: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            (status["code"].as_u64(), status["reason"].as_str()),
            (Some(409), Some("Conflict"))
        );
        assert_eq!(response_status(&r), Some(409));
        assert_eq!(response_status(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(response_status(b"{\"kind\""), None);
    }
}
