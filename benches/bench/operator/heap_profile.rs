//! Where the operator's heap goes: the operator holding the run's leases is
//! replaced by one started under heaptrack on the same namespace; it
//! re-adopts every lease, renews them all, runs a little longer and stops;
//! `heaptrack_print` then gives the bytes live at the heap's peak by stack.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::process::Command;
use std::time::{Duration, Instant};

use super::process::{How, Operator, renews};
use super::{Bench, HeapProfile, Results};

/// Time the profiled operator keeps running once it has renewed every lease.
const SETTLE: Duration = Duration::from_secs(20);
/// Sites listed in the doc.
const SITES: usize = 8;

pub(super) async fn heap_profile(
    b: &Bench<'_>,
    ns: &str,
    mut op: Operator,
    leases: usize,
    results: &mut Results,
) {
    eprintln!("bench: heap profile of an operator holding {leases} leases");
    op.stop(); // gives the election Lease up: the profiled one leads at once
    let out = b.dir.path().join("operator-heap");
    let heaptrack = crate::support::tools::tool("heaptrack");
    let wrapper = [heaptrack.as_os_str(), OsStr::new("-o"), out.as_os_str()];
    let started = Instant::now();
    // heaptrack sees the C library's malloc only: the binary's own
    // allocator (jemalloc) is linked in under names of its own, so the
    // profile is of the same source built with `--no-default-features`
    // (scripts/bench.sh builds it): the same live heap, allocated by glibc.
    let glibc = super::glibc_exe();
    if std::env::var_os("BENCH_OPERATOR_EXE").is_some() {
        eprintln!("bench: the heap profile is of this tree's source, not of BENCH_OPERATOR_EXE");
    }
    let how = How {
        watch: Some(ns),
        wrapper: &wrapper,
        concurrency: None,
        exe: Some(&glibc),
    };
    let mut prof = Operator::start_watching(&b.cp, &b.valkey, ns, b.dir.path(), 300, &how);
    assert!(
        prof.wait_ready(Duration::from_secs(180)).await,
        "operator under heaptrack not ready"
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    while renews(&prof.metrics()) < leases as f64 {
        assert!(
            Instant::now() < deadline,
            "the operator under heaptrack renewed only {} of {leases} leases",
            renews(&prof.metrics())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(SETTLE).await;
    prof.stop();
    let secs = started.elapsed().as_secs_f64();
    let data = std::fs::read_dir(b.dir.path())
        .expect("bench dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("operator-heap."))
        })
        .expect("heaptrack's data file");
    let stacks = b.dir.path().join("operator-heap.stacks");
    let summary = Command::new(crate::support::tools::tool("heaptrack_print"))
        .arg("-f")
        .arg(&data)
        .args(["--print-peaks", "0", "--print-allocators", "0"])
        .args(["--print-temporary", "0", "--print-leaks", "0"])
        .args(["--flamegraph-cost-type", "peak", "-F"])
        .arg(&stacks)
        .output()
        .expect("run heaptrack_print");
    assert!(summary.status.success(), "heaptrack_print failed");
    let summary = String::from_utf8_lossy(&summary.stdout);
    let stacks = std::fs::read_to_string(&stacks).expect("heaptrack stacks");
    let count = |label: &str| {
        summary
            .lines()
            .find_map(|l| l.strip_prefix(label))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let (peak, sites) = by_site(&stacks);
    results.heap = Some(HeapProfile {
        leases,
        settle_secs: SETTLE.as_secs(),
        secs,
        peak_heap_bytes: peak,
        sites: sites.into_iter().take(SITES).collect(),
        allocations: count("calls to allocation functions: "),
        temporary: count("temporary memory allocations: "),
    });
}

/// Frames that only move bytes around or drive futures: the allocator,
/// collections, codecs, the async runtime.
const PLUMBING: [&str; 13] = [
    "alloc::",
    "core::",
    "std::",
    "hashbrown::",
    "serde",
    "bytes::",
    "futures",
    "tokio::",
    "kube_runtime::utils::",
    "0x",
    "malloc",
    "realloc",
    "main",
];

/// A legacy-mangled Rust frame (`_$LT$a..B$u20$as$u20$c..D$GT$::f::h0123…`)
/// as a path (`<a::B as c::D>::f`), without the hash.
fn demangle(frame: &str) -> String {
    let mut s = frame.strip_prefix('_').unwrap_or(frame).to_string();
    for (from, to) in [
        ("$LT$", "<"),
        ("$GT$", ">"),
        ("$u20$", " "),
        ("$C$", ","),
        ("$RF$", "&"),
        ("$BP$", "*"),
        ("$u7b$", "{"),
        ("$u7d$", "}"),
        ("..", "::"),
    ] {
        s = s.replace(from, to);
    }
    match s.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => {
            head.to_string()
        }
        _ => s,
    }
}

fn is_plumbing(path: &str) -> bool {
    let path = path
        .trim_start_matches(['<', '&'])
        .trim_start_matches("mut ");
    // `RNv…`, `RINv…`: a v0-mangled frame heaptrack left as it was (std's).
    let v0 = path.starts_with('R') && path.chars().nth(1).is_some_and(|c| c.is_ascii_uppercase());
    path.is_empty()
        || v0
        || path.starts_with("S as ")
        || PLUMBING.iter().any(|p| path.starts_with(p))
}

/// A path for the doc, `Type::method`: `<a::B<T> as c::D>::f` is `B::f`,
/// `<impl D for a::B<T>>::f` too; a free function keeps its path.
fn short(path: &str) -> String {
    let method = without_generics(path)
        .rsplit("::")
        .next()
        .unwrap_or_default()
        .to_string();
    let bare = path.trim_start_matches('<');
    let ty = if let Some((_, ty)) = bare.split_once(" for ") {
        Some(ty)
    } else {
        bare.split_once(" as ").map(|(ty, _)| ty)
    };
    match ty {
        Some(ty) => {
            let ty = without_generics(ty);
            let ty = ty.trim_end_matches([':', '>']);
            format!("{}::{method}", ty.rsplit("::").next().unwrap_or(ty))
        }
        None => without_generics(path),
    }
}

fn without_generics(s: &str) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for ch in s.chars() {
        match ch {
            '<' => depth += 1,
            '>' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(ch),
            _ => {}
        }
    }
    out
}

/// The site of a stack (`root;…;leaf`): the deepest frame of our code or of
/// a library that is not plumbing, with the nearest such frame that called it.
fn site(stack: &str) -> String {
    let named: Vec<String> = stack
        .split(';')
        .rev()
        .map(demangle)
        .filter(|f| !is_plumbing(f))
        .map(|f| short(&f))
        .take(2)
        .collect();
    match named.as_slice() {
        [] => "(runtime)".into(),
        [leaf] => leaf.clone(),
        [leaf, caller, ..] => format!("{leaf} ← {caller}"),
    }
}

/// (bytes live at the peak, sites by those bytes, largest first) from
/// heaptrack's flame-graph lines (`frame;frame;… bytes`).
fn by_site(stacks: &str) -> (f64, Vec<(String, f64)>) {
    let mut sites: HashMap<String, f64> = HashMap::new();
    let mut total = 0.0;
    for line in stacks.lines() {
        let Some((stack, bytes)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(bytes) = bytes.parse::<f64>() else {
            continue;
        };
        total += bytes;
        *sites.entry(site(stack)).or_default() += bytes;
    }
    let mut sites: Vec<_> = sites.into_iter().collect();
    sites.sort_by(|a, b| b.1.total_cmp(&a.1));
    (total, sites)
}
