//! The fault matrix's command line: filter words and `--skip` words.

/// The words of the command line, as libtest would read them.
#[derive(Debug, PartialEq)]
pub struct Words<'a> {
    /// `long`, and filters: keep the scenarios whose name contains one.
    pub words: Vec<&'a str>,
    /// `--skip WORD`: drop scenarios whose name contains one.
    pub skips: Vec<&'a str>,
}

/// Splits the arguments into filter words and `--skip` words. libtest's
/// flags mean nothing here and are ignored, with the value of those that
/// take one (`--test-threads 1` is not a filter "1", `--skip long` is not
/// long mode).
pub fn words(args: &[String]) -> Words<'_> {
    const TAKES_VALUE: &[&str] = &[
        "--test-threads",
        "--format",
        "--logfile",
        "--color",
        "--shuffle-seed",
        "-Z",
    ];
    let mut out = Words {
        words: Vec::new(),
        skips: Vec::new(),
    };
    let mut it = args.iter().map(String::as_str);
    while let Some(a) = it.next() {
        if a == "--skip" {
            out.skips.extend(it.next().filter(|w| !w.is_empty()));
        } else if let Some(w) = a.strip_prefix("--skip=") {
            out.skips.extend(Some(w).filter(|w| !w.is_empty()));
        } else if TAKES_VALUE.contains(&a) {
            it.next();
        } else if !a.starts_with('-') {
            out.words.push(a);
        }
    }
    out
}

/// The scenarios the words choose: a word that is a scenario's whole name
/// chooses that scenario only, any other word every scenario whose name
/// contains it (`restart-aof-everysec` is one scenario, `restart` is five);
/// no word chooses all. `--skip` words drop scenarios the same way. In the
/// order of the words that choose them, each once (for `fill`, which runs
/// them in that order), then in the matrix's order.
pub fn choose<S>(all: Vec<S>, name: impl Fn(&S) -> &str, words: &[&str], skips: &[&str]) -> Vec<S> {
    let names: Vec<String> = all.iter().map(|s| name(s).to_string()).collect();
    let hits = |n: &str, w: &str| {
        if names.iter().any(|m| m == w) {
            n == w
        } else {
            n.contains(w)
        }
    };
    let mut chosen: Vec<(usize, S)> = all
        .into_iter()
        .filter_map(|s| {
            let first = if words.is_empty() {
                Some(0)
            } else {
                words.iter().position(|w| hits(name(&s), w))
            };
            first.map(|i| (i, s))
        })
        .filter(|(_, s)| !skips.iter().any(|w| hits(name(s), w)))
        .collect();
    chosen.sort_by_key(|(i, _)| *i); // stable: the matrix's order within a word
    chosen.into_iter().map(|(_, s)| s).collect()
}
