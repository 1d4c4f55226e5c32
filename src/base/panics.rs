//! Quiet caught panics: the kernel catches a panic in a run's handler, its
//! model call or its tool call and turns it into a result (`error`/`panic`,
//! or a tool error the model sees), logging one `warn` line that names the
//! run. The process's panic hook would still print the panic's message (and
//! a backtrace with `RUST_BACKTRACE=1`) for each of them; a program that
//! wants one line per caught panic installs [`install_quiet_hook`], which
//! stays silent for panics raised under a catch of the kernel's and defers
//! to the previous hook for every other panic.
//!
//! The kernel marks its catches with [`catch`] (a closure) and [`quietly`]
//! (a future: the mark is set during each poll, on whatever thread polls
//! it, so it never leaks across an `.await` to another task). The mark is a
//! thread-local counter: nesting is fine, and a panic anywhere else on the
//! thread while no catch is active is reported as usual.
//!
//! The library never installs the hook itself: the process's hook belongs
//! to the program (the CLI installs it).

use std::cell::Cell;
use std::future::Future;
use std::panic::{catch_unwind, UnwindSafe};

thread_local! {
    /// Catches of the kernel's active on this thread.
    static CATCHING: Cell<u32> = const { Cell::new(0) };
}

/// Marks a catch as active while alive (also while unwinding).
struct Mark;

impl Mark {
    fn new() -> Mark {
        CATCHING.with(|c| c.set(c.get().saturating_add(1)));
        Mark
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        CATCHING.with(|c| c.set(c.get().saturating_sub(1)));
    }
}

/// Whether a panic raised now on this thread will be caught by the kernel.
pub fn is_caught() -> bool {
    CATCHING.with(|c| c.get() > 0)
}

/// `std::panic::catch_unwind`, marked as a kernel catch: a panic in `f` is
/// not reported by [`install_quiet_hook`]'s hook.
pub fn catch<R>(f: impl FnOnce() -> R + UnwindSafe) -> std::thread::Result<R> {
    let _mark = Mark::new();
    catch_unwind(f)
}

/// Runs `fut` with every poll marked as under a kernel catch (wrap it in
/// `catch_unwind` to catch: this only marks it).
pub async fn quietly<F: Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        let _mark = Mark::new();
        fut.as_mut().poll(cx)
    })
    .await
}

/// Installs a panic hook that is silent for panics the kernel catches (they
/// are logged as one `warn` line naming the run) and calls the hook that was
/// installed before for any other panic.
pub fn install_quiet_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !is_caught() {
            previous(info);
        }
    }));
}

/// The text of a panic payload (`panic!` gives a `&str` or a `String`).
pub(crate) fn payload_text(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.as_str()
    } else {
        "non-string panic payload"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_is_set_only_inside_a_catch() {
        assert!(!is_caught());
        let inside = catch(is_caught);
        assert_eq!(inside.ok(), Some(true));
        assert!(!is_caught());
        let r = catch(|| -> u32 { panic!("on purpose") });
        assert!(r.is_err());
        assert!(!is_caught(), "unwinding cleared the mark");
    }

    #[tokio::test]
    async fn a_future_is_marked_while_polled_and_not_between_polls() {
        let seen = quietly(async {
            let first = is_caught();
            tokio::task::yield_now().await;
            (first, is_caught())
        })
        .await;
        assert_eq!(seen, (true, true));
        assert!(!is_caught());
    }
}
