//! One error type for settings that cannot be used — a flag, a file, a field
//! of a TargetLease spec — so every caller reports them the same way: the
//! CLI as a usage error (exit 2), the operator at startup, the reconciler as
//! `SpecValid=False`.

use std::fmt;

/// An I/O error in words, without the `(os error N)` suffix:
/// `No such file or directory`, `Permission denied` (what a file setting
/// that cannot be read says about it).
pub fn io_reason(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_owned(),
        _ => text,
    }
}

/// A setting that cannot be used, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    setting: Option<String>,
    problem: String,
}

impl ConfigError {
    /// A problem not tied to one named setting (or whose text names it).
    pub fn new(problem: impl Into<String>) -> Self {
        Self {
            setting: None,
            problem: problem.into(),
        }
    }

    /// A problem with the named setting, e.g. `spec.leaseDuration`.
    pub fn of(setting: impl Into<String>, problem: impl fmt::Display) -> Self {
        Self {
            setting: Some(setting.into()),
            problem: problem.to_string(),
        }
    }

    /// The same problem, attributed to `setting`.
    pub fn in_setting(self, setting: impl Into<String>) -> Self {
        Self {
            setting: Some(setting.into()),
            problem: self.problem,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.setting {
            Some(s) => write!(f, "{s}: {}", self.problem),
            None => f.write_str(&self.problem),
        }
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_setting_when_there_is_one() {
        let e = ConfigError::new("must be positive");
        assert_eq!(e.to_string(), "must be positive");
        let e = e.in_setting("--timeout");
        assert_eq!(e.to_string(), "--timeout: must be positive");
        assert_eq!(
            ConfigError::of("spec.leaseDuration", "too long").to_string(),
            "spec.leaseDuration: too long"
        );
    }
}
