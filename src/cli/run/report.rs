//! What `run` tells its caller: its exit codes, the one summary it writes
//! on stderr (text for people, JSON or YAML for programs), and the notices
//! a person sees while it waits.

use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;

use crate::cli::output::{Answer, Envelope, Format, for_people, human_ms, to_yaml};
use crate::store::{Lease, Outcome};

/// The target stayed held by someone else for all of `--wait` (at once with
/// `-n`): CMD did not start. EX_TEMPFAIL of sysexits.h: try again later.
pub const EXIT_BUSY: u8 = 75;
/// The lease ended while CMD ran (CMD was stopped, or ended without it), as
/// `timeout(1)` exits 124 when it stopped its command.
pub const EXIT_LOST: u8 = 124;
/// `run` itself failed before CMD started: the store could not be reached
/// or answered unusably (as `timeout(1)` and `env(1)` exit 125).
pub const EXIT_FAILED: u8 = 125;

/// The last thing `run` prints (on stderr): the lease envelope plus how it ended.
#[derive(Serialize)]
struct Summary {
    #[serde(flatten)]
    envelope: Envelope,
    /// The exit code of `run` itself.
    exit_code: u8,
    /// CMD's own exit code (`128 + N` for signal N); null when it never started.
    command_exit_code: Option<u8>,
    /// True when the lease ended (or could not be confirmed) while CMD ran.
    lease_lost: bool,
}

/// Prints `run`'s report in one format.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reporter {
    pub(super) format: Format,
}

impl Reporter {
    /// Writes the summary and returns `exit_code`.
    pub(super) fn finish(
        self,
        mut envelope: Envelope,
        exit_code: u8,
        command_exit_code: Option<u8>,
        lease_lost: bool,
    ) -> ExitCode {
        // stderr is usually collected as logs: never the capability nor the metadata there.
        envelope.lease = envelope.lease.map(|l| Lease {
            lease_id: None,
            metadata: None,
            ..l
        });
        let summary = Summary {
            envelope,
            exit_code,
            command_exit_code,
            lease_lost,
        };
        match self.format {
            Format::Text => eprintln!("{}", text(&summary)),
            Format::Yaml => eprint!("{}", to_yaml(&summary)),
            Format::Json => match serde_json::to_string(&summary) {
                Ok(line) => eprintln!("{line}"),
                Err(_) => eprintln!("{}", summary.envelope.to_json()),
            },
        }
        ExitCode::from(exit_code)
    }

    /// Tells a person (text only) what the wait is for, once per kind of
    /// obstacle: a holder, or an unreachable store.
    pub(super) fn waiting(self, wait: Duration) -> impl FnMut(&Envelope) + Send {
        let mut last: Option<&'static str> = None;
        move |env: &Envelope| {
            if self.format != Format::Text || last == Some(env.outcome) {
                return;
            }
            last = Some(env.outcome);
            let budget = humantime::format_duration(wait);
            match (env.answer(), &env.lease) {
                (Answer::Store(Outcome::Held), Some(l)) => eprintln!(
                    "targetlease run: {} is held by {} (token {}); waiting up to {budget}",
                    for_people(&l.target),
                    for_people(&l.owner),
                    l.fencing_token
                ),
                _ => eprintln!(
                    "targetlease run: {}: {}; retrying for up to {budget}",
                    env.outcome,
                    for_people(&env.message)
                ),
            }
        }
    }
}

/// One line for people: what happened, the lease, the exit code.
fn text(s: &Summary) -> String {
    let mut line = format!("targetlease run: {}", for_people(&s.envelope.message));
    if let Some(l) = &s.envelope.lease {
        line.push_str(&format!(
            " ({}, token {}, owner {}",
            for_people(&l.target),
            l.fencing_token,
            for_people(&l.owner)
        ));
        if s.envelope.server_time_ms > 0 && s.envelope.outcome == "held" {
            let left = l.expires_at_ms.saturating_sub(s.envelope.server_time_ms);
            line.push_str(&format!(", expires in {}", human_ms(left)));
        }
        line.push(')');
    }
    if s.lease_lost {
        line.push_str("; the lease was lost");
    }
    line.push_str(&format!("; exit {}", s.exit_code));
    line
}

/// `run`'s exit code once CMD has exited with `child_code`, and whether the
/// lease was lost while it ran. `answer` is the renewal's report of the loss
/// (`lost_while_running`) or else the final release's answer: a refused
/// release means the lease had ended before a renewal noticed, which is a
/// loss too. No client required.
pub(crate) fn ending(child_code: u8, answer: Answer, lost_while_running: bool) -> (u8, bool) {
    let refused = matches!(answer, Answer::Store(o) if o != Outcome::Released);
    if lost_while_running || refused {
        (EXIT_LOST, true)
    } else {
        (child_code, false)
    }
}

/// `run`'s exit code when the lease was never acquired: busy when someone
/// else held it, failed for anything else.
pub(super) fn not_acquired(env: &Envelope) -> u8 {
    match env.answer() {
        Answer::Store(Outcome::Held) => EXIT_BUSY,
        _ => EXIT_FAILED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease() -> Lease {
        Lease {
            target: "db".into(),
            lease_id: Some("secret".into()),
            owner: "bob".into(),
            fencing_token: 7,
            acquired_at_ms: 1_000,
            expires_at_ms: 31_000,
            max_expires_at_ms: None,
            metadata: None,
        }
    }

    #[test]
    fn never_acquired_is_busy_only_when_someone_holds_it() {
        let held = Envelope::from_reply(crate::store::Reply {
            outcome: Outcome::Held,
            lease: Some(lease()),
            server_time_ms: 1_000,
            message: "target is held".into(),
        });
        assert_eq!(not_acquired(&held), EXIT_BUSY);
        for answer in [Answer::BackendUnavailable, Answer::OutcomeUnknown] {
            let env = Envelope::from_backend_error(answer, "down".into());
            assert_eq!(not_acquired(&env), EXIT_FAILED);
        }
        let corrupt = Envelope::from_reply(crate::store::Reply {
            outcome: Outcome::CorruptState,
            lease: None,
            server_time_ms: 1,
            message: "bad".into(),
        });
        assert_eq!(not_acquired(&corrupt), EXIT_FAILED);
        let codes = [EXIT_BUSY, EXIT_LOST, EXIT_FAILED, 126, 127, 2];
        for (i, a) in codes.iter().enumerate() {
            assert!(!codes[i + 1..].contains(a), "exit codes must differ");
        }
    }

    #[test]
    fn the_text_summary_names_the_lease_but_never_its_id() {
        let mut env = Envelope::from_reply(crate::store::Reply {
            outcome: Outcome::Released,
            lease: Some(lease()),
            server_time_ms: 2_000,
            message: "lease released".into(),
        });
        env.message = "command exited with 0; lease released".into();
        let s = Summary {
            envelope: env,
            exit_code: 0,
            command_exit_code: Some(0),
            lease_lost: false,
        };
        let line = text(&s);
        assert_eq!(
            line,
            "targetlease run: command exited with 0; lease released (db, token 7, owner bob); exit 0"
        );
    }
}
