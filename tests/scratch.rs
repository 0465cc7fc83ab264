//! Scratch directories for tests: each a fresh directory of its own under
//! the system's temp dir (a random name, readable by its owner only, so no
//! two tests, runs or users share one), removed when the test is done with
//! it. A test that fails keeps its directory, and says where, so the logs
//! and files it wrote can be read.
//! (Shared by both test binaries: what one of them does not use is fine.)
#![allow(dead_code)]

use std::fs::Permissions;
use std::ops::Deref;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A scratch directory; derefs to its path.
pub struct Scratch(Option<tempfile::TempDir>);

impl Scratch {
    /// A new directory named `lanekeeper-<tag>-<random>`.
    pub fn new(tag: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix(&format!("lanekeeper-{tag}-"))
            .permissions(Permissions::from_mode(0o700))
            .tempdir()
            .unwrap_or_else(|e| panic!("a scratch directory for {tag}: {e}"));
        Self(Some(dir))
    }
}

impl Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        self.0.as_ref().expect("held until dropped").path()
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        self
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(dir) = self.0.take()
        {
            eprintln!("scratch directory kept: {}", dir.keep().display());
        }
    }
}

/// One file written in a scratch directory of its own (removed with it:
/// hold this while anything reads the file); derefs to the file's path.
pub struct ScratchFile {
    path: PathBuf,
    _dir: Scratch,
}

impl ScratchFile {
    /// `bytes` written as `name` in a new directory for `tag`.
    pub fn new(tag: &str, name: &str, bytes: impl AsRef<[u8]>) -> Self {
        let dir = Scratch::new(tag);
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Self { path, _dir: dir }
    }
}

impl Deref for ScratchFile {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for ScratchFile {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}
