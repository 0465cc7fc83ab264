//! The tests' scratch directories (`tests/scratch.rs`): each its own,
//! owner-only, removed when dropped, kept when its test fails.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use crate::scratch::{Scratch, ScratchFile};

#[test]
fn a_scratch_directory_is_its_own_owner_only_and_removed_when_dropped() {
    let (a, b) = (Scratch::new("same-tag"), Scratch::new("same-tag"));
    assert_ne!(a.to_path_buf(), b.to_path_buf());
    let name = a.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("lanekeeper-same-tag-"), "{name}");
    let mode = std::fs::metadata(&*a).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "readable by its owner only: {mode:o}");
    std::fs::write(a.join("log"), "x").unwrap();
    let (pa, pb) = (a.to_path_buf(), b.to_path_buf());
    drop((a, b));
    assert!(!pa.exists() && !pb.exists());

    let f = ScratchFile::new("one-file", "lanes.json", "{}");
    assert_eq!(std::fs::read_to_string(&*f).unwrap(), "{}");
    let dir = f.parent().unwrap().to_path_buf();
    drop(f);
    assert!(!dir.exists(), "the file's directory goes with it");
}

#[test]
fn a_failing_test_keeps_its_scratch_directory() {
    let kept = std::thread::spawn(|| {
        let s = Scratch::new("failing");
        std::fs::write(s.join("gateway.log"), "why it failed").unwrap();
        std::panic::panic_any(s.to_path_buf());
    })
    .join()
    .unwrap_err()
    .downcast::<PathBuf>()
    .unwrap();
    let log = std::fs::read_to_string(kept.join("gateway.log"));
    std::fs::remove_dir_all(&*kept).unwrap();
    assert_eq!(log.unwrap(), "why it failed");
}
