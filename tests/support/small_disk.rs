//! A small real filesystem (tmpfs) to fill up, for the tests that want a
//! real full disk. Mounting needs root: where it cannot be done, the test
//! prints a SKIP line saying why and returns (the fault-injecting
//! batteries of `outage` test the same logic everywhere).

use std::path::{Path, PathBuf};

/// A tmpfs mounted under a test's directory, unmounted on drop.
pub(crate) struct SmallDisk(pub(crate) PathBuf);

impl SmallDisk {
    /// A tmpfs of `size` (`2m`) at `dir/small`; `None` (and a SKIP line
    /// naming `test`) where it cannot be mounted.
    pub(crate) fn mount(test: &str, dir: &Path, size: &str) -> Option<SmallDisk> {
        let at = dir.join("small");
        std::fs::create_dir_all(&at).ok()?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .output();
        let why = match out {
            Ok(o) if o.status.success() => return Some(SmallDisk(at)),
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => format!("no `mount` here: {e}"),
        };
        println!("SKIP {test}: cannot mount a {size} tmpfs (needs root): {why}");
        eprintln!("SKIP {test}: cannot mount a {size} tmpfs (needs root): {why}");
        None
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
