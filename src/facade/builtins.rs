//! A registry with the built-in tools: the kernel's dispatch
//! ([`ToolRegistry`]) filled from the tool battery
//! ([`crate::tools::builtin`]). The facade puts the two together, so
//! neither knows the other.

use crate::kernel::dispatch::ToolRegistry;
use crate::tools::builtin::{builtins, test_tools};

impl ToolRegistry {
    /// A registry holding the [built-in tools](crate::tools::builtin).
    pub fn with_builtins() -> Self {
        let mut registry = Self::new();
        for tool in builtins() {
            // The built-ins are fixed and covered by a test; a failure here
            // is a bug, logged rather than panicking a host at startup.
            if let Err(e) = registry.register_builtin(tool) {
                tracing::error!(error = %e, "built-in tool failed to register");
            }
        }
        registry
    }

    /// This registry with the [test tools](crate::tools::builtin::test_tools)
    /// added (`fail` and `panic`, which fail on purpose), as built-ins: a
    /// host's own tool of the same name replaces them.
    pub fn with_test_tools(mut self) -> Self {
        for tool in test_tools() {
            if let Err(e) = self.register_builtin(tool) {
                tracing::error!(error = %e, "test tool failed to register");
            }
        }
        self
    }
}
