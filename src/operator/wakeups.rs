//! Release notices, bounded. Whoever may `PUBLISH` on `<prefix>:events`
//! (every user of the documented ACL rule: the scripts publish there) can
//! send any number of them, and each would make the leader reconcile the
//! TargetLeases on its target. Before a notice wakes anything:
//!
//! - a notice for a target no TargetLease names is dropped (the lease
//!   index's targets, kept as the cache changes: no scan per notice);
//! - a target is woken at once, then at most once per [`Limits::per_target`]:
//!   notices in between are folded into one wake at the end of that time,
//!   so a real release among forged ones is seen within it;
//! - at most [`Limits::per_second`] targets are woken per second in all
//!   (a token bucket); the rest wait their turn, none is dropped. Waiting
//!   wakes are served one namespace after another, so one namespace's
//!   flood delays another's wake by about one token, and the task sleeps
//!   until the next token instead of looking again and again.
//!
//! So a flood costs a hash lookup per message, and at most one reconcile
//! per [`Limits::per_target`] of the TargetLeases on each target it names.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::operator::metrics::OperatorMetrics;
use crate::operator::reconcile::index::LeaseIndex;
use crate::store::Target;

/// How often the gate forgets targets it has nothing due for.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// What a flood of notices may cost.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Shortest time between two wakes of one target.
    pub per_target: Duration,
    /// Targets woken per second, in all (also the burst).
    pub per_second: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            per_target: Duration::from_millis(500),
            per_second: 200,
        }
    }
}

/// What became of one notice (the `result` label of
/// `targetlease_release_notices_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Woke the target at once.
    Woke,
    /// Folded into a wake still to come.
    Folded,
    /// No TargetLease names the target.
    UnknownTarget,
}

impl Fate {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Fate::Woke => "woke",
            Fate::Folded => "folded",
            Fate::UnknownTarget => "unknown_target",
        }
    }
}

/// The pure part: which targets to wake when (times are given, so it is
/// tested without waiting).
pub struct Gate {
    limits: Limits,
    /// Per target: when it was last woken, and whether a wake is due.
    slots: HashMap<Target, (Instant, bool)>,
    /// Wakes to come per namespace, in time order (the number keeps equal
    /// times apart).
    due: HashMap<String, BTreeMap<(Instant, u64), Target>>,
    /// The namespaces with wakes to come, in the order they are served: one
    /// wake per namespace in turn, so a namespace with thousands of targets
    /// waiting delays another namespace's wake by one token, not thousands.
    turns: VecDeque<String>,
    seq: u64,
    tokens: f64,
    refilled: Instant,
}

/// Rounding slack of the token bucket: at the instant [`Gate::next_due`]
/// names, a token is there.
const SLACK: f64 = 1e-6;

impl Gate {
    /// A gate with a full token bucket at `now`.
    pub fn new(limits: Limits, now: Instant) -> Self {
        Self {
            limits,
            slots: HashMap::new(),
            due: HashMap::new(),
            turns: VecDeque::new(),
            seq: 0,
            tokens: f64::from(limits.per_second),
            refilled: now,
        }
    }

    fn rate(&self) -> f64 {
        f64::from(self.limits.per_second.max(1))
    }

    fn take_token(&mut self, now: Instant) -> bool {
        let rate = self.rate();
        let refill = now.saturating_duration_since(self.refilled).as_secs_f64() * rate;
        self.tokens = (self.tokens + refill).min(rate);
        self.refilled = now;
        if self.tokens >= 1.0 - SLACK {
            self.tokens = (self.tokens - 1.0).max(0.0);
            true
        } else {
            false
        }
    }

    /// When the bucket holds a token again.
    fn token_at(&self) -> Instant {
        let missing = (1.0 - self.tokens).max(0.0);
        self.refilled + Duration::from_secs_f64(missing / self.rate())
    }

    fn schedule(&mut self, at: Instant, t: Target) {
        self.seq += 1;
        let queue = self.due.entry(t.namespace.clone()).or_default();
        if queue.is_empty() {
            self.turns.push_back(t.namespace.clone());
        }
        queue.insert((at, self.seq), t);
    }

    /// The earliest wake to come, in any namespace.
    fn earliest(&self) -> Option<Instant> {
        self.due
            .values()
            .filter_map(|q| q.keys().next().map(|(at, _)| *at))
            .min()
    }

    /// One notice for a known target at `now`: whether to wake it now. A
    /// target not woken lately is woken at once only when no other wake is
    /// waiting for the bucket; otherwise it takes its namespace's turn.
    pub fn notice(&mut self, t: &Target, now: Instant) -> Fate {
        let per_target = self.limits.per_target;
        match self.slots.get(t).copied() {
            Some((_, true)) => Fate::Folded,
            Some((last, false)) if now.saturating_duration_since(last) < per_target => {
                self.slots.insert(t.clone(), (last, true));
                self.schedule(last + per_target, t.clone());
                Fate::Folded
            }
            _ if self.earliest().is_none_or(|at| at > now) && self.take_token(now) => {
                self.slots.insert(t.clone(), (now, false));
                Fate::Woke
            }
            _ => {
                self.slots.insert(t.clone(), (now, true));
                self.schedule(now, t.clone());
                Fate::Folded
            }
        }
    }

    /// When to call [`Gate::take_due`] next: when the earliest folded wake is
    /// due and the bucket holds a token for it (never sooner, so a backlog
    /// waiting for tokens costs one wake-up per token, not a spin).
    pub fn next_due(&self) -> Option<Instant> {
        self.earliest().map(|at| at.max(self.token_at()))
    }

    /// The folded wakes due by `now` that the bucket allows, one namespace
    /// after another in turn; the others stay where they are.
    pub fn take_due(&mut self, now: Instant) -> Vec<Target> {
        let mut woken = Vec::new();
        loop {
            let is_due = |ns: &String| {
                self.due
                    .get(ns)
                    .and_then(|q| q.keys().next())
                    .is_some_and(|(at, _)| *at <= now)
            };
            let Some(turn) = self.turns.iter().position(is_due) else {
                break;
            };
            if !self.take_token(now) {
                break;
            }
            let Some(ns) = self.turns.remove(turn) else {
                break;
            };
            let Some(queue) = self.due.get_mut(&ns) else {
                continue;
            };
            let Some((_, t)) = queue.pop_first() else {
                continue;
            };
            if queue.is_empty() {
                self.due.remove(&ns);
            } else {
                self.turns.push_back(ns);
            }
            self.slots.insert(t.clone(), (now, false));
            woken.push(t);
        }
        woken
    }

    /// Forgets targets not woken for a while and with nothing due.
    pub fn prune(&mut self, now: Instant) {
        let per_target = self.limits.per_target;
        self.slots
            .retain(|_, (last, due)| *due || now.saturating_duration_since(*last) < per_target);
    }

    /// Targets the gate keeps state for.
    pub fn tracked(&self) -> usize {
        self.slots.len()
    }
}

/// The notices that should wake something, bounded as the module says.
/// Ends when `notices` ends or the returned stream is dropped.
pub fn bounded(
    mut notices: BoxStream<'static, Target>,
    index: Arc<LeaseIndex>,
    metrics: OperatorMetrics,
    limits: Limits,
) -> BoxStream<'static, Target> {
    let (tx, rx) = mpsc::channel::<Target>(1024);
    tokio::spawn(async move {
        let mut gate = Gate::new(limits, Instant::now());
        let mut prune_at = Instant::now() + PRUNE_EVERY;
        loop {
            let wake_at = gate.next_due().unwrap_or(prune_at).min(prune_at);
            tokio::select! {
                notice = notices.next() => {
                    let Some(t) = notice else { return };
                    let fate = if index.names_target(&t.namespace, &t.name) {
                        gate.notice(&t, Instant::now())
                    } else {
                        Fate::UnknownTarget
                    };
                    metrics.release_notice(fate.label());
                    if fate == Fate::Woke && tx.send(t).await.is_err() {
                        return;
                    }
                }
                _ = tokio::time::sleep_until(wake_at) => {
                    let now = Instant::now();
                    for t in gate.take_due(now) {
                        if tx.send(t).await.is_err() {
                            return;
                        }
                    }
                    if now >= prune_at {
                        gate.prune(now);
                        prune_at = now + PRUNE_EVERY;
                    }
                }
                _ = tx.closed() => return,
            }
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|t| (t, rx)) }).boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test]
    async fn only_notices_for_a_target_a_cached_lease_names_wake_anything() {
        use crate::operator::crd::{TargetLease, TargetLeaseSpec};
        use kube::runtime::watcher::Event;
        let spec: TargetLeaseSpec =
            serde_json::from_value(serde_json::json!({"target": "t", "holder": {"identity": "a"}}))
                .unwrap();
        let mut tl = TargetLease::new("a", spec);
        tl.metadata.namespace = Some("ns".into());
        let index = Arc::new(LeaseIndex::default());
        index.apply(&Event::Apply(tl));
        let notices = [("ns", "u"), ("other", "t"), ("ns/t", ""), ("ns", "t")]
            .map(|(ns, name)| Target::new(ns, name));
        let woken: Vec<Target> = bounded(
            futures::stream::iter(notices).boxed(),
            index,
            OperatorMetrics::default(),
            Limits::default(),
        )
        .collect()
        .await;
        assert_eq!(woken, [Target::new("ns", "t")]);
    }

    #[test]
    fn a_target_is_woken_at_once_then_at_most_once_per_interval() {
        let t0 = Instant::now();
        let limits = Limits {
            per_target: ms(500),
            per_second: 1000,
        };
        let mut g = Gate::new(limits, t0);
        let q = Target::new("ns", "q");
        assert_eq!(g.notice(&q, t0), Fate::Woke);
        // A thousand more within the interval: one wake, at its end.
        for i in 0..1000 {
            assert_eq!(g.notice(&q, t0 + ms(i % 400)), Fate::Folded);
        }
        assert_eq!(g.next_due(), Some(t0 + ms(500)));
        assert!(g.take_due(t0 + ms(499)).is_empty());
        assert_eq!(g.take_due(t0 + ms(500)), vec![q.clone()]);
        assert_eq!(g.next_due(), None);
        // Quiet for an interval: the next notice wakes at once again.
        assert_eq!(g.notice(&q, t0 + ms(1000)), Fate::Woke);
        // Another target is not held up by this one.
        assert_eq!(g.notice(&Target::new("ns", "r"), t0 + ms(1001)), Fate::Woke);
        g.prune(t0 + ms(5000));
        assert_eq!(g.tracked(), 0);
    }

    #[test]
    fn the_bucket_bounds_wakes_in_all_and_drops_none() {
        let t0 = Instant::now();
        let limits = Limits {
            per_target: ms(500),
            per_second: 10,
        };
        let mut g = Gate::new(limits, t0);
        let targets: Vec<_> = (0..30)
            .map(|i| Target::new("ns", format!("t{i}")))
            .collect();
        let woke = targets
            .iter()
            .filter(|t| g.notice(t, t0) == Fate::Woke)
            .count();
        assert_eq!(woke, 10, "the burst");
        // The other 20 come out at the bucket's rate, each exactly once.
        let mut later = Vec::new();
        let mut now = t0;
        while let Some(at) = g.next_due() {
            now = at;
            later.extend(g.take_due(now));
            assert!(now <= t0 + Duration::from_secs(3), "{now:?}");
        }
        assert_eq!(later.len(), 20);
        let distinct: std::collections::HashSet<_> = later.iter().collect();
        assert_eq!(distinct.len(), 20);
        assert!(
            now >= t0 + ms(1900),
            "20 more at 10 a second take 2s: {now:?}"
        );
    }

    /// A backlog waiting for tokens: every wake-up of the task wakes a
    /// target (it sleeps until the next token instead of spinning through
    /// the backlog), and the backlog drains at the bucket's rate.
    #[test]
    fn a_backlog_costs_one_wake_up_per_token() {
        let t0 = Instant::now();
        let limits = Limits {
            per_target: ms(500),
            per_second: 100,
        };
        let mut g = Gate::new(limits, t0);
        for i in 0..1000 {
            g.notice(&Target::new("ns", format!("t{i}")), t0);
        }
        let (mut wake_ups, mut woken, mut now) = (0, 0, t0);
        while let Some(at) = g.next_due() {
            assert!(at >= now, "a wake-up in the past: a spin");
            now = at;
            wake_ups += 1;
            let n = g.take_due(now).len();
            assert!(n > 0, "wake-up {wake_ups} at {:?} woke nothing", now - t0);
            woken += n;
        }
        assert_eq!(woken, 900, "all but the burst, each once");
        assert!(wake_ups <= 900, "{wake_ups} wake-ups for 900 wakes");
        assert!(now - t0 >= ms(8900), "at 100 a second: {:?}", now - t0);
    }

    /// Wakes the gate allows up to `until`, as the task would, with their times.
    fn drain_until(g: &mut Gate, until: Instant, out: &mut Vec<(Instant, Target)>) {
        while let Some(at) = g.next_due().filter(|at| *at <= until) {
            out.extend(g.take_due(at).into_iter().map(|t| (at, t)));
        }
    }

    /// One namespace floods new targets without pause (ten a millisecond,
    /// ten times what the bucket lets through); a notice of another
    /// namespace in the middle of it is woken within a few tokens, not
    /// after the flood's backlog, and the flood loses nothing.
    #[test]
    fn a_flooding_namespace_delays_another_by_about_one_token() {
        let t0 = Instant::now();
        let limits = Limits {
            per_target: ms(500),
            per_second: 100,
        };
        let mut g = Gate::new(limits, t0);
        let quiet = Target::new("quiet", "q");
        let mut woken = Vec::new();
        let (mut sent, mut at_once) = (0, 0);
        for step in 0..1000 {
            let now = t0 + ms(step);
            drain_until(&mut g, now, &mut woken);
            for _ in 0..10 {
                let fate = g.notice(&Target::new("flood", format!("t{sent}")), now);
                at_once += usize::from(fate == Fate::Woke);
                sent += 1;
            }
            if step == 100 {
                assert_eq!(g.notice(&quiet, now), Fate::Folded, "the bucket is empty");
            }
        }
        let at = woken.iter().find(|(_, t)| *t == quiet).map(|(at, _)| *at);
        assert!(
            at.is_some_and(|at| at <= t0 + ms(130)),
            "noticed at 100ms, woken at {:?}",
            at.map(|at| at - t0)
        );
        drain_until(&mut g, t0 + Duration::from_secs(600), &mut woken);
        let flood = woken.iter().filter(|(_, t)| t.namespace == "flood").count();
        assert_eq!(
            flood + at_once,
            sent,
            "every flood target woken once ({at_once} at once)"
        );
        assert!(at_once <= 101, "the burst, and a token at most: {at_once}");
    }
}
