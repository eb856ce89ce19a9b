//! The one JSON envelope every lease command prints, and the exit-code contract.
//!
//! Scripts depend on both exactly: `{"outcome", "lease", "server_time_ms",
//! "message"}` on stdout, and 0 success / 1 refusal / 2 bad arguments /
//! 3 backend trouble as the exit code. Keeping them in one file keeps the
//! mapping from drifting between `lease` and `run`.

use std::process::ExitCode;

use serde::Serialize;

use crate::store::{Committed, Lease, Outcome, ReadReply, Reply, StoreError};

/// Exit code of a command that did what was asked.
pub const EXIT_OK: u8 = 0;
/// Exit code of a refusal (`held`, `not_found`, `not_owner`, …).
pub const EXIT_REFUSED: u8 = 1;
/// Exit code of bad arguments; nothing was sent to the backend.
pub const EXIT_USAGE: u8 = 2;
/// Exit code of backend trouble (`backend_unavailable`, `corrupt_state`, `outcome_unknown`).
pub const EXIT_BACKEND: u8 = 3;

/// An answer: what a command reports — a store outcome, or the backend
/// failing (printed as `outcome`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The store decided.
    Store(Outcome),
    /// The backend could not be asked; nothing happened.
    BackendUnavailable,
    /// The request may or may not have taken effect; retry with the same request id.
    OutcomeUnknown,
}

impl Answer {
    /// The stable snake_case name printed as `outcome`.
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Store(o) => o.as_str(),
            Answer::BackendUnavailable => "backend_unavailable",
            Answer::OutcomeUnknown => "outcome_unknown",
        }
    }

    /// The exit code the contract assigns to this outcome.
    pub fn exit_code(self) -> u8 {
        match self {
            Answer::Store(Outcome::CorruptState)
            | Answer::BackendUnavailable
            | Answer::OutcomeUnknown => EXIT_BACKEND,
            Answer::Store(o) if o.is_success() => EXIT_OK,
            Answer::Store(_) => EXIT_REFUSED,
        }
    }
}

/// The JSON object printed for every lease operation.
#[derive(Clone, Debug, Serialize)]
pub struct Envelope {
    /// Outcome name, e.g. `acquired` or `backend_unavailable`.
    pub outcome: &'static str,
    /// The lease the outcome is about, or `null`.
    pub lease: Option<Lease>,
    /// The server's clock when it decided; 0 when no server answered.
    pub server_time_ms: u64,
    /// One human sentence; never contains secrets.
    pub message: String,
    /// `lease read` only: the value read back (absent from every other command).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub committed: Option<Box<Committed>>,
    #[serde(skip)]
    answer: Answer,
}

impl Envelope {
    /// The envelope of a store reply. `held` and `found` never carry a lease id.
    pub fn from_reply(reply: Reply) -> Self {
        let lease = match reply.outcome {
            Outcome::Held | Outcome::Found => reply.lease.map(Lease::without_lease_id),
            _ => reply.lease,
        };
        Self {
            outcome: reply.outcome.as_str(),
            lease,
            server_time_ms: reply.server_time_ms,
            message: reply.message,
            committed: None,
            answer: Answer::Store(reply.outcome),
        }
    }

    /// The envelope of a read of a committed value (`lease` is always null).
    pub fn from_read(read: ReadReply) -> Self {
        Self {
            outcome: read.outcome.as_str(),
            lease: None,
            server_time_ms: read.server_time_ms,
            message: read.message,
            committed: read.committed.map(Box::new),
            answer: Answer::Store(read.outcome),
        }
    }

    /// The envelope of a backend failure (no server answered, so time is 0).
    pub fn from_backend_error(answer: Answer, message: String) -> Self {
        Self {
            outcome: answer.as_str(),
            lease: None,
            server_time_ms: 0,
            message,
            committed: None,
            answer,
        }
    }

    /// What the command reports.
    pub fn answer(&self) -> Answer {
        self.answer
    }

    /// The exit code for this envelope.
    pub fn exit_code(&self) -> u8 {
        self.answer.exit_code()
    }

    /// One line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| {
            format!(
                r#"{{"outcome":"{}","lease":null,"server_time_ms":0,"message":"unprintable reply"}}"#,
                self.outcome
            )
        })
    }

    /// One line for people: the outcome, the lease (never its id) and the message.
    pub fn to_text(&self) -> String {
        if let Some(c) = &self.committed {
            return format!(
                "{}: {} = {} (token {}, committed {})",
                self.outcome,
                for_people(&c.key),
                for_people(&c.value),
                c.fencing_token,
                at(c.committed_at_ms)
            );
        }
        let Some(l) = &self.lease else {
            return format!("{}: {}", self.outcome, for_people(&self.message));
        };
        let mut line = format!(
            "{}: {} held by {} with token {}",
            self.outcome,
            for_people(&l.target),
            for_people(&l.owner),
            l.fencing_token
        );
        if self.server_time_ms > 0 {
            let left = l.expires_at_ms.saturating_sub(self.server_time_ms);
            line.push_str(&format!(", expires in {}", human_ms(left)));
        }
        line.push_str(&format!(" ({})", at(l.expires_at_ms)));
        // Only the holder's own answers (acquire, renew, release) carry it.
        if let Some(id) = &l.lease_id {
            line.push_str(&format!(", lease id {}", for_people(id)));
        }
        line
    }
}

/// A command's result: an envelope to print, or arguments that can never work.
#[derive(Debug)]
pub enum Report {
    /// Printed as JSON; exit code from its outcome.
    Envelope(Envelope),
    /// Printed to stderr only; exit 2.
    Usage(String),
}

impl From<Result<Reply, StoreError>> for Report {
    fn from(result: Result<Reply, StoreError>) -> Self {
        match result {
            Ok(reply) => Report::Envelope(Envelope::from_reply(reply)),
            Err(e) => Report::from(e),
        }
    }
}

impl From<Result<Envelope, StoreError>> for Report {
    fn from(result: Result<Envelope, StoreError>) -> Self {
        match result {
            Ok(envelope) => Report::Envelope(envelope),
            Err(e) => Report::from(e),
        }
    }
}

impl From<StoreError> for Report {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Invalid(msg) => Report::Usage(msg),
            StoreError::BackendUnavailable(msg) => Report::Envelope(Envelope::from_backend_error(
                Answer::BackendUnavailable,
                msg,
            )),
            StoreError::OutcomeUnknown(msg) => {
                Report::Envelope(Envelope::from_backend_error(Answer::OutcomeUnknown, msg))
            }
        }
    }
}

/// How a command prints its result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One JSON object per line (the contract scripts rely on).
    #[default]
    Json,
    /// A line for people; the exit code is the same.
    Text,
    /// The same fields as JSON, as a YAML document.
    Yaml,
}

/// `-o/--output`: the same flag, values and variable on every command.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
#[command(next_help_heading = "Output")]
pub struct OutputArgs {
    /// json, text or yaml. Default json; `run` (which reports on stderr):
    /// text when stderr is a terminal, else json.
    #[arg(short = 'o', long = "output", env = "TARGETLEASE_OUTPUT", value_enum)]
    pub output: Option<Format>,
}

impl OutputArgs {
    /// The format asked for, or `default`.
    pub fn or(self, default: Format) -> Format {
        self.output.unwrap_or(default)
    }
}

/// `value` as a YAML document (a mapping, or a sequence).
pub fn to_yaml<T: Serialize>(value: &T) -> String {
    serde_yaml::to_string(value).unwrap_or_else(|_| "unprintable: true\n".into())
}

/// An I/O error in words (the operator's, for the file settings both use).
pub use crate::operator::config_error::io_reason;

/// `s` for a line of text for people: control characters (a line break, a
/// tab, an escape sequence), line and paragraph separators (U+2028, U+2029),
/// bidirectional controls (U+202E …) and invisible format characters are
/// shown escaped (`\n`, `\t`, `\u{1b}`, `\u{202e}`), so a stored string can
/// never break the line, forge another one, reorder what follows it or drive
/// the terminal.
pub fn for_people(s: &str) -> std::borrow::Cow<'_, str> {
    // A backslash is escaped too, so that a name spelling out an escape
    // never reads like one holding the character.
    if !s.chars().any(|c| unprintable(c) || c == '\\') {
        return s.into();
    }
    s.chars()
        .map(|c| {
            if unprintable(c) || c == '\\' {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// A character that must not reach a terminal as it is: C0/C1 controls and
/// DEL, line and paragraph separators, bidirectional marks, embeddings,
/// overrides and isolates, zero-width and other invisible format characters.
fn unprintable(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
        )
}

/// Exit code when stdout cannot be written (sysexits.h `EX_IOERR`).
pub const CANNOT_WRITE: i32 = 74;

/// Writes `text` to stdout. A closed stdout (`targetlease … | head -0`) is
/// no reason for a word or another exit code: the exit code still tells
/// what happened. Any other write error (a full disk) is said on stderr and
/// ends the command with [`CANNOT_WRITE`], so a script cannot take output
/// that was lost for output that was written.
pub fn print_out(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush())
        && e.kind() != std::io::ErrorKind::BrokenPipe
    {
        eprintln!("targetlease: cannot write the output: {}", io_reason(&e));
        std::process::exit(CANNOT_WRITE);
    }
}

/// `1.2s`, `45s`, `3m20s`: a remaining time for people.
pub fn human_ms(ms: u64) -> String {
    if ms < 10_000 {
        return format!("{:.1}s", ms as f64 / 1000.0);
    }
    let secs = ms / 1000;
    match (secs / 3600, secs % 3600 / 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

/// An instant in milliseconds since the epoch as RFC 3339 UTC.
fn at(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Prints a usage error to stderr; the caller exits 2.
pub fn usage_error(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(EXIT_USAGE)
}

/// Prints the report (envelope to stdout, usage errors to stderr) and returns the exit code.
pub fn emit(report: Report) -> ExitCode {
    emit_as(report, Format::Json)
}

/// [`emit`], in the chosen format.
pub fn emit_as(report: Report, format: Format) -> ExitCode {
    match report {
        Report::Envelope(env) => {
            match format {
                Format::Json => print_out(&format!("{}\n", env.to_json())),
                Format::Text => print_out(&format!("{}\n", env.to_text())),
                Format::Yaml => print_out(&to_yaml(&env)),
            }
            ExitCode::from(env.exit_code())
        }
        Report::Usage(msg) => usage_error(&msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_has_the_contract_exit_code() {
        let expected = [
            ("acquired", 0),
            ("renewed", 0),
            ("released", 0),
            ("revoked", 0),
            ("found", 0),
            ("committed", 0),
            ("held", 1),
            ("not_found", 1),
            ("not_owner", 1),
            ("expired", 1),
            ("stale_token", 1),
            ("idempotency_conflict", 1),
            ("corrupt_state", 3),
        ];
        for o in Outcome::ALL {
            let code = expected
                .iter()
                .find(|(n, _)| *n == o.as_str())
                .map(|(_, c)| *c)
                .unwrap_or_else(|| panic!("outcome {o} missing from the contract table"));
            assert_eq!(Answer::Store(o).exit_code(), code, "{o}");
        }
        assert_eq!(Answer::BackendUnavailable.exit_code(), 3);
        assert_eq!(Answer::OutcomeUnknown.exit_code(), 3);
    }

    #[test]
    fn text_shows_holder_token_and_time_left_but_never_the_lease_id() {
        let reply = Reply {
            outcome: Outcome::Found,
            lease: Some(Lease {
                target: "db".into(),
                lease_id: Some("secret-capability".into()),
                owner: "alice".into(),
                fencing_token: 9_007_199_254_740_993,
                acquired_at_ms: 1_000,
                expires_at_ms: 96_000,
                max_expires_at_ms: None,
                metadata: None,
            }),
            server_time_ms: 1_000,
            message: "found".into(),
        };
        let text = Envelope::from_reply(reply).to_text();
        assert_eq!(
            text,
            "found: db held by alice with token 9007199254740993, expires in 1m35s (1970-01-01T00:01:36Z)"
        );
        let free = Envelope::from_backend_error(Answer::BackendUnavailable, "down".into());
        assert_eq!(free.to_text(), "backend_unavailable: down");
    }

    #[test]
    fn text_for_people_escapes_what_can_reorder_or_break_a_line() {
        assert_eq!(for_people("plain ünï 名"), "plain ünï 名");
        assert_eq!(for_people("a\nb\u{1b}[2J"), "a\\nb\\u{1b}[2J");
        for c in [
            '\u{202E}', '\u{202A}', '\u{2066}', '\u{2069}', '\u{200E}', '\u{061C}', '\u{2028}',
            '\u{2029}', '\u{200B}', '\u{FEFF}', '\u{00AD}', '\u{0085}',
        ] {
            let shown = for_people(&format!("x{c}y")).into_owned();
            assert_eq!(shown, format!("x{}y", c.escape_default()), "{:?}", c);
            assert!(shown.is_ascii(), "{shown:?}");
        }
    }

    /// Two different names never read the same: a name spelling out an
    /// escape (`a\u{202e}`, typed) does not look like one holding the character.
    #[test]
    fn text_for_people_never_shows_two_names_alike() {
        let typed = "a\\u{202e}";
        let real = "a\u{202e}";
        assert_ne!(typed, real);
        assert_ne!(for_people(typed), for_people(real), "{typed:?} vs {real:?}");
    }

    #[test]
    fn io_errors_read_as_words() {
        let e = std::io::Error::from_raw_os_error(2);
        assert_eq!(io_reason(&e), "No such file or directory");
        assert_eq!(io_reason(&std::io::Error::other("odd")), "odd");
    }

    #[test]
    fn held_and_found_never_show_a_lease_id() {
        for outcome in [Outcome::Held, Outcome::Found] {
            let reply = Reply {
                outcome,
                lease: Some(Lease {
                    target: "t".into(),
                    lease_id: Some("secret-capability".into()),
                    owner: "o".into(),
                    fencing_token: u64::MAX / 2,
                    acquired_at_ms: 1,
                    expires_at_ms: 2,
                    max_expires_at_ms: None,
                    metadata: None,
                }),
                server_time_ms: 1,
                message: String::new(),
            };
            let json = Envelope::from_reply(reply).to_json();
            assert!(!json.contains("lease_id"), "{json}");
            assert!(json.contains(&(u64::MAX / 2).to_string()), "{json}");
        }
    }
}
