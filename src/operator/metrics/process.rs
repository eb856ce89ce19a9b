//! Process metrics read from `/proc/self` on each scrape (Linux): CPU time,
//! memory, file descriptors and start time, named as Prometheus' client
//! libraries name them, under the operator's prefix
//! (`targetlease_process_cpu_seconds_total`, …).
//!
//! Elsewhere (or when `/proc` is not mounted) the collector reports nothing.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Clock ticks per second of `/proc/<pid>/stat` times: `USER_HZ`, which the
/// kernel fixes at 100 for user space on every architecture Linux runs
/// containers on.
const USER_HZ: f64 = 100.0;

/// One reading of the process.
#[derive(Debug, Default, PartialEq)]
pub struct Reading {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Resident set size, bytes.
    pub resident_bytes: i64,
    /// Virtual memory size, bytes.
    pub virtual_bytes: i64,
    /// Start time, seconds since the Unix epoch.
    pub start_time_seconds: f64,
    /// Open file descriptors.
    pub open_fds: i64,
    /// The soft limit on open file descriptors.
    pub max_fds: Option<i64>,
}

/// Reads `/proc/self`; `None` where that is not possible.
pub fn read() -> Option<Reading> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as i64;
    parse(&stat, &status, &boot, &limits, open_fds)
}

/// Parses the `/proc` files (separate from [`read`] so it can be tested).
pub fn parse(stat: &str, status: &str, boot: &str, limits: &str, open_fds: i64) -> Option<Reading> {
    // The command name (field 2) may contain spaces and parentheses: the
    // fields we want follow the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state): field N is fields[N - 3].
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok());
    let (utime, stime, starttime) = (field(14)?, field(15)?, field(22)?);
    let kib = |key: &str| {
        status.lines().find_map(|l| {
            let rest = l.strip_prefix(key)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<i64>().ok()
        })
    };
    let btime = boot
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())?;
    let max_fds = limits.lines().find_map(|l| {
        let rest = l.strip_prefix("Max open files")?;
        rest.split_whitespace().next()?.parse::<i64>().ok()
    });
    Some(Reading {
        cpu_seconds: (utime + stime) / USER_HZ,
        resident_bytes: kib("VmRSS").unwrap_or(0) * 1024,
        virtual_bytes: kib("VmSize").unwrap_or(0) * 1024,
        start_time_seconds: btime + starttime / USER_HZ,
        open_fds,
        max_fds,
    })
}

/// The collector: registered once in the operator's registry.
#[derive(Debug)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(r) = read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(r.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent, in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size, in bytes",
                r.resident_bytes as f64,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size, in bytes",
                r.virtual_bytes as f64,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds",
                r.start_time_seconds,
            ),
            (
                "process_open_fds",
                "Open file descriptors",
                r.open_fds as f64,
            ),
        ];
        for (name, help, value) in gauges {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        if let Some(max) = r.max_fds {
            let g = ConstGauge::new(max as f64);
            g.encode(encoder.encode_descriptor(
                "process_max_fds",
                "Limit on open file descriptors",
                None,
                g.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files_including_a_command_name_with_spaces() {
        let stat = "4242 (tl (op) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 8 0 1234500 123456789 2048 18446744073709551615";
        let status = "Name:\ttl\nVmSize:\t  120000 kB\nVmRSS:\t   30000 kB\n";
        let boot = "cpu  1 2 3\nbtime 1700000000\nprocesses 10\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1048576              1048576              files\n";
        let r = parse(stat, status, boot, limits, 12).unwrap();
        assert_eq!(
            r,
            Reading {
                cpu_seconds: 3.0,
                resident_bytes: 30000 * 1024,
                virtual_bytes: 120000 * 1024,
                start_time_seconds: 1700000000.0 + 12345.0,
                open_fds: 12,
                max_fds: Some(1048576),
            }
        );
        assert_eq!(parse("garbage", status, boot, limits, 1), None);
    }

    #[test]
    fn reads_this_process() {
        let r = read().expect("/proc is mounted on Linux");
        assert!(r.resident_bytes > 0 && r.open_fds > 0, "{r:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            r.start_time_seconds <= now + 1.0 && r.start_time_seconds > now - 86400.0 * 365.0,
            "{r:?}"
        );
    }
}
