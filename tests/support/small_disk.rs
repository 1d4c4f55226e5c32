//! A small real filesystem (tmpfs) to fill up, for the tests that want a
//! real full disk. Mounting needs root, so those tests are `#[ignore]`d
//! (`cargo test` reports them ignored, never passed) and run by
//! `cargo test -- --ignored` as root (CI does); asked to run where it
//! cannot mount, a test fails saying why. The fault-injecting batteries of
//! `outage` test the same logic everywhere.

use std::path::{Path, PathBuf};

/// A tmpfs mounted under a test's directory, unmounted on drop.
pub(crate) struct SmallDisk(pub(crate) PathBuf);

impl SmallDisk {
    /// A tmpfs of `size` (`2m`) at `dir/small`; panics, naming `test` and
    /// why, where it cannot be mounted.
    pub(crate) fn mount(test: &str, dir: &Path, size: &str) -> SmallDisk {
        let at = dir.join("small");
        if let Err(e) = std::fs::create_dir_all(&at) {
            panic!("{test}: cannot create {}: {e}", at.display());
        }
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .output();
        let why = match out {
            Ok(o) if o.status.success() => return SmallDisk(at),
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => format!("no `mount` here: {e}"),
        };
        panic!("{test}: cannot mount a {size} tmpfs (needs root): {why}");
    }

    /// The path of `file` on it.
    pub(crate) fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }

    /// Fills what is left of it; returns the filler (remove it to free).
    pub(crate) fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let block = vec![0u8; 64 << 10];
        while f.write_all(&block).is_ok() {}
        // The last bytes, to the very end.
        while f.write_all(&[0u8; 512]).is_ok() {}
        while f.write_all(&[0u8; 1]).is_ok() {}
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}
