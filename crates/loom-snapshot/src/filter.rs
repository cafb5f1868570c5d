//! Which files a snapshot holds: `.gitignore` (the walk's), the
//! configured include/exclude globs, a size limit, never `.git/` nor
//! Loom's own files, and never a file that holds a secret — Loom keeps no
//! copy of what redaction would hide (docs/rewind.md).

use std::collections::HashSet;

use globset::{Glob, GlobSet, GlobSetBuilder};
use loom_core::{Redactor, SkipReason};
use serde::{Deserialize, Serialize};

/// A filter's settings, as written in `[snapshots]` (and kept with the
/// snapshots, so a rewind judges the workspace as its runs' scans did).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterSpec {
    /// Only files matching one of these (all when empty).
    pub include: Vec<String>,
    /// Never files matching one of these.
    pub exclude: Vec<String>,
    /// Files larger than this are left out.
    pub max_file_bytes: u64,
}

/// Which files a snapshot holds.
#[derive(Clone)]
pub struct Filter {
    spec: FilterSpec,
    /// When set, only files matching one of these.
    include: Option<GlobSet>,
    /// Never files matching one of these.
    exclude: GlobSet,
    /// Files larger than this are left out, and reported.
    max_file_bytes: u64,
    /// Never these paths (Loom's own files, when they are in the workspace).
    never: HashSet<String>,
    /// Finds secrets in a file's text (`None`: files are kept whatever
    /// they hold).
    secrets: Option<Redactor>,
}

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filter")
            .field("spec", &self.spec)
            .field("never", &self.never)
            .field("secrets", &self.secrets.is_some())
            .finish()
    }
}

impl Filter {
    /// Files matching `include` (all when empty), not `exclude`, at most
    /// `max_file_bytes` each. Globs match the `/`-separated path in the
    /// workspace (`src/**`, `*.log`).
    pub fn new(include: &[String], exclude: &[String], max_file_bytes: u64) -> Result<Self, globset::Error> {
        let set = |globs: &[String]| -> Result<GlobSet, globset::Error> {
            let mut builder = GlobSetBuilder::new();
            for glob in globs {
                builder.add(Glob::new(glob)?);
            }
            builder.build()
        };
        Ok(Self {
            spec: FilterSpec {
                include: include.to_vec(),
                exclude: exclude.to_vec(),
                max_file_bytes,
            },
            include: if include.is_empty() { None } else { Some(set(include)?) },
            exclude: set(exclude)?,
            max_file_bytes,
            never: HashSet::new(),
            secrets: Some(Redactor::from_env()),
        })
    }

    /// The filter `spec` describes.
    pub fn from_spec(spec: &FilterSpec) -> Result<Self, globset::Error> {
        Self::new(&spec.include, &spec.exclude, spec.max_file_bytes)
    }

    /// Its settings.
    pub fn spec(&self) -> &FilterSpec {
        &self.spec
    }

    /// Keeps files whatever they hold (tests, and a library user's choice):
    /// by default a file in which redaction finds a secret is left out.
    pub fn keeping_secrets(mut self) -> Self {
        self.secrets = None;
        self
    }

    /// Leaves out these paths too, whatever the globs say: a run database
    /// (and the snapshots' own) kept in the workspace, which a restore
    /// must never write.
    pub fn never(mut self, paths: impl IntoIterator<Item = String>) -> Self {
        self.never.extend(paths);
        self
    }

    /// `self` with `other`'s paths that are never held, and its secrets
    /// check.
    pub(crate) fn with_never_of(mut self, other: &Filter) -> Self {
        self.never.extend(other.never.iter().cloned());
        self.secrets.clone_from(&other.secrets);
        self
    }

    pub(crate) fn admits(&self, path: &str) -> bool {
        !self.never_holds(path)
            && !self.exclude.is_match(path)
            && self.include.as_ref().is_none_or(|include| include.is_match(path))
    }
}

impl Filter {
    /// Whether `path` is never in a snapshot, whatever the globs say:
    /// `.git/`, the workspace's `.loom/` and `loom.toml`
    /// ([`crate::validate`]), and Loom's own files kept in the workspace.
    /// A restore refuses a record that names one.
    pub(crate) fn never_holds(&self, path: &str) -> bool {
        self.never.contains(path) || crate::reserved::is_reserved(path)
    }

    /// Why a file of `bytes` bytes is left out before it is read.
    pub(crate) fn too_large(&self, bytes: u64) -> Option<SkipReason> {
        (bytes > self.max_file_bytes).then_some(SkipReason::Size)
    }

    /// Why a file with `content` is left out once read: a secret in it.
    pub(crate) fn holds_secret(&self, content: &[u8]) -> Option<SkipReason> {
        let redactor = self.secrets.as_ref()?;
        let text = String::from_utf8_lossy(content);
        matches!(redactor.redact(&text), std::borrow::Cow::Owned(_)).then_some(SkipReason::Secret)
    }
}

impl Default for Filter {
    /// Every file `.gitignore` does not leave out, up to 2 MiB each, and
    /// none that holds a secret.
    fn default() -> Self {
        Self {
            spec: FilterSpec {
                max_file_bytes: 2 * 1024 * 1024,
                ..FilterSpec::default()
            },
            include: None,
            exclude: GlobSet::empty(),
            max_file_bytes: 2 * 1024 * 1024,
            never: HashSet::new(),
            secrets: Some(Redactor::from_env()),
        }
    }
}
