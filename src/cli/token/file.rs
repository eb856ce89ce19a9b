//! `token --file`: the token file, replaced in one rename so a reader never
//! sees half a token, and safe in a volume other containers share.
//!
//! The new content goes to a file created exclusively (`O_CREAT|O_EXCL`,
//! which never follows a symlink, plus `O_NOFOLLOW`) under a random name in
//! the same directory, with the asked-for mode set explicitly (not left to
//! the umask); that file is then renamed over the token file. A symlink
//! planted at a temporary name cannot redirect the write (the name is
//! taken, another is tried), and a symlink at the token file's own name is
//! replaced, never written through.

use std::fs::{OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rand::Rng;

/// How many taken temporary names are skipped before giving up.
const ATTEMPTS: usize = 16;

/// Replaces `path` with `text`, with permissions `mode`.
pub fn replace(path: &Path, text: &str, mode: u32) -> std::io::Result<()> {
    let names = std::iter::repeat_with(|| format!("{:016x}", rand::rng().random::<u64>()));
    replace_with(path, text, mode, names)
}

/// [`replace`], trying the temporary names `suffixes` yields in turn.
fn replace_with(
    path: &Path,
    text: &str,
    mode: u32,
    suffixes: impl IntoIterator<Item = String>,
) -> std::io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "names no file"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    for suffix in suffixes.into_iter().take(ATTEMPTS) {
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".{suffix}.tmp"));
        let temp = dir.join(temp_name);
        let mut file = match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&temp)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        };
        let written = file
            .set_permissions(Permissions::from_mode(mode))
            .and_then(|()| file.write_all(text.as_bytes()))
            .and_then(|()| file.sync_all())
            .and_then(|()| std::fs::rename(&temp, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        return written;
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        "every temporary name tried was taken",
    ))
}

/// Parses `--file-mode`: octal permission bits, e.g. `0644` or `640`.
pub fn parse_mode(text: &str) -> Result<u32, String> {
    match u32::from_str_radix(text.trim_start_matches("0o"), 8) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        _ => Err("must be octal permission bits from 0 to 0777, e.g. 0644".into()),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_symlink_at_a_temporary_name_cannot_redirect_the_write() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let token = dir.path().join("token");
        // Someone sharing the volume plants symlinks at the next names tried.
        for suffix in ["a", "b"] {
            symlink(&victim, dir.path().join(format!(".token.{suffix}.tmp"))).unwrap();
        }
        let names = ["a", "b", "c"].map(String::from);
        replace_with(&token, "42", 0o644, names).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(std::fs::read_to_string(&token).unwrap(), "42");
        assert!(!std::fs::symlink_metadata(&token).unwrap().is_symlink());
        assert_eq!(mode_of(&token), 0o644);
        // The planted links are left alone; no temporary file is left behind.
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, [".token.a.tmp", ".token.b.tmp", "token", "victim"]);
        // Only taken names: refused, nothing written anywhere.
        let taken = ["a", "b"].map(String::from);
        assert!(replace_with(&token, "43", 0o644, taken).is_err());
        assert_eq!(std::fs::read_to_string(&token).unwrap(), "42");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    }

    #[test]
    fn a_symlink_at_the_token_file_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let token = dir.path().join("token");
        symlink(&victim, &token).unwrap();
        replace(&token, "7", 0o600).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(std::fs::read_to_string(&token).unwrap(), "7");
        assert_eq!(mode_of(&token), 0o600);
    }

    #[test]
    fn the_mode_is_exact_whatever_the_umask_and_octal_to_parse() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        replace(&token, "1", 0o664).unwrap();
        assert_eq!(mode_of(&token), 0o664);
        assert_eq!(parse_mode("0644"), Ok(0o644));
        assert_eq!(parse_mode("640"), Ok(0o640));
        assert!(parse_mode("0999").is_err());
        assert!(parse_mode("1777").is_err());
    }
}
