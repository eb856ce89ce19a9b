//! Whether every part of the workload did something: a part that silently
//! stopped working (a broken CLI, a sink that never accepts, an operator
//! that never publishes) breaks no property, so without this it would pass
//! every run.

use crate::history::{Answer, History, OpKind, Sink};

/// What the run had in it, beyond the lease clients and both sinks.
#[derive(Clone, Copy, Debug)]
pub struct Parts {
    /// The operator ran: TargetLease status and pod marks are expected.
    pub operator: bool,
    /// A positive control broke a sink on purpose: it may accept nothing.
    pub sinks_may_fail: bool,
}

/// The parts that never succeeded once, each as a sentence.
pub fn idle(h: &History, parts: Parts) -> Vec<&'static str> {
    let acquired_by = |prefix: &str| {
        h.ops.iter().any(|o| {
            o.kind == OpKind::Acquire && o.answer.is("acquired") && o.client.starts_with(prefix)
        })
    };
    let accepted = |sink: Sink, what: &str| {
        parts.sinks_may_fail || h.writes.iter().any(|w| w.sink == sink && w.answer.is(what))
    };
    let operator = |seen: bool| !parts.operator || seen;
    // The CLI client (a process per call, slower under load) may lose every
    // race of a short run: it must get answers from the store, not wins.
    let answered_cli = h.ops.iter().any(|o| {
        o.client.starts_with("cli")
            && matches!(&o.answer, Answer::Said(a) if !a.starts_with("invalid"))
    });
    [
        (acquired_by("lib"), "no library client acquired a lease"),
        (answered_cli, "no CLI client got an answer from the store"),
        (
            accepted(Sink::Postgres, "accepted"),
            "PostgreSQL accepted no write",
        ),
        (
            accepted(Sink::Commit, "committed"),
            "`lease commit` committed nothing",
        ),
        (
            operator(h.publications.iter().any(|p| p.token.is_some())),
            "no TargetLease status carried a token",
        ),
        (
            operator(h.pods.iter().any(|p| !p.marks.is_empty())),
            "no pod was marked leader",
        ),
    ]
    .into_iter()
    .filter(|(ok, _)| !ok)
    .map(|(_, what)| what)
    .collect()
}

/// The first request the store rejected as invalid: nothing was sent, so
/// the workload (or the CLI's command line) is broken.
pub fn first_invalid(h: &History) -> Option<String> {
    let ops = h.ops.iter().map(|o| (&o.client, &o.answer));
    let writes = h.writes.iter().map(|w| (&w.client, &w.answer));
    ops.chain(writes).find_map(|(client, answer)| match answer {
        Answer::Said(a) if a.starts_with("invalid") => Some(format!("{client}: {a}")),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::fixtures::{H, said};

    const CLIENTS: Parts = Parts {
        operator: false,
        sinks_may_fail: false,
    };
    const OPERATOR: Parts = Parts {
        operator: true,
        sinks_may_fail: false,
    };

    fn busy() -> H {
        H::new()
            .acquired("lib0", "t", "r1", 1, 100, 300)
            .acquired("cli0", "t", "r2", 2, 300, 500)
            .write(Sink::Postgres, "t", 1, "w1", said("accepted"), 0)
            .write(Sink::Commit, "t", 1, "w1", said("committed"), 150)
    }

    #[test]
    fn a_run_where_every_part_worked_has_no_idle_part() {
        assert_eq!(idle(&busy().build(), CLIENTS), Vec::<&str>::new());
        let operator = busy()
            .publish("x", "op", 1, Some(1), Some(("q1", 100, 900)))
            .pod("p1", 2, &[("el", 1, 900)])
            .build();
        assert_eq!(idle(&operator, OPERATOR), Vec::<&str>::new());
    }

    #[test]
    fn a_cli_that_never_acquired_is_an_idle_part() {
        // The library clients alone keep every property true.
        let h = H::new()
            .acquired("lib0", "t", "r1", 1, 100, 300)
            .acquire_answer("cli0", "t", "r2", said("invalid: bad flag"), None, 0)
            .write(Sink::Postgres, "t", 1, "w1", said("accepted"), 0)
            .write(Sink::Commit, "t", 1, "w1", said("committed"), 150)
            .build();
        assert_eq!(
            idle(&h, CLIENTS),
            vec!["no CLI client got an answer from the store"]
        );
        assert_eq!(
            first_invalid(&h).as_deref(),
            Some("cli0: invalid: bad flag")
        );
        assert_eq!(first_invalid(&busy().build()), None);
    }

    #[test]
    fn a_sink_that_refused_everything_is_idle_unless_a_control_broke_it() {
        let h = H::new()
            .acquired("lib0", "t", "r1", 1, 100, 300)
            .acquired("cli0", "t", "r2", 2, 300, 500)
            .write(Sink::Postgres, "t", 1, "w1", said("refused"), 0)
            .write(Sink::Commit, "t", 1, "w1", said("stale_token"), 150)
            .build();
        assert_eq!(
            idle(&h, CLIENTS),
            vec![
                "PostgreSQL accepted no write",
                "`lease commit` committed nothing"
            ]
        );
        let control = Parts {
            sinks_may_fail: true,
            ..CLIENTS
        };
        assert_eq!(idle(&h, control), Vec::<&str>::new());
    }

    #[test]
    fn an_operator_that_never_published_a_token_or_marked_a_pod_is_idle() {
        let h = busy()
            .publish("x", "op", 1, None, None)
            .pod("p1", 2, &[])
            .build();
        assert_eq!(
            idle(&h, OPERATOR),
            vec![
                "no TargetLease status carried a token",
                "no pod was marked leader"
            ]
        );
    }
}
