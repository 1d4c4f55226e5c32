//! A run's shared record ([`RunShared`]): what a run, its critic shard, its
//! handles and references, and the host all see of it, and the protocol
//! that ends it exactly once. It lives below both the host and the actors:
//! it imports ports only, and reaches the run's shard through the
//! [`Mailbox`] trait the shard implements.
//!
//! # What it owns
//! - The partial result ([`Partial`]): the run writes steps, usage and
//!   decisions into it as it goes, so a run whose handler panicked or whose
//!   shard failed is still finalized with everything it did, and live state
//!   is read from it.
//! - The finisher: whoever takes it first builds the [`RunResult`] and the
//!   terminal record ([`RunShared::finish_after`]); every later attempt is a
//!   no-op. The result reaches callers through a [`Delivery`] once the
//!   terminal record is written.
//! - The event fan-out: every event the run records carries its audit
//!   record's `seq` and reaches every subscriber through a bounded channel
//!   of its own; a subscriber that falls behind is dropped from the fan-out
//!   with the `seq` to resume from and catches up from the audit store
//!   (see [`Subscription`]). Nothing on this path is unbounded.
//! - The host's registry of live runs ([`HostRuns`]): a run is in it from
//!   its admission to its terminal record, so it is reachable by id.
//!
//! # Ordering
//! A run assigns `seq` numbers in its own handlers, one at a time, so the
//! numbers are emitted in order; the terminal record takes the next number
//! whoever finalizes. Streamed text deltas are not records: they carry the
//! `seq` of the record before them and are not replayed from the store
//! (the `step.finish` that follows holds their text whole).
//!
//! # Why one file
//! The partial result, the finisher and the fan-out are one lock's state
//! and one exactly-once protocol (an event emitted, a decision recorded
//! and the run finalized race each other under that lock); splitting them
//! would spread the protocol across files. The parts that stand alone
//! already have files of their own: the registry of live runs
//! (`record/registry.rs`), subscriptions (`record/subscribe.rs`), and how
//! a run ends before it is a result (`record/ending.rs`).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;

use crate::ports::audit::{AuditEntry, AuditRecord};
use crate::ports::event::{Event, RunEvent};
use crate::ports::run::{
    unix_ms, CriticDecision, KillReason, RunId, RunResult, RunStatus, StepRecord, Usage,
};

mod allowance;
mod ending;
mod registry;
mod subscribe;

pub(crate) use allowance::{Allowance, Allowances};
pub(crate) use ending::{off_record, terminal_events, SUSPENDED};
pub use ending::{Ending, LEASE_LOST, STORE_UNAVAILABLE};

pub(crate) use registry::HostRuns;
pub use registry::{HostEvent, HostFeed, FEED_CAPACITY};
pub(crate) use subscribe::{stored_events, subscribe};

/// The partial result of a run, as it grows.
#[derive(Debug, Default)]
pub(crate) struct Partial {
    pub(crate) steps: Vec<StepRecord>,
    pub(crate) critic: Vec<CriticDecision>,
    pub(crate) usage: Usage,
    /// What the run's model judges spent (see `RunUsage::critic`); boxed:
    /// a run without a judge carries a pointer.
    pub(crate) critic_usage: Option<Box<crate::ports::run::CriticUsage>>,
    pub(crate) iterations: u32,
    pub(crate) max_iterations: u32,
    pub(crate) last_text: Option<String>,
    pub(crate) started: Option<(Instant, u64)>,
    pub(crate) finished: bool,
    /// How long the run took, once it has finished.
    pub(crate) took: Option<Duration>,
    /// How many steps moved into the result at the end (so the live state
    /// still counts them afterwards).
    pub(crate) steps_taken: usize,
    /// Cost so far in micro-dollars (of the whole usage, priced once;
    /// the judges' cost is in `usage.critic`).
    pub(crate) cost_micros: u64,
    /// Tool calls waiting for an operator's decision (the run is parked).
    pub(crate) awaiting: Vec<PendingApproval>,
}

/// A tool call waiting for an operator's approval (see the manifest's
/// `approval:`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PendingApproval {
    /// The model's call id.
    pub call_id: Arc<str>,
    /// The tool.
    pub tool: Arc<str>,
    /// Its arguments (secrets redacted, capped).
    pub arguments: String,
    /// Unix ms when it began to wait.
    pub since_ms: u64,
    /// Unix ms when it is denied if nobody decides.
    pub until_ms: u64,
}

/// What a run's handle, references and the host ask of the run, through its
/// shard (see [`Mailbox`]).
pub(crate) enum Command {
    /// Inject a message before the next model call.
    Steer(String),
    /// Push the hard deadline back (an operator decision).
    Extend(Duration),
    /// Kill (`Some(reason)`) or cancel (`None`).
    Stop(Option<KillReason>),
    /// The run is alive (work done on its behalf elsewhere).
    Beat,
    /// Answer once every record the run made so far is written (the shard
    /// forwards it to the audit actor after the run's current handler).
    Barrier(oneshot::Sender<crate::ports::audit::AuditStats>),
    /// An operator's decision on the tool calls waiting for approval:
    /// the one with this call id, or all of them (`None`).
    Decide {
        /// The call decided on (`None`: every waiting call).
        call_id: Option<Arc<str>>,
        /// Whether the calls run.
        approve: bool,
        /// Why (for a denial, what the model reads).
        reason: Option<String>,
    },
    /// A child run of this run has been finalized (its terminal record is
    /// with the audit actor). The id is for the logs of a debugging reader.
    ChildEnded(#[allow(dead_code)] RunId),
    /// Another host took this durable run over: stop it and write nothing
    /// more of it (see [`Ending::fenced`]).
    Fence,
    /// The parent run's hard deadline is now this: a sub-agent's cap
    /// follows it.
    ParentDeadline(tokio::time::Instant),
}

/// Where a run's commands go: its critic shard. The shard implements it;
/// one is shared by every run of the shard.
pub(crate) trait Mailbox: Send + Sync + 'static {
    /// Sends `cmd` to the run `key` of this shard (dropped if the shard is
    /// gone; a barrier then answers at once).
    fn command(&self, key: u64, cmd: Command);
}

/// Hands a run's result to its callers once its terminal record is
/// written: the handle that submitted it, and every [`RunShared::result`]
/// waiter.
pub(crate) struct Delivery {
    tx: Option<oneshot::Sender<Arc<RunResult>>>,
    shared: Option<Arc<RunShared>>,
    /// A durable run's result waits for its record to be written or
    /// spooled, at most this many ms from its finalization (the time left
    /// to its deadline; 0: no wait): past it, the caller is told
    /// [`off_record`]. Milliseconds, not an instant: every audit message
    /// carries a delivery, and this fits in its padding.
    pub(crate) wait_ms: u32,
}

impl Delivery {
    /// A delivery nobody waits for (a run ended without running).
    pub(crate) fn none() -> Self {
        Delivery {
            tx: None,
            shared: None,
            wait_ms: 0,
        }
    }

    /// Delivers the result (the `Result` mirrors a channel's send: the
    /// caller may have gone, which is no error of the run's).
    pub(crate) fn send(self, result: Arc<RunResult>) -> Result<(), Arc<RunResult>> {
        if let Some(shared) = &self.shared {
            let _ = shared.result.set(result.clone());
            // Only references wait here (the handle has its channel): most
            // runs have none, and waking nobody still takes a lock.
            if shared.waiting.load(Ordering::SeqCst) {
                shared.done.notify_waiters();
            }
        }
        match self.tx {
            Some(tx) => tx.send(result),
            None => Ok(()),
        }
    }
}

/// What a run's finalization asks of the audit actor: the run's unsent
/// records and its terminal record, written in that order, then the result
/// delivered. `None` for a suspended durable run (no terminal record).
pub(crate) struct Terminal {
    /// The run's records not sent yet, in order, ahead of the terminal one.
    pub(crate) preceding: Vec<AuditRecord>,
    /// The terminal record.
    pub(crate) record: AuditRecord,
    /// Where the result goes once the record is written.
    pub(crate) deliver: Delivery,
    /// The run is durable: clear its checkpoint once the record is written.
    pub(crate) durable: bool,
    /// The run (its parent is told once the package is handed over).
    pub(crate) run: Arc<RunShared>,
}

/// What finalizing a run produced (for the one caller that won).
pub(crate) enum Finished {
    /// Someone finalized the run already; these are the caller's records
    /// that could not ride with a terminal record.
    Already(Vec<AuditRecord>),
    /// A suspended durable run: its records, no terminal record (its
    /// result was delivered at once).
    Suspended(Vec<AuditRecord>, Arc<RunShared>),
    /// The terminal package for the audit actor.
    Terminal(Box<Terminal>),
}

/// Events a subscriber's channel holds before it counts as lagging.
pub const SUBSCRIBER_BUFFER: usize = 1024;

/// One subscriber in a run's fan-out.
struct Subscriber {
    tx: mpsc::Sender<Event>,
    /// Set when the subscriber fell behind: the `seq` to re-read from.
    lagged: Arc<OnceLock<u32>>,
}

/// Shared by a run, its critic shard, its handles and the host.
pub(crate) struct RunShared {
    pub(crate) run_id: RunId,
    pub(crate) agent: Arc<str>,
    pub(crate) caller_id: Option<Arc<str>>,
    pub(crate) parent_run_id: Option<RunId>,
    /// The root of the run's delegation tree (itself for a top-level run).
    pub(crate) root_run_id: RunId,
    /// The root recorded with the run ([`RunResult::root_run_id`]): its
    /// top run's id for a sub-agent, its pipeline's for a phase and the
    /// phase's sub-agents; `None` for a run that is its own root.
    pub(crate) tree_root: Option<RunId>,
    /// How deep in its tree (0 for a top-level run).
    pub(crate) depth: u32,
    /// Its child runs in flight.
    children: Mutex<Vec<RunId>>,
    /// Runs started in the tree this run is the root of (itself aside);
    /// counted on the root only.
    descendants: AtomicU32,
    /// The run's shard, and its key there.
    mailbox: Arc<dyn Mailbox>,
    pub(crate) key: u64,
    partial: Mutex<Partial>,
    finisher: Mutex<Option<oneshot::Sender<Arc<RunResult>>>>,
    /// The result, once delivered (its terminal record is written).
    result: OnceLock<Arc<RunResult>>,
    done: Notify,
    /// Someone awaits `done`.
    waiting: AtomicBool,
    /// Subscribers: counted apart so a run nobody watches takes no lock.
    subscribers: AtomicUsize,
    fanout: Mutex<Vec<Subscriber>>,
    seq: AtomicU32,
    /// Checkpointed: its checkpoint is cleared with its terminal record, and
    /// a host shutdown suspends it (no terminal record, checkpoint kept).
    durable: AtomicBool,
    /// `audit: summary`: step events are not recorded (see
    /// [`AuditDetail`](crate::ports::audit::AuditDetail)).
    summary: AtomicBool,
    host: Arc<HostRuns>,
    /// The token allowances the run spends against besides its caller's
    /// account (the host's, its ancestors', its own); its sub-agents
    /// spend against them too.
    pub(crate) allowances: Option<Allowances>,
    /// The recorded run and step a fork was made from (boxed: a run that
    /// is no fork carries a pointer).
    pub(crate) forked_from: Option<Box<crate::ports::run::ForkOrigin>>,
    /// What the run owes once it ends: its intents ride with its terminal
    /// record (see [`crate::ports::outbox`]).
    publish: crate::ports::outbox::PublishHook,
}

/// What a new run's record is made with.
pub(crate) struct RunIdentity {
    pub(crate) run_id: RunId,
    pub(crate) agent: Arc<str>,
    pub(crate) caller_id: Option<Arc<str>>,
    pub(crate) parent_run_id: Option<RunId>,
    pub(crate) root_run_id: Option<RunId>,
    pub(crate) tree_root: Option<RunId>,
    pub(crate) depth: u32,
    pub(crate) max_iterations: u32,
    pub(crate) allowances: Option<Allowances>,
    /// The run a fork was made from.
    pub(crate) forked_from: Option<crate::ports::run::ForkOrigin>,
    /// What the run owes once it ends.
    pub(crate) publish: crate::ports::outbox::PublishHook,
}

impl RunShared {
    /// A new run's record, registered with the host (reachable by id until
    /// it is finalized), and the receiver its handle awaits.
    pub(crate) fn new(
        id: RunIdentity,
        mailbox: Arc<dyn Mailbox>,
        key: u64,
        host: Arc<HostRuns>,
    ) -> (Arc<Self>, oneshot::Receiver<Arc<RunResult>>) {
        let (result_tx, result_rx) = oneshot::channel();
        let shared = Arc::new(RunShared {
            run_id: id.run_id,
            agent: id.agent,
            caller_id: id.caller_id,
            parent_run_id: id.parent_run_id,
            root_run_id: id.root_run_id.unwrap_or(id.run_id),
            tree_root: id.tree_root,
            depth: id.depth,
            children: Mutex::new(Vec::new()),
            descendants: AtomicU32::new(0),
            mailbox,
            key,
            partial: Mutex::new(Partial {
                max_iterations: id.max_iterations,
                ..Default::default()
            }),
            finisher: Mutex::new(Some(result_tx)),
            result: OnceLock::new(),
            done: Notify::new(),
            waiting: AtomicBool::new(false),
            subscribers: AtomicUsize::new(0),
            fanout: Mutex::new(Vec::new()),
            seq: AtomicU32::new(0),
            durable: AtomicBool::new(false),
            summary: AtomicBool::new(false),
            host,
            allowances: id.allowances,
            forked_from: id.forked_from.map(Box::new),
            publish: id.publish,
        });
        shared.host.enter(&shared);
        (shared, result_rx)
    }

    /// The partial record (never poisoned in practice: a panic while holding
    /// it is recovered by taking the data as is).
    pub(crate) fn partial(&self) -> MutexGuard<'_, Partial> {
        self.partial.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends the run a command through its shard.
    pub(crate) fn command(&self, cmd: Command) {
        self.mailbox.command(self.key, cmd);
    }

    /// Takes the next audit `seq` for a record of the run. Called in the
    /// run's own handlers (one at a time), so numbers are taken in order.
    pub(crate) fn next_seq(&self) -> u32 {
        self.seq.fetch_add(1, Ordering::SeqCst)
    }

    /// The `seq` of the latest record taken (0 before any).
    fn last_seq(&self) -> u32 {
        self.seq.load(Ordering::SeqCst).saturating_sub(1)
    }

    /// Continues the audit sequence of a resumed run after its last record.
    pub(crate) fn start_seq_at(&self, next: u32) {
        self.seq.store(next, Ordering::SeqCst);
    }

    /// Sends a recorded event (its record took `seq`) to every subscriber.
    /// With none, it costs one atomic load.
    pub(crate) fn emit(&self, seq: u32, event: &RunEvent) {
        if let RunEvent::CriticSteer(d)
        | RunEvent::CriticExtend(d)
        | RunEvent::CriticRaiseIterations(d)
        | RunEvent::CriticKill(d)
        | RunEvent::CriticDeny(d)
        | RunEvent::CriticAsk(d) = event
        {
            crate::telemetry::decided(d);
            if self.host.watched() {
                self.host.announce(HostEvent::CriticDecision {
                    run_id: self.run_id,
                    agent: self.agent.clone(),
                    caller_id: self.caller_id.clone(),
                    decision: d.clone(),
                });
            }
        }
        if self.subscribers.load(Ordering::SeqCst) == 0 && self.parent_run_id.is_none() {
            return;
        }
        self.publish(Event {
            run_id: self.run_id,
            parent_run_id: self.parent_run_id,
            seq,
            event: event.clone(),
        });
    }

    /// Whether a streamed text delta would reach anyone now: the run has a
    /// subscriber, or it is a sub-agent (its deltas go up to its ancestors').
    pub(crate) fn wants_deltas(&self) -> bool {
        self.parent_run_id.is_some() || self.subscribers.load(Ordering::SeqCst) > 0
    }

    /// Sends a streamed text delta (not a record: it carries the `seq` of
    /// the record before it).
    pub(crate) fn emit_delta(&self, event: RunEvent) {
        if !self.wants_deltas() {
            return;
        }
        self.publish(Event {
            run_id: self.run_id,
            parent_run_id: self.parent_run_id,
            seq: self.last_seq(),
            event,
        });
    }

    /// Sends one of the run's own events to its subscribers, then to its
    /// ancestors' (a sub-agent's events reach every run above it, at once
    /// and in the order it made them: its `run.end` comes after the rest).
    fn publish(&self, ev: Event) {
        if self.subscribers.load(Ordering::SeqCst) > 0 {
            let resume_from = ev.seq;
            self.fan_out(ev.clone(), resume_from);
        }
        self.relay_up(&ev);
    }

    /// Sends a descendant's event on to the parent's subscribers, and up.
    fn relay_up(&self, ev: &Event) {
        let Some(parent) = self.parent_run_id.and_then(|p| self.host.get(&p)) else {
            return;
        };
        if parent.subscribers.load(Ordering::SeqCst) > 0 {
            // A subscriber that falls behind on it re-reads the parent's
            // own records from the parent's next one (the descendant's are
            // in its own log).
            let resume_from = parent.seq.load(Ordering::SeqCst);
            parent.fan_out(ev.clone(), resume_from);
        }
        parent.relay_up(ev);
    }

    /// Sends `ev` to every subscriber; one that is full is dropped, to
    /// re-read the run's records from `resume_from`.
    fn fan_out(&self, ev: Event, resume_from: u32) {
        let mut subs = self.fanout.lock().unwrap_or_else(|p| p.into_inner());
        let before = subs.len();
        subs.retain(|s| match s.tx.try_send(ev.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                // Dropping the sender ends its channel after what it holds;
                // the subscriber then re-reads from here.
                let _ = s.lagged.set(resume_from);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
        let gone = before - subs.len();
        if gone > 0 {
            self.subscribers.fetch_sub(gone, Ordering::SeqCst);
        }
    }

    /// Adds a live subscriber: its channel, whether it lagged, and the
    /// first `seq` it will see live (earlier records come from the store).
    /// `None` once the run's stream has ended.
    fn attach(&self, buffer: usize) -> (mpsc::Receiver<Event>, Arc<OnceLock<u32>>, u32, bool) {
        let (tx, rx) = mpsc::channel(buffer.max(1));
        let lagged = Arc::new(OnceLock::new());
        let mut subs = self.fanout.lock().unwrap_or_else(|p| p.into_inner());
        let ended = self.result.get().is_some() || self.partial().finished;
        if !ended {
            self.subscribers.fetch_add(1, Ordering::SeqCst);
            subs.push(Subscriber {
                tx,
                lagged: lagged.clone(),
            });
        }
        let head = self.seq.load(Ordering::SeqCst);
        (rx, lagged, head, ended)
    }

    /// Ends every subscriber's live channel (after the terminal events).
    fn close_fanout(&self) {
        let mut subs = self.fanout.lock().unwrap_or_else(|p| p.into_inner());
        let n = subs.len();
        subs.clear();
        if n > 0 {
            self.subscribers.fetch_sub(n, Ordering::SeqCst);
        }
    }

    /// Registers a child run in flight (at the child's admission).
    pub(crate) fn add_child(&self, child: RunId) -> usize {
        let mut c = self.children.lock().unwrap_or_else(|p| p.into_inner());
        c.push(child);
        c.len()
    }

    /// Its child runs in flight.
    pub(crate) fn live_children(&self) -> Vec<RunId> {
        self.children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether a child run is in flight.
    pub(crate) fn has_children(&self) -> bool {
        !self
            .children
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    /// Counts one more run in the tree this run is the root of; the count.
    pub(crate) fn add_descendant(&self) -> u32 {
        self.descendants.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The host's registry (to reach relatives by id).
    pub(crate) fn host(&self) -> &Arc<HostRuns> {
        &self.host
    }

    /// Marks the run durable.
    pub(crate) fn set_durable(&self) {
        self.durable.store(true, Ordering::Relaxed);
    }

    /// Whether the run is durable.
    pub(crate) fn is_durable(&self) -> bool {
        self.durable.load(Ordering::Relaxed)
    }

    /// Records this run at `detail`.
    pub(crate) fn set_audit_detail(&self, detail: crate::ports::audit::AuditDetail) {
        let summary = detail == crate::ports::audit::AuditDetail::Summary;
        self.summary.store(summary, Ordering::Relaxed);
    }

    /// Whether the audit log keeps `event` of this run (all of them at
    /// `full`; see [`AuditDetail::keeps`](crate::ports::audit::AuditDetail::keeps)).
    pub(crate) fn records(&self, event: &RunEvent) -> bool {
        !self.summary.load(Ordering::Relaxed)
            || crate::ports::audit::AuditDetail::Summary.keeps(event)
    }

    /// The result, once delivered.
    pub(crate) fn delivered(&self) -> Option<Arc<RunResult>> {
        self.result.get().cloned()
    }

    /// Waits for the result (delivered once its terminal record is written).
    pub(crate) async fn result(&self) -> Arc<RunResult> {
        loop {
            let notified = self.done.notified();
            self.waiting.store(true, Ordering::SeqCst);
            if let Some(r) = self.result.get() {
                return r.clone();
            }
            notified.await;
        }
    }

    /// Whether the run waits for an operator's decision on a tool call.
    pub(crate) fn is_awaiting_approval(&self) -> bool {
        let p = self.partial();
        !p.finished && !p.awaiting.is_empty()
    }

    /// The run's live view.
    pub(crate) fn live(&self) -> LiveState {
        let p = self.partial();
        LiveState {
            iteration: p.iterations,
            max_iterations: p.max_iterations,
            elapsed_ms: p
                .took
                .or_else(|| p.started.map(|(i, _)| i.elapsed()))
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            tokens: p.usage.total(),
            tool_calls: (p.steps.len() + p.steps_taken) as u32,
            cost_micros: p
                .cost_micros
                .saturating_add(p.critic_usage.as_ref().map_or(0, |c| c.cost_micros)),
            last_decision: p.critic.last().cloned(),
            finished: p.finished,
            awaiting_approval: if p.finished {
                Vec::new()
            } else {
                p.awaiting.clone()
            },
        }
    }

    /// Finalizes the run if nobody did yet: builds the result from the
    /// partial record, sends the terminal events to subscribers and ends
    /// their live streams, and returns what the audit actor must write (the
    /// caller's `preceding` records first), which delivers the result once
    /// written. If another finisher won, the records come back alone.
    ///
    /// A durable run that the host's shutdown ends is suspended instead: its
    /// caller gets the `cancelled`/`shutdown` result at once, no terminal
    /// record is written and its checkpoint stays, so `Host::recover`
    /// resumes it.
    pub(crate) fn finish_after(
        self: &Arc<Self>,
        ending: Ending,
        preceding: Vec<AuditRecord>,
    ) -> Finished {
        let Some(result_tx) = self
            .finisher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return Finished::Already(preceding);
        };
        let result = {
            let mut p = self.partial();
            p.finished = true;
            p.took = p.started.map(|(i, _)| i.elapsed());
            p.steps_taken = p.steps.len();
            let now = unix_ms();
            let started_at = p.started.map(|(_, ms)| ms).unwrap_or(now);
            let output = match ending.status {
                RunStatus::Ok => ending.output,
                _ => ending.output.or_else(|| p.last_text.clone()),
            };
            Arc::new(RunResult {
                run_id: self.run_id,
                agent: self.agent.to_string(),
                caller_id: self.caller_id.as_deref().map(str::to_string),
                parent_run_id: self.parent_run_id,
                root_run_id: self.tree_root,
                status: ending.status,
                kill_reason: ending.kill_reason,
                loop_kind: ending.loop_kind,
                error_kind: ending.error_kind,
                error: ending.error,
                output,
                steps: std::mem::take(&mut p.steps),
                iterations: p.iterations,
                usage: crate::ports::run::RunUsage {
                    own: p.usage,
                    critic: p.critic_usage.as_deref().copied(),
                },
                // The judges' cost is charged to the caller with the run's.
                cost_micros: p
                    .cost_micros
                    .saturating_add(p.critic_usage.as_ref().map_or(0, |c| c.cost_micros)),
                critic: std::mem::take(&mut p.critic),
                started_at,
                finished_at: now.max(started_at),
                forked_from: self.forked_from.as_deref().copied(),
            })
        };
        self.host.ended(&result);
        let deliver = Delivery {
            tx: Some(result_tx),
            shared: Some(self.clone()),
            wait_ms: 0,
        };
        let durable = self.is_durable();
        let kind = result.error_kind.as_deref();
        if durable && matches!(kind, Some(SUSPENDED | LEASE_LOST)) {
            // Fenced: the run's records here would collide with those the
            // other host writes for it.
            let preceding = if kind == Some(LEASE_LOST) {
                Vec::new()
            } else {
                preceding
            };
            // No terminal record: the stream ends on the live terminal events.
            let seq = self.last_seq();
            for ev in terminal_events(&result) {
                self.emit(seq, &ev);
            }
            self.close_fanout();
            let _ = deliver.send(result);
            // It leaves the host's registry once its records are with the
            // audit actor (`send_finished`): a shutdown that waits for no
            // run in flight then finds them there before it drains it.
            return Finished::Suspended(preceding, self.clone());
        }
        let seq = self.next_seq();
        for ev in terminal_events(&result) {
            // To its ancestors' subscribers too, before the parent can end
            // (it waits for this child).
            self.emit(seq, &ev);
        }
        self.close_fanout();
        let mut preceding = preceding;
        // What the run owes rides with its terminal record, in the same
        // batch (one transaction in a store that keeps an outbox).
        preceding.extend(self.publish.record(&result, seq));
        let record = AuditRecord {
            run_id: self.run_id,
            seq,
            at_ms: result.finished_at,
            entry: AuditEntry::Terminal(result),
        };
        // It leaves the host's registry in `send_finished`, once its
        // terminal record is with the audit actor (see above).
        Finished::Terminal(Box::new(Terminal {
            preceding,
            record,
            deliver,
            durable,
            run: self.clone(),
        }))
    }

    /// Takes the finalized run out of the host's registry (and its count
    /// of runs in flight), once what finalizing it produced is with the
    /// audit actor.
    pub(crate) fn leave_host(&self) {
        self.host.leave(self.run_id);
    }

    /// Tells the parent (if it is still in flight) that this child ended.
    /// Called once the child's terminal record is with the audit actor, so
    /// the parent's own terminal record, whenever it comes, follows it.
    pub(crate) fn tell_parent(&self) {
        let Some(parent_id) = self.parent_run_id else {
            return;
        };
        if let Some(parent) = self.host.get(&parent_id) {
            parent
                .children
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|c| *c != self.run_id);
            parent.command(Command::ChildEnded(self.run_id));
        }
    }
}

/// A live view of a running run (B4).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LiveState {
    /// Model iterations started.
    pub iteration: u32,
    /// The current ceiling.
    pub max_iterations: u32,
    /// Time since the run started.
    pub elapsed_ms: u64,
    /// Tokens used so far.
    pub tokens: u64,
    /// Tool calls finished so far.
    pub tool_calls: u32,
    /// Cost so far in micro-dollars (its judges' included).
    pub cost_micros: u64,
    /// The critic's latest decision, if it made one.
    pub last_decision: Option<CriticDecision>,
    /// Whether the run has ended.
    pub finished: bool,
    /// Tool calls waiting for an operator's approval (the run is parked
    /// until they are decided).
    pub awaiting_approval: Vec<PendingApproval>,
}
