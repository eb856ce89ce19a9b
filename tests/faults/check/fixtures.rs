//! A small builder for synthetic histories in the checker's unit tests.
//! Local times advance by one per record, in the order records are added.

use crate::history::*;

/// A history under construction.
#[derive(Default)]
pub struct H {
    pub h: History,
    clock: u64,
}

pub fn said(s: &str) -> Answer {
    Answer::Said(s.to_string())
}

pub fn view(owner: &str, token: u64, issue: &str, acquired: u64, expires: u64) -> LeaseView {
    LeaseView {
        owner: owner.to_string(),
        token,
        issue: issue.to_string(),
        acquired_at_ms: acquired,
        expires_at_ms: expires,
    }
}

/// An operation record with no lease, token or server time yet.
fn record(client: &str, kind: OpKind, target: &str, request_id: &str, answer: Answer) -> OpRecord {
    OpRecord {
        client: client.into(),
        kind,
        target: target.into(),
        request_id: request_id.into(),
        invoke_ms: 0,
        complete_ms: 0,
        answer,
        lease: None,
        token: None,
        server_ms: 0,
        issue: None,
        detail: String::new(),
    }
}

impl H {
    pub fn new() -> Self {
        Self::default()
    }

    /// The store's times are read as `dating` says.
    pub fn dated(mut self, dating: crate::history::Dating) -> Self {
        self.h.dating = dating;
        self
    }

    /// The next record is sent at local time `ms` (and answered 1 ms later).
    pub fn at(mut self, ms: u64) -> Self {
        self.clock = ms.saturating_sub(2);
        self
    }

    fn tick(&mut self) -> (u64, u64) {
        self.clock += 2;
        (self.clock, self.clock + 1)
    }

    fn op(mut self, mut r: OpRecord) -> Self {
        (r.invoke_ms, r.complete_ms) = self.tick();
        self.h.ops.push(r);
        self
    }

    /// An acknowledged acquire: request id `issue`, lease `[acquired, expires)`.
    pub fn acquired(
        self,
        client: &str,
        target: &str,
        issue: &str,
        token: u64,
        acquired: u64,
        expires: u64,
    ) -> Self {
        self.op(OpRecord {
            lease: Some(view(client, token, issue, acquired, expires)),
            token: Some(token),
            server_ms: acquired,
            ..record(client, OpKind::Acquire, target, issue, said("acquired"))
        })
    }

    /// An acquire that was not acknowledged (refused, unavailable or unknown).
    pub fn acquire_answer(
        self,
        client: &str,
        target: &str,
        request_id: &str,
        answer: Answer,
        current: Option<LeaseView>,
        server_ms: u64,
    ) -> Self {
        self.op(OpRecord {
            lease: current,
            server_ms,
            ..record(client, OpKind::Acquire, target, request_id, answer)
        })
    }

    /// A renew of the lease `(issue, token)`; `expires` is the reply's new expiry.
    pub fn renew(
        self,
        client: &str,
        target: &str,
        (issue, token): (&str, u64),
        answer: Answer,
        server_ms: u64,
        expires: u64,
    ) -> Self {
        let lease = answer
            .is("renewed")
            .then(|| view(client, token, issue, 0, expires));
        self.op(OpRecord {
            lease,
            token: Some(token),
            server_ms,
            issue: Some(issue.into()),
            ..record(
                client,
                OpKind::Renew,
                target,
                &format!("renew-{server_ms}"),
                answer,
            )
        })
    }

    /// A release of the lease with `token`.
    pub fn release(
        self,
        client: &str,
        target: &str,
        token: u64,
        answer: Answer,
        server_ms: u64,
    ) -> Self {
        self.op(OpRecord {
            token: Some(token),
            server_ms,
            ..record(
                client,
                OpKind::Release,
                target,
                &format!("release-{token}"),
                answer,
            )
        })
    }

    /// A revoke (request `id`) of the lease with `token`.
    pub fn revoke(self, target: &str, id: &str, token: u64, answer: Answer) -> Self {
        self.op(OpRecord {
            token: Some(token),
            ..record("revoker", OpKind::Revoke, target, id, answer)
        })
    }

    /// An observer's look at `target`, sent at the next tick: its lease or none,
    /// at server time `server_ms`.
    pub fn look(mut self, target: &str, lease: Option<LeaseView>, server_ms: u64) -> Self {
        let (invoke_ms, at_ms) = self.tick();
        self.h.sightings.push(Sighting {
            target: target.into(),
            at_ms,
            lease,
            invoke_ms,
            server_ms,
        });
        self
    }

    /// An observer's read of `resource`'s commit key: (token, write id) or none.
    pub fn read(mut self, resource: &str, committed: Option<(u64, &str)>, server_ms: u64) -> Self {
        let (invoke_ms, complete_ms) = self.tick();
        self.h.reads.push(ReadRecord {
            resource: resource.into(),
            invoke_ms,
            complete_ms,
            server_ms,
            committed: committed.map(|(t, w)| (t, w.to_string())),
        });
        self
    }

    /// A fault that can lose acknowledged state, now.
    pub fn lossy_fault(mut self) -> Self {
        let (at_ms, _) = self.tick();
        self.h.faults.push(FaultRecord {
            name: "restart".into(),
            at_ms,
            loses_data: true,
            healed_ms: 0,
        });
        self
    }

    /// A fault that can lose acknowledged state, on from `at_ms` to
    /// `healed_ms` (local times; the clock of the records is not moved).
    pub fn lossy_fault_at(mut self, at_ms: u64, healed_ms: u64) -> Self {
        self.h.faults.push(FaultRecord {
            name: "restart".into(),
            at_ms,
            loses_data: true,
            healed_ms,
        });
        self
    }

    /// A fault that began at `at_ms` and healed at `healed_ms` (local times;
    /// the clock of the records is not moved).
    pub fn fault(mut self, name: &str, at_ms: u64, healed_ms: u64) -> Self {
        self.h.faults.push(FaultRecord {
            name: name.into(),
            at_ms,
            loses_data: false,
            healed_ms,
        });
        self
    }

    /// The workload was told to stop at `ms`.
    pub fn stopped(mut self, ms: u64) -> Self {
        self.h.stopped_ms = ms;
        self
    }

    /// `f` applied to this builder (a helper in the middle of a chain).
    pub fn pipe(self, f: impl FnOnce(Self) -> Self) -> Self {
        f(self)
    }

    pub fn sighting(mut self, target: &str, lease: LeaseView) -> Self {
        let (at_ms, _) = self.tick();
        self.h.sightings.push(Sighting {
            target: target.into(),
            at_ms,
            lease: Some(lease),
            invoke_ms: 0,
            server_ms: 0,
        });
        self
    }

    pub fn write(
        mut self,
        sink: Sink,
        resource: &str,
        token: u64,
        write_id: &str,
        answer: Answer,
        server_ms: u64,
    ) -> Self {
        let (invoke_ms, complete_ms) = self.tick();
        self.h.writes.push(WriteRecord {
            client: "c".into(),
            sink,
            resource: resource.into(),
            token,
            write_id: write_id.into(),
            invoke_ms,
            complete_ms,
            answer,
            server_ms,
        });
        self
    }

    /// Final PostgreSQL rows: (resource, seq, token, write id).
    pub fn rows(mut self, rows: &[(&str, i64, u64, &str)]) -> Self {
        self.h.rows = Some(
            rows.iter()
                .map(|(r, s, t, w)| Row {
                    resource: r.to_string(),
                    seq: *s,
                    token: *t,
                    write_id: w.to_string(),
                })
                .collect(),
        );
        self
    }

    /// Final fenced-commit values: (resource, token, write id).
    pub fn commits(mut self, commits: &[(&str, u64, &str)]) -> Self {
        self.h.commits = Some(
            commits
                .iter()
                .map(|(r, t, w)| CommitState {
                    resource: r.to_string(),
                    token: *t,
                    write_id: w.to_string(),
                })
                .collect(),
        );
        self
    }

    /// A TargetLease version; `held` = Some((acquisition, acquired, expires)) for phase Held.
    pub fn publish(
        mut self,
        name: &str,
        target: &str,
        rv: u64,
        token: Option<u64>,
        held: Option<(&str, u64, u64)>,
    ) -> Self {
        let (seen_ms, _) = self.tick();
        self.h.publications.push(Publication {
            name: name.into(),
            target: target.into(),
            rv,
            seen_ms,
            phase: if held.is_some() { "Held" } else { "Pending" }.into(),
            after_gap: false,
            token,
            acquisition_id: held.map(|h| h.0.to_string()),
            holder_pod: None,
            acquired_at_ms: held.map(|h| h.1),
            expires_at_ms: held.map(|h| h.2),
        });
        self
    }

    /// A pod version carrying these marks: (lease name, token, expires).
    pub fn pod(mut self, pod: &str, rv: u64, marks: &[(&str, u64, u64)]) -> Self {
        let (seen_ms, _) = self.tick();
        self.h.pods.push(PodVersion {
            pod: pod.into(),
            rv,
            seen_ms,
            marks: marks
                .iter()
                .map(|(l, t, e)| Mark {
                    lease: l.to_string(),
                    token: Some(*t),
                    expires_at_ms: Some(*e),
                })
                .collect(),
            after_gap: false,
        });
        self
    }

    /// The last record (a status or pod version) was delivered by a relist.
    pub fn after_gap(mut self) -> Self {
        let last_pub = self.h.publications.last().map(|p| p.seen_ms).unwrap_or(0);
        let last_pod = self.h.pods.last().map(|p| p.seen_ms).unwrap_or(0);
        if last_pod > last_pub {
            self.h.pods.last_mut().unwrap().after_gap = true;
        } else if let Some(p) = self.h.publications.last_mut() {
            p.after_gap = true;
        }
        self
    }

    /// The pod a TargetLease's last status names.
    pub fn naming(mut self, pod: &str) -> Self {
        if let Some(p) = self.h.publications.last_mut() {
            p.holder_pod = Some(pod.into());
        }
        self
    }

    pub fn build(self) -> History {
        self.h
    }
}
