//! A disk that fills up, without a disk: an audit store and a
//! checkpointer that refuse every write ("no space left on device") while
//! their shared [`Disk`] is full, around the in-memory batteries (reads
//! always work); a spool path nothing can write; and tools that count how
//! often they really ran, per run, one of them held at a gate.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use agentvisor::ports::audit::{AuditRecord, AuditStats, AuditStore, AuditStoreError};
use agentvisor::ports::checkpoint::{
    Checkpoint, CheckpointError, Checkpointer, Claim, HostClaim, Lease, Renewal,
};
use agentvisor::ports::model::ToolSpec;
use agentvisor::ports::tool::{Tool, ToolContext, ToolError};
use agentvisor::stores::{MemoryAuditStore, MemoryCheckpointer};
use agentvisor::RunId;
use async_trait::async_trait;
use serde_json::{json, Value};
use tokio::sync::watch;

use super::scratch::Scratch;

/// The switch both stores share: while it is on, their writes fail.
#[derive(Default)]
pub(crate) struct Disk {
    full: AtomicBool,
    refused: AtomicUsize,
}

impl Disk {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Disk::default())
    }

    pub(crate) fn fill(&self) {
        self.full.store(true, Ordering::SeqCst);
    }

    pub(crate) fn free(&self) {
        self.full.store(false, Ordering::SeqCst);
    }

    /// Writes refused so far.
    pub(crate) fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }

    fn write(&self) -> Result<(), String> {
        if self.full.load(Ordering::SeqCst) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err("injected: no space left on device".into());
        }
        Ok(())
    }
}

/// The in-memory audit store on a [`Disk`].
pub(crate) struct FullAudit {
    pub(crate) inner: Arc<MemoryAuditStore>,
    disk: Arc<Disk>,
}

impl FullAudit {
    pub(crate) fn new(disk: &Arc<Disk>) -> Arc<Self> {
        Arc::new(FullAudit {
            inner: Arc::new(MemoryAuditStore::new()),
            disk: disk.clone(),
        })
    }
}

#[async_trait]
impl AuditStore for FullAudit {
    async fn append(&self, batch: &[AuditRecord]) -> Result<(), AuditStoreError> {
        self.disk.write().map_err(AuditStoreError::Unavailable)?;
        self.inner.append(batch).await
    }

    async fn run_records(&self, run_id: RunId) -> Result<Vec<AuditRecord>, AuditStoreError> {
        self.inner.run_records(run_id).await
    }

    async fn stats(&self) -> Result<AuditStats, AuditStoreError> {
        self.inner.stats().await
    }

    async fn unfinished_runs(&self) -> Result<Vec<RunId>, AuditStoreError> {
        self.inner.unfinished_runs().await
    }
}

/// The in-memory checkpointer on a [`Disk`]: saves and clears fail while
/// it is full (leases, kept in the same place, go on working).
pub(crate) struct FullCheckpointer {
    pub(crate) inner: MemoryCheckpointer,
    disk: Arc<Disk>,
}

impl FullCheckpointer {
    pub(crate) fn new(disk: &Arc<Disk>) -> Arc<Self> {
        Arc::new(FullCheckpointer {
            inner: MemoryCheckpointer::new(),
            disk: disk.clone(),
        })
    }
}

#[async_trait]
impl Checkpointer for FullCheckpointer {
    async fn save(
        &self,
        checkpoints: &[Checkpoint],
        lease: &Lease,
    ) -> Result<Vec<RunId>, CheckpointError> {
        self.disk.write().map_err(CheckpointError::Unavailable)?;
        self.inner.save(checkpoints, lease).await
    }
    async fn clear(&self, runs: &[RunId]) -> Result<(), CheckpointError> {
        self.disk.write().map_err(CheckpointError::Unavailable)?;
        self.inner.clear(runs).await
    }
    async fn load_all(&self) -> Result<Vec<Checkpoint>, CheckpointError> {
        self.inner.load_all().await
    }
    async fn claim(&self, run_id: RunId, lease: &Lease) -> Result<Claim, CheckpointError> {
        self.inner.claim(run_id, lease).await
    }
    async fn renew(&self, lease: &Lease) -> Result<Renewal, CheckpointError> {
        self.inner.renew(lease).await
    }
    async fn held_by(&self, owner: &str) -> Result<Vec<RunId>, CheckpointError> {
        self.inner.held_by(owner).await
    }
    async fn take_over_host(&self, owner: &str, gone: bool) -> Result<HostClaim, CheckpointError> {
        self.inner.take_over_host(owner, gone).await
    }
    async fn release(&self, owner: &str) -> Result<(), CheckpointError> {
        self.inner.release(owner).await
    }
}

/// A spool path nothing can write (its directory is a regular file).
pub(crate) fn unwritable_spool(dir: &Scratch) -> PathBuf {
    std::fs::write(dir.path("not-a-dir"), b"x").unwrap();
    dir.path("not-a-dir/audit.spool")
}

/// How often each tool really ran, per run.
#[derive(Default)]
pub(crate) struct Tally {
    runs: Mutex<HashMap<(String, RunId), usize>>,
}

impl Tally {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Tally::default())
    }

    /// How often `tool` ran for `run`.
    pub(crate) fn of(&self, tool: &str, run: RunId) -> usize {
        let runs = self.runs.lock().unwrap();
        runs.get(&(tool.to_string(), run)).copied().unwrap_or(0)
    }

    /// How often `tool` ran, over all runs.
    pub(crate) fn total(&self, tool: &str) -> usize {
        let runs = self.runs.lock().unwrap();
        runs.iter()
            .filter(|((t, _), _)| t == tool)
            .map(|(_, n)| n)
            .sum()
    }

    fn count(&self, tool: &str, run: RunId) {
        *self
            .runs
            .lock()
            .unwrap()
            .entry((tool.to_string(), run))
            .or_default() += 1;
    }
}

/// A tool `{}` that counts each call in a [`Tally`] as it starts, then
/// (if it has a gate) waits until the gate opens.
pub(crate) struct Counted {
    spec: ToolSpec,
    tally: Arc<Tally>,
    gate: Option<watch::Receiver<bool>>,
}

impl Counted {
    pub(crate) fn new(name: &str, tally: &Arc<Tally>) -> Arc<Self> {
        Arc::new(Counted {
            spec: ToolSpec {
                name: name.into(),
                description: "Counts its calls.".into(),
                parameters: json!({"type": "object"}),
            },
            tally: tally.clone(),
            gate: None,
        })
    }

    /// A counted tool whose calls wait until `gate` holds `true`.
    pub(crate) fn gated(name: &str, tally: &Arc<Tally>, gate: watch::Receiver<bool>) -> Arc<Self> {
        let mut t = Arc::into_inner(Self::new(name, tally)).unwrap();
        t.gate = Some(gate);
        Arc::new(t)
    }
}

#[async_trait]
impl Tool for Counted {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn call(&self, _args: Value, ctx: ToolContext) -> Result<String, ToolError> {
        self.tally.count(&self.spec.name, ctx.run_id);
        if let Some(gate) = &self.gate {
            let mut gate = gate.clone();
            let _ = gate.wait_for(|open| *open).await;
        }
        Ok(format!("{} ran", self.spec.name))
    }
}
