//! `targetlease lease list`: every lease record of a namespace (or all of
//! them), each read through the same atomic get as `lease get`, so an expired
//! or corrupt record shows as such and never as live. Lease ids are never
//! shown. One JSON object per line (`-o text`: a table; `-o yaml`: one
//! sequence).

use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;

use super::lease::ListArgs;
use super::output::{self, EXIT_OK, Format, Report, for_people, human_ms};
use crate::store::{Lease, Listed, StoreError};

/// One line of `lease list`.
#[derive(Serialize)]
struct Entry<'a> {
    namespace: &'a str,
    target: &'a str,
    /// `found`, `expired` or `corrupt_state`.
    outcome: &'static str,
    lease: Option<Lease>,
    server_time_ms: u64,
    message: &'a str,
}

impl<'a> Entry<'a> {
    fn of(l: &'a Listed) -> Self {
        Entry {
            namespace: &l.target.namespace,
            target: &l.target.name,
            outcome: l.reply.outcome.as_str(),
            lease: l.reply.lease.clone().map(Lease::without_lease_id),
            server_time_ms: l.reply.server_time_ms,
            message: &l.reply.message,
        }
    }
}

/// The table `-o text` prints: one line per record, whatever the names hold.
fn table(listed: &[Listed]) -> String {
    let mut out = String::from("NAMESPACE\tTARGET\tSTATE\tOWNER\tTOKEN\tEXPIRES IN\n");
    for l in listed {
        let (owner, token, left) = match &l.reply.lease {
            Some(lease) => (
                for_people(&lease.owner),
                lease.fencing_token.to_string(),
                human_ms(lease.expires_at_ms.saturating_sub(l.reply.server_time_ms)),
            ),
            None => ("-".into(), "-".to_owned(), "-".to_owned()),
        };
        out.push_str(&format!(
            "{}\t{}\t{}\t{owner}\t{token}\t{left}\n",
            for_people(&l.target.namespace),
            for_people(&l.target.name),
            l.reply.outcome.as_str()
        ));
    }
    out
}

/// Runs `lease list`; exit 0 with the entries (possibly none), 3 on backend trouble.
pub async fn main(args: &ListArgs) -> ExitCode {
    let config = match args.client.conn.to_store_config() {
        Ok(c) => c,
        Err(msg) => return output::usage_error(&msg),
    };
    let namespace = (!args.all_namespaces).then_some(args.namespace.as_str());
    if let Some(ns) = namespace
        && let Err(StoreError::Invalid(msg)) = crate::store::check_name("namespace", ns)
    {
        return output::usage_error(&msg);
    }
    let format = args.client.out.or(Format::Json);
    let store = match config.connect().await {
        Ok(s) => s,
        Err(e) => return output::emit_as(Report::from(e), format),
    };
    // Scanning and reading every record can take longer than one call.
    let budget = config.timeout() * 4 + Duration::from_secs(1);
    let listed = tokio::time::timeout(budget, store.list(namespace, &args.target_prefix)).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), store.close()).await;
    let listed = match listed {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => return output::emit_as(Report::from(e), format),
        Err(_) => {
            let e = StoreError::BackendUnavailable(format!(
                "no complete listing from {} in time",
                config.backend()
            ));
            return output::emit_as(Report::from(e), format);
        }
    };
    match format {
        Format::Json => {
            let mut lines = String::new();
            for l in &listed {
                lines.push_str(&serde_json::to_string(&Entry::of(l)).unwrap_or_default());
                lines.push('\n');
            }
            output::print_out(&lines);
        }
        Format::Text => output::print_out(&table(&listed)),
        Format::Yaml => {
            let entries: Vec<Entry> = listed.iter().map(Entry::of).collect();
            output::print_out(&output::to_yaml(&entries));
        }
    }
    ExitCode::from(EXIT_OK)
}
