//! A directory of one test's own, removed when the test drops it.

use std::path::PathBuf;

use agentvisor::RunId;

/// A fresh directory under the system's temporary directory, removed on
/// drop.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Scratch {
    /// A new, empty directory named for `name`, unique to this process and
    /// this call (tests of one binary run at once).
    pub(crate) fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "agentvisor-test-{name}-{}-{}",
            std::process::id(),
            RunId::new()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// The path of `file` in the directory.
    pub(crate) fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }

    /// The same path as a command-line argument.
    pub(crate) fn arg(&self, file: &str) -> String {
        self.path(file).display().to_string()
    }

    /// Writes `text` to `file` in the directory and returns its path.
    pub(crate) fn file(&self, file: &str, text: &str) -> PathBuf {
        let p = self.path(file);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
