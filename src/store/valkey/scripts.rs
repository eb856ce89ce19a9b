//! The Lua scripts, compiled into the binary as one Valkey function library.
//!
//! The library is `lua/lib.lua` (the helpers, defined once when the library
//! loads, not on every call) followed by each `lua/<op>.lua` as a function
//! of its own, `targetlease_<hash>_<op>`, called with `FCALL`. The hash is
//! the library's own (the first 16 hex digits of its SHA-1), so two versions
//! of targetlease run side by side during an upgrade, each on its own
//! library. Valkey keeps a library with the data: it is replicated, written
//! to the RDB and AOF, and survives a failover or a restart with
//! persistence.
//!
//! A function refuses to write, up front, under OOM, on a read-only replica
//! or with too few replicas, instead of failing half way. Flags relax that
//! where it matters: `get` and `read` are `no-writes` (called with
//! `FCALL_RO`, they run whatever the write state), `release` and `revoke`
//! are `allow-oom` (freeing a lease must work on a full server).

use std::sync::LazyLock;

/// One operation of the library.
#[derive(Debug)]
pub struct Script {
    /// Operation name, for logs and metrics.
    pub name: &'static str,
    /// The function's name in the library, as `FCALL` wants it.
    pub function: String,
    /// Declared `no-writes`: sent with `FCALL_RO`.
    pub read_only: bool,
    /// The function's flags, as registered (`no-writes`, `allow-oom` or none).
    pub flags: &'static str,
    /// The script's own text (its header is the KEYS/ARGV contract).
    pub body: &'static str,
}

/// The function library every operation lives in.
#[derive(Debug)]
pub struct Library {
    /// `targetlease_<first 16 hex digits of sha>`.
    pub name: String,
    /// Full source as sent with `FUNCTION LOAD`.
    pub source: String,
    /// Hex SHA-1 of the library's code with `targetlease_@_` in place of its
    /// name's prefix (the name cannot be inside what it is the hash of).
    pub sha: String,
}

/// The operations, in the order they are registered: name, flags, body.
const OPERATIONS: [(&str, &str, &str); 7] = [
    ("acquire", "", include_str!("../../../lua/acquire.lua")),
    ("renew", "", include_str!("../../../lua/renew.lua")),
    (
        "release",
        "allow-oom",
        include_str!("../../../lua/release.lua"),
    ),
    ("get", "no-writes", include_str!("../../../lua/get.lua")),
    (
        "revoke",
        "allow-oom",
        include_str!("../../../lua/revoke.lua"),
    ),
    ("commit", "", include_str!("../../../lua/commit.lua")),
    ("read", "no-writes", include_str!("../../../lua/read.lua")),
];

/// The library's code after its `#!lua name=` line: lib.lua, then each
/// operation as a local function taking `KEYS` and `ARGV` (so each body
/// reads as the script it is), then the registrations, each naming its
/// function `<prefix><op>`.
fn library_code(prefix: &str) -> String {
    let mut code = String::from(include_str!("../../../lua/lib.lua"));
    for (op, _, body) in OPERATIONS {
        code.push_str(&format!(
            "\nlocal function op_{op}(KEYS, ARGV)\n{body}\nend\n"
        ));
    }
    for (op, flags, _) in OPERATIONS {
        let flags = match flags {
            "" => String::new(),
            f => format!(", flags = {{ '{f}' }}"),
        };
        code.push_str(&format!(
            "server.register_function{{ function_name = '{prefix}{op}', callback = op_{op}{flags} }}\n"
        ));
    }
    code
}

fn library() -> (Library, Vec<Script>) {
    // The names inside the code depend on the hash, so the hash is taken
    // over the code with a placeholder prefix: it changes with every
    // helper, body, flag and registration, and with nothing else.
    let sha = sha1_smol::Sha1::from(library_code("targetlease_@_").as_bytes())
        .digest()
        .to_string();
    let name = format!("targetlease_{}", &sha[..16]);
    let prefix = format!("{name}_");
    let source = format!("#!lua name={name}\n{}", library_code(&prefix));
    let scripts = OPERATIONS
        .iter()
        .map(|&(op, flags, body)| Script {
            name: op,
            function: format!("{prefix}{op}"),
            read_only: flags == "no-writes",
            flags,
            body,
        })
        .collect();
    (Library { name, source, sha }, scripts)
}

/// True when `FUNCTION LOAD` was refused because this very library is
/// loaded (its name is its code's hash). Not when another library holds one
/// of its function names ("Function … already exists"): that is an error.
pub fn already_loaded(error: &str) -> bool {
    error.starts_with(&format!(
        "ERR Library '{}' already exists",
        SCRIPTS.library.name
    ))
}

/// The lib.lua helpers a script's header lists on its `-- uses:` lines
/// (comma-separated, several lines allowed), in order: what the body
/// calls, for its reader.
#[cfg(test)]
pub(super) fn uses(body: &str) -> Vec<&str> {
    body.lines()
        .take_while(|l| l.starts_with("--"))
        .filter_map(|l| l.strip_prefix("-- uses:"))
        .flat_map(|l| l.split(','))
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect()
}

/// The name a lib.lua helper defines on its first line, if it starts one:
/// `local function NAME(` or `local NAME =`.
#[cfg(test)]
fn defines(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("local ")?;
    let rest = rest.strip_prefix("function ").unwrap_or(rest);
    let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
    (end > 0).then(|| &rest[..end])
}

/// Whether `text` uses the identifier `name` (not as part of a longer one).
#[cfg(test)]
fn names(text: &str, name: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(name)
        .any(|(at, _)| !text[..at].ends_with(ident) && !text[at + name.len()..].starts_with(ident))
}

/// The lib.lua helpers that the code of `body` (not its comments) names, in
/// lib order: what its `-- uses:` lines must list.
#[cfg(test)]
pub(super) fn helpers_named(body: &str) -> Vec<&'static str> {
    let code: Vec<&str> = body
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect();
    include_str!("../../../lua/lib.lua")
        .lines()
        .filter_map(defines)
        .filter(|name| code.iter().any(|l| names(l, name)))
        .collect()
}

/// Every operation the store runs, and their library.
#[derive(Debug)]
pub struct Scripts {
    /// `lua/acquire.lua`.
    pub acquire: Script,
    /// `lua/renew.lua`.
    pub renew: Script,
    /// `lua/release.lua`.
    pub release: Script,
    /// `lua/get.lua`.
    pub get: Script,
    /// `lua/revoke.lua`.
    pub revoke: Script,
    /// `lua/commit.lua`.
    pub commit: Script,
    /// `lua/read.lua`.
    pub read: Script,
    /// The library they are loaded in.
    pub library: Library,
}

impl Scripts {
    /// All operations.
    pub fn all(&self) -> [&Script; 7] {
        [
            &self.acquire,
            &self.renew,
            &self.release,
            &self.get,
            &self.revoke,
            &self.commit,
            &self.read,
        ]
    }
}

/// The library, built once.
pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| {
    let (library, scripts) = library();
    let [acquire, renew, release, get, revoke, commit, read]: [Script; 7] =
        scripts.try_into().expect("seven operations");
    Scripts {
        acquire,
        renew,
        release,
        get,
        revoke,
        commit,
        read,
        library,
    }
});

/// Why a server that answered `INFO server` with `info` cannot run the
/// scripts, if it cannot ([`lacks_field_expiry_in`]).
pub(super) fn lacks_field_expiry(info: &str) -> Option<String> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    lacks_field_expiry_in(field("valkey_version"), field("redis_version"))
}

/// Why a server of these versions (`INFO server`'s `valkey_version` and
/// `redis_version`) cannot run the scripts, if it cannot: they keep each
/// lease and request cache entry as a hash field with its own expiry
/// (`HSETEX`, `HPEXPIRETIME`, `HPEXPIRE`), which Valkey has since 9.0 (and
/// Redis since 8.0). A server that hides its version is given the benefit of
/// the doubt (its first script would fail before it wrote).
pub fn lacks_field_expiry_in(valkey: Option<&str>, redis: Option<&str>) -> Option<String> {
    let (server, version, needed) = match (valkey, redis) {
        (Some(v), _) => ("Valkey", v, 9),
        (None, Some(v)) => ("Redis", v, 8),
        (None, None) => return None,
    };
    let major: u32 = version.split('.').next()?.parse().ok()?;
    (major < needed).then(|| {
        format!(
            "runs {server} {version}: targetlease needs hash-field expiry, \
             Valkey 9.0 or newer"
        )
    })
}

#[cfg(test)]
mod version_tests {
    use super::lacks_field_expiry;

    #[test]
    fn servers_without_hash_field_expiry_are_named() {
        let valkey = |v: &str| format!("# Server\r\nredis_version:7.2.4\r\nvalkey_version:{v}\r\n");
        assert_eq!(lacks_field_expiry(&valkey("9.0.0")), None);
        assert_eq!(lacks_field_expiry(&valkey("9.1.2")), None);
        let old = lacks_field_expiry(&valkey("8.1.1")).unwrap();
        assert!(
            old.contains("Valkey 8.1.1") && old.contains("9.0 or newer"),
            "{old}"
        );
        let redis = lacks_field_expiry("redis_version:7.0.15\r\n").unwrap();
        assert!(redis.contains("Redis 7.0.15"), "{redis}");
        assert_eq!(lacks_field_expiry("redis_version:8.2.0\r\n"), None);
        assert_eq!(lacks_field_expiry("# Server\r\n"), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MAX_METADATA_DEPTH;

    #[test]
    fn the_scripts_check_metadata_depth_with_the_clients_limit() {
        let lib = include_str!("../../../lua/lib.lua");
        let depth: usize = lib
            .lines()
            .find_map(|l| l.strip_prefix("local META_DEPTH = "))
            .and_then(|n| n.trim().parse().ok())
            .expect("lib.lua declares META_DEPTH");
        assert_eq!(depth, MAX_METADATA_DEPTH);
    }

    #[test]
    fn the_scripts_bound_lease_records_by_the_clients_limits() {
        let lib = include_str!("../../../lua/lib.lua");
        let bound = lib
            .lines()
            .find_map(|l| l.strip_prefix("local RECORD_BYTES = "))
            .expect("lib.lua declares RECORD_BYTES");
        assert_eq!(
            bound.trim(),
            format!(
                "{} + {} + 200",
                crate::store::MAX_NAME_BYTES,
                crate::store::MAX_METADATA_BYTES
            )
        );
        // What acquire accepts from a caller: the same limits.
        let limit = |name: &str| -> usize {
            lib.lines()
                .find_map(|l| l.strip_prefix(&format!("local {name} = ")))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("lib.lua declares {name}"))
        };
        assert_eq!(limit("NAME_BYTES"), crate::store::MAX_NAME_BYTES);
        assert_eq!(limit("META_BYTES"), crate::store::MAX_METADATA_BYTES);
    }

    #[test]
    fn the_library_defines_each_helper_once_and_registers_every_operation() {
        let s = &*SCRIPTS;
        let lib = &s.library;
        assert!(
            lib.source
                .starts_with(&format!("#!lua name={}\n", lib.name))
        );
        assert_eq!(lib.name, format!("targetlease_{}", &lib.sha[..16]));
        for name in include_str!("../../../lua/lib.lua")
            .lines()
            .filter_map(defines)
        {
            let defined = lib
                .source
                .lines()
                .filter(|l| defines(l) == Some(name))
                .count();
            assert_eq!(defined, 1, "{name} is defined once");
        }
        for script in s.all() {
            assert_eq!(script.function, format!("{}_{}", lib.name, script.name));
            assert_eq!(
                lib.source
                    .matches(&format!("function_name = '{}'", script.function))
                    .count(),
                1,
                "{} is registered once",
                script.name
            );
            // Every lib helper its code names is defined before it.
            let at = lib
                .source
                .find(&format!("local function op_{}(", script.name))
                .unwrap();
            for name in helpers_named(script.body) {
                let def = lib.source.lines().position(|l| defines(l) == Some(name));
                let op = lib.source[..at].lines().count();
                assert!(
                    def.is_some_and(|d| d < op),
                    "{} uses {name} before it",
                    script.name
                );
            }
        }
    }

    #[test]
    fn the_librarys_name_changes_with_its_code() {
        let code = library_code("targetlease_@_");
        assert_ne!(
            sha1_smol::Sha1::from(code.as_bytes()).digest().to_string(),
            sha1_smol::Sha1::from(code.replace("allow-oom", "no-writes").as_bytes())
                .digest()
                .to_string()
        );
        assert_eq!(
            SCRIPTS.library.sha,
            sha1_smol::Sha1::from(code.as_bytes()).digest().to_string()
        );
    }

    #[test]
    fn flags_match_what_each_operation_does() {
        let s = &*SCRIPTS;
        let registered = |script: &Script| {
            s.library
                .source
                .lines()
                .find(|l| l.contains(&format!("function_name = '{}'", script.function)))
                .unwrap()
                .to_owned()
        };
        for read in [&s.get, &s.read] {
            assert!(read.read_only && registered(read).contains("flags = { 'no-writes' }"));
        }
        for free in [&s.release, &s.revoke] {
            assert!(!free.read_only);
            assert!(
                registered(free).contains("flags = { 'allow-oom' }"),
                "{}",
                free.name
            );
        }
        for write in [&s.acquire, &s.renew, &s.commit] {
            assert!(
                !write.read_only && !registered(write).contains("flags"),
                "{}",
                write.name
            );
        }
    }
}
