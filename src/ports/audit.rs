//! The `AuditStore` port: an append-only log of what every run did. The
//! audit actor batches records and calls `append` once per batch; a store
//! writes a batch atomically (one transaction) or fails it whole.
//!
//! `(run_id, seq)` identifies a record: a store that persists records should
//! ignore a record it already holds, so the audit actor can replay its spool
//! after an outage without duplicates.
//!
//! The [`RunIndex`] port reads the history back by run (for `agentvisor runs`):
//! one [`RunSummary`] per run that has a terminal record.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::event::RunEvent;
use super::outbox::{OutboxStore, PublishIntent};
use super::retention::{PruneReport, PrunedCount, Retention};
use super::run::{KillReason, RunId, RunResult, RunStatus};

/// Who and what a run is, recorded at its start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Agent name (shared by the agent's runs).
    pub agent: std::sync::Arc<str>,
    /// Model name (shared by the agent's runs).
    pub model: std::sync::Arc<str>,
    /// Who submitted the run (shared by the caller's runs).
    pub caller_id: Option<std::sync::Arc<str>>,
    /// The channel it came from (chat bots).
    pub channel_id: Option<String>,
    /// The parent run, for sub-agents.
    pub parent_run_id: Option<RunId>,
    /// The session it belongs to.
    pub session_id: Option<String>,
    /// The prompt (capped).
    pub prompt: String,
    /// The tools the run may call (for replay).
    #[serde(default)]
    pub tools: std::sync::Arc<[String]>,
    /// The run's resolved limits (for replay), written as a manifest
    /// writes them.
    #[serde(default, with = "super::limits::limits_as_spec")]
    pub limits: Option<super::limits::Limits>,
    /// The host that runs it (its lease owner id, `HOSTNAME/PID/NONCE`):
    /// `recover` leaves the unfinished runs of a host whose lease is live
    /// to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<std::sync::Arc<str>>,
    /// The manifest the run ran (for `fork`, `eval` and `replay`), shared
    /// by the agent's runs. Stores keep it once per distinct manifest and
    /// record its [`RecordedManifest::id`] with the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<RecordedManifest>,
}

/// A run's manifest as recorded: its JSON and an id derived from it.
///
/// Serialized as its id alone (16 hex digits); the JSON is stored once
/// per id beside the log, and a store's [`AuditStore::run_records`] puts
/// it back. A record read without it (a store that lost it, or a run
/// recorded before manifests were kept) has `json: None`.
#[derive(Clone, Debug)]
pub struct RecordedManifest {
    /// A hash of the JSON text: equal texts have equal ids.
    pub id: u64,
    /// The manifest's JSON (an `AgentSpec`), shared.
    pub json: Option<super::checkpoint::EncodedJson>,
}

impl RecordedManifest {
    /// The record of `json`, its id computed from its text.
    pub fn of(json: super::checkpoint::EncodedJson) -> Self {
        RecordedManifest {
            id: Self::id_of(json.text()),
            json: Some(json),
        }
    }

    /// The id of a manifest's JSON text: FNV-1a, 64 bits (a fixed function,
    /// so an id means the same text in every build that reads the file).
    pub fn id_of(text: &str) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in text.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    }

    /// The id as written: 16 lowercase hex digits.
    pub fn id_hex(&self) -> String {
        format!("{:016x}", self.id)
    }
}

/// Equal when the ids are (the JSON is what the id names).
impl PartialEq for RecordedManifest {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

/// As `{"id": "…", "json": {…}}` when it holds its JSON (a spool keeps a
/// record whole), else as its id alone (`"…"`, as a store's `run.start`
/// record names it).
impl Serialize for RecordedManifest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        match &self.json {
            Some(json) => {
                let mut st = s.serialize_struct("RecordedManifest", 2)?;
                st.serialize_field("id", &self.id_hex())?;
                st.serialize_field("json", json)?;
                st.end()
            }
            None => s.serialize_str(&self.id_hex()),
        }
    }
}

impl<'de> Deserialize<'de> for RecordedManifest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Form;
        fn parse<E: serde::de::Error>(text: &str) -> Result<u64, E> {
            u64::from_str_radix(text, 16)
                .map_err(|_| E::custom(format!("bad manifest id `{text}`")))
        }
        impl<'de> serde::de::Visitor<'de> for Form {
            type Value = RecordedManifest;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a manifest id, or {\"id\", \"json\"}")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(RecordedManifest {
                    id: parse(v)?,
                    json: None,
                })
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut id = None;
                let mut json = None;
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    match &*key {
                        "id" => id = Some(parse(&map.next_value::<String>()?)?),
                        "json" => {
                            // A value, not raw text: the record may come
                            // through a buffered (tagged) enum.
                            let value = map.next_value::<serde_json::Value>()?;
                            json = Some(
                                super::checkpoint::EncodedJson::encode(&value)
                                    .map_err(serde::de::Error::custom)?,
                            );
                        }
                        _ => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                let id = id.ok_or_else(|| serde::de::Error::missing_field("id"))?;
                Ok(RecordedManifest { id, json })
            }
        }
        d.deserialize_any(Form)
    }
}

/// How much of a run the audit log keeps (`audit:` in a manifest, the
/// host's `HostConfig::audit`, `--audit`). Every run's start and terminal
/// record (its result, with its step summaries) are kept at both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditDetail {
    /// Every event (the default): what `replay` and a stream resumed from
    /// the log need.
    #[default]
    Full,
    /// The run's start, result, critic decisions, approvals, errors and
    /// warnings; not the step events (`step.start`, `step.finish`,
    /// `text.delta`, `tool.call`, a `tool.result` that succeeded,
    /// `message.create`, `transcript.compacted`).
    Summary,
}

impl AuditDetail {
    /// Whether a run recorded at this detail keeps `event` in the log.
    pub fn keeps(self, event: &RunEvent) -> bool {
        match self {
            AuditDetail::Full => true,
            AuditDetail::Summary => !matches!(
                event,
                RunEvent::StepStart { .. }
                    | RunEvent::StepFinish { .. }
                    | RunEvent::TextDelta { .. }
                    | RunEvent::ToolCall { .. }
                    | RunEvent::ToolResult { ok: true, .. }
                    | RunEvent::MessageCreate { .. }
                    | RunEvent::TranscriptCompacted { .. }
            ),
        }
    }

    /// The name (`full`, `summary`).
    pub fn as_str(self) -> &'static str {
        match self {
            AuditDetail::Full => "full",
            AuditDetail::Summary => "summary",
        }
    }
}

impl std::str::FromStr for AuditDetail {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "full" => Ok(AuditDetail::Full),
            "summary" => Ok(AuditDetail::Summary),
            other => Err(format!("`{other}` is not an audit detail (full, summary)")),
        }
    }
}

/// What an audit record says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "snake_case")]
pub enum AuditEntry {
    /// The run started executing.
    RunStarted(Box<RunInfo>),
    /// Something happened in the run (a step, a tool call, a critic decision, an error).
    Event(RunEvent),
    /// The terminal roll-up: exactly one per run.
    Terminal(Arc<RunResult>),
    /// What the run owes the outside world (see [`super::outbox`]): sent
    /// just ahead of its terminal record, in the same batch, with the
    /// terminal record's `seq`. Not a record of the run's log: a store
    /// that keeps an outbox writes the intents into it in the batch's
    /// transaction (see [`AuditStore::outbox`]) and does not give this
    /// record back with the run's records; a store without one keeps or
    /// drops it as it likes. In JSON (the spool's lines) it is
    /// `{"record": "publish", "intents": [...]}`: an internally tagged
    /// variant cannot hold a bare list.
    #[serde(
        serialize_with = "intents::serialize",
        deserialize_with = "intents::deserialize"
    )]
    Publish(Arc<[PublishIntent]>),
}

/// A `publish` record's intents as a map (`{"intents": [...]}`), so the
/// record's tag has somewhere to go.
mod intents {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::PublishIntent;

    #[derive(Serialize)]
    struct Out<'a> {
        intents: &'a [PublishIntent],
    }

    #[derive(Deserialize)]
    struct In {
        intents: Vec<PublishIntent>,
    }

    pub(super) fn serialize<S: Serializer>(
        intents: &Arc<[PublishIntent]>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        Out { intents }.serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Arc<[PublishIntent]>, D::Error> {
        Ok(In::deserialize(d)?.intents.into())
    }
}

/// One audit record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// The run.
    pub run_id: RunId,
    /// Order within the run (0-based; the terminal record may come from the
    /// critic and then carries `u32::MAX`).
    pub seq: u32,
    /// Unix ms.
    pub at_ms: u64,
    /// The content.
    pub entry: AuditEntry,
}

impl AuditRecord {
    /// Whether this is a run's terminal roll-up.
    pub fn is_terminal(&self) -> bool {
        matches!(self.entry, AuditEntry::Terminal(_))
    }
}

/// Counts a store keeps, for verdicts ("every run has exactly one terminal record").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditStats {
    /// Records written.
    pub records: u64,
    /// Terminal records written.
    pub terminal_records: u64,
    /// Batches written.
    pub batches: u64,
    /// Records that could be written neither to the store nor to the spool
    /// and were dropped, or were still held in memory when the host shut
    /// down (set by the audit actor; a store reports 0). Not 0 means
    /// records are lost: the CLI says how many and exits non-zero.
    #[serde(default)]
    pub unwritten: u64,
    /// Records left in the spool, not yet in the store, when the host shut
    /// down (set by the audit actor): the next host on that spool replays
    /// them.
    #[serde(default)]
    pub spooled: u64,
    /// The store lost what it writes to (a database file deleted or
    /// replaced while it was open): what it refused since — what went to
    /// the spool or is counted in `unwritten` — never reaches it. The CLI
    /// says so and exits non-zero.
    #[serde(default)]
    pub store_lost: bool,
    /// Runs whose terminal records reached neither the store nor the spool
    /// (held in memory when the host shut down, or dropped), by the status
    /// their callers were told (set by the audit actor; a store reports
    /// none): what those callers were told is recorded nowhere, and a
    /// listing of the store does not show these runs.
    #[serde(default, skip_serializing_if = "Unrecorded::is_empty")]
    pub unrecorded: Unrecorded,
}

/// Runs counted by status: those whose terminal records are recorded
/// nowhere ([`AuditStats::unrecorded`]). Serialized as an object of the
/// statuses counted (`{"ok": 3, "rejected": 1}`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unrecorded {
    counts: [u64; STATUSES.len()],
}

/// Every status, in the order [`Unrecorded`] lists them.
const STATUSES: [RunStatus; 8] = RunStatus::ALL;

impl Unrecorded {
    fn index(status: RunStatus) -> usize {
        match status {
            RunStatus::Ok => 0,
            RunStatus::Error => 1,
            RunStatus::Timeout => 2,
            RunStatus::Killed => 3,
            RunStatus::BudgetExceeded => 4,
            RunStatus::Cancelled => 5,
            RunStatus::Rejected => 6,
            RunStatus::DryRun => 7,
        }
    }

    /// Counts one run that ended `status`.
    pub fn add(&mut self, status: RunStatus) {
        self.counts[Self::index(status)] += 1;
    }

    /// How many runs that ended `status`.
    pub fn of(&self, status: RunStatus) -> u64 {
        self.counts[Self::index(status)]
    }

    /// How many runs in all.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Whether none is counted.
    pub fn is_empty(&self) -> bool {
        self.total() == 0
    }

    /// The statuses counted and their counts, in a fixed order (`ok` first).
    pub fn by_status(&self) -> impl Iterator<Item = (RunStatus, u64)> + '_ {
        STATUSES
            .iter()
            .map(|s| (*s, self.of(*s)))
            .filter(|(_, n)| *n > 0)
    }
}

impl std::fmt::Display for Unrecorded {
    /// `913 (ok 500, rejected 413)`, or `0`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.total())?;
        let mut sep = " (";
        for (status, n) in self.by_status() {
            write!(f, "{sep}{status} {n}")?;
            sep = ", ";
        }
        if !self.is_empty() {
            f.write_str(")")?;
        }
        Ok(())
    }
}

impl Serialize for Unrecorded {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        for (status, n) in self.by_status() {
            map.serialize_entry(status.as_str(), &n)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Unrecorded {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = std::collections::BTreeMap::<String, u64>::deserialize(d)?;
        let mut out = Unrecorded::default();
        for (name, n) in map {
            let status = STATUSES
                .iter()
                .find(|s| s.as_str() == name)
                .ok_or_else(|| serde::de::Error::custom(format!("unknown run status `{name}`")))?;
            out.counts[Self::index(*status)] = n;
        }
        Ok(out)
    }
}

/// An audit store failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AuditStoreError {
    /// The store could not write or read.
    #[error("audit store unavailable: {0}")]
    Unavailable(String),
}

/// Where audit records go. Object-safe; used as `Arc<dyn AuditStore>`.
#[async_trait]
pub trait AuditStore: Send + Sync + 'static {
    /// Writes a batch atomically.
    async fn append(&self, batch: &[AuditRecord]) -> Result<(), AuditStoreError>;

    /// Whether writing batches that queued up together, as one batch, saves
    /// this store work (a transaction per write: yes, the default). A store
    /// that keeps batches as they come says no: joining them would only
    /// copy records.
    fn joins_batches(&self) -> bool {
        true
    }

    /// Whether `append`s may overlap. A store that says yes queues a batch
    /// in the first poll of `append` and applies queued batches in that
    /// order, and fails a batch queued while the one before it was still
    /// being written if that one failed (so batches are applied in order or
    /// not at all). The audit actor then starts the next batch — its
    /// encoding — while the last one is written. Default: no.
    fn pipelines(&self) -> bool {
        false
    }

    /// Writes a batch the caller gives away, atomically; on failure the
    /// batch comes back. A store that keeps records as they are (the
    /// in-memory one) takes them without a copy; the default borrows them
    /// for [`AuditStore::append`].
    async fn append_owned(
        &self,
        batch: Vec<AuditRecord>,
    ) -> Result<(), (AuditStoreError, Vec<AuditRecord>)> {
        match self.append(&batch).await {
            Ok(()) => Ok(()),
            Err(e) => Err((e, batch)),
        }
    }

    /// Every stored record of one run, in order; its `run.start` record
    /// with its manifest's JSON ([`RecordedManifest::json`]) where the
    /// store keeps it.
    async fn run_records(&self, run_id: RunId) -> Result<Vec<AuditRecord>, AuditStoreError>;

    /// What has been written so far.
    async fn stats(&self) -> Result<AuditStats, AuditStoreError>;

    /// Runs that have records but no terminal record (interrupted by the
    /// end of their process, or still running): what `Host::recover` ends
    /// as `interrupted` when no checkpoint resumes them. A store that
    /// cannot tell answers none.
    async fn unfinished_runs(&self) -> Result<Vec<RunId>, AuditStoreError> {
        Ok(Vec::new())
    }

    /// Prunes the oldest finished runs `retention` no longer keeps (`now_ms`
    /// is the time ages count to), at most `batch` of them, with their
    /// records; counts them by agent and status (see
    /// [`AuditStore::pruned`]). Never a run in flight, nor one with a
    /// checkpoint. `dry_run`: says what it would prune, removes nothing. A
    /// store that keeps everything (the default) prunes nothing.
    async fn prune(
        &self,
        retention: &Retention,
        now_ms: u64,
        batch: usize,
        dry_run: bool,
    ) -> Result<PruneReport, AuditStoreError> {
        let _ = (retention, now_ms, batch);
        Ok(PruneReport {
            dry_run,
            ..PruneReport::default()
        })
    }

    /// The host is done writing (its shutdown drained every record): a
    /// store may fold its journal into its files now (SQLite: the WAL is
    /// checkpointed and truncated, so a finished command leaves no WAL
    /// behind). It stays usable. Default: nothing to do.
    async fn settle(&self) {}

    /// The runs pruned so far (all time), by agent and status.
    async fn pruned(&self) -> Result<Vec<PrunedCount>, AuditStoreError> {
        Ok(Vec::new())
    }

    /// The outbox this store writes [`AuditEntry::Publish`] intents into,
    /// in the transaction of the batch that brings them (so an intent is
    /// on file exactly when its run's terminal record is). `None` (the
    /// default): the store keeps no outbox, and a host on it cannot
    /// publish.
    fn outbox(self: Arc<Self>) -> Option<Arc<dyn OutboxStore>> {
        None
    }
}

/// Which finished runs [`RunIndex::list_runs`] returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunFilter {
    /// Only runs that ended with this status.
    pub status: Option<RunStatus>,
    /// Only runs of this caller.
    pub caller: Option<String>,
    /// At most this many (`None`: all).
    pub limit: Option<u32>,
    /// Only the runs of this tree: the run itself and every run whose
    /// [`RunSummary::root_run_id`] it is (its sub-agents at any depth; a
    /// pipeline's phases and theirs).
    pub root: Option<RunId>,
    /// Only runs listed after this one: the next page after a page whose
    /// last run this is (keyset paging; see [`RunCursor`]).
    pub after: Option<RunCursor>,
}

/// Where a page of [`RunIndex::list_runs`] ended: the last run's end time
/// and id, the listing's sort key. The next page is the runs after it in
/// that order, so page N costs what page 1 does, and runs that end while a
/// reader pages (they sort first) neither shift nor repeat what it reads:
/// every run on file when paging began is listed exactly once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RunCursor {
    /// Unix ms the run ended.
    pub finished_at: u64,
    /// The run.
    pub run_id: RunId,
}

impl RunCursor {
    /// The cursor after `run`.
    pub fn after(run: &RunSummary) -> Self {
        RunCursor {
            finished_at: run.finished_at,
            run_id: run.run_id,
        }
    }

    /// Whether `run` comes after this cursor in the listing's order (the
    /// most recently finished first; ties: the larger run id first).
    pub fn precedes(&self, run: &RunSummary) -> bool {
        (run.finished_at, run.run_id) < (self.finished_at, self.run_id)
    }

    /// The cursor as an opaque token: 48 hex digits (end time, then id).
    pub fn encode(&self) -> String {
        format!("{:016x}{}", self.finished_at, self.run_id)
    }

    /// Reads a token [`encode`](Self::encode) made; `None` for anything else.
    pub fn decode(token: &str) -> Option<Self> {
        if token.len() != 48 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let (at, id) = token.split_at(16);
        Some(RunCursor {
            finished_at: u64::from_str_radix(at, 16).ok()?,
            run_id: id.parse().ok()?,
        })
    }
}

/// One finished run, as the run index lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSummary {
    /// The run.
    pub run_id: RunId,
    /// The agent's name.
    pub agent: String,
    /// Who submitted it.
    pub caller_id: Option<String>,
    /// The parent run, for a sub-agent run.
    pub parent_run_id: Option<RunId>,
    /// The tree it belongs to when it is not its own root (see
    /// [`RunResult::root_run_id`]).
    #[serde(default)]
    pub root_run_id: Option<RunId>,
    /// How it ended.
    pub status: RunStatus,
    /// Why it was killed, when it was.
    pub kill_reason: Option<KillReason>,
    /// The error kind, when not ok.
    pub error_kind: Option<String>,
    /// Unix ms when it started executing.
    pub started_at: u64,
    /// Unix ms when it ended.
    pub finished_at: u64,
    /// The recorded run and step it was forked from, for a fork; left out
    /// of JSON otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<super::run::ForkOrigin>,
}

impl RunSummary {
    /// The summary of a terminal result.
    pub fn of(result: &RunResult) -> Self {
        RunSummary {
            run_id: result.run_id,
            agent: result.agent.clone(),
            caller_id: result.caller_id.clone(),
            parent_run_id: result.parent_run_id,
            root_run_id: result.root_run_id,
            status: result.status,
            kill_reason: result.kill_reason,
            error_kind: result.error_kind.clone(),
            started_at: result.started_at,
            finished_at: result.finished_at,
            forked_from: result.forked_from,
        }
    }

    /// Wall time from start to finish, in ms.
    pub fn duration_ms(&self) -> u64 {
        self.finished_at.saturating_sub(self.started_at)
    }

    /// Whether this run passes `filter` (its limit aside).
    pub fn matches(&self, filter: &RunFilter) -> bool {
        filter.after.is_none_or(|c| c.precedes(self))
            && filter.status.is_none_or(|s| s == self.status)
            && filter
                .caller
                .as_deref()
                .is_none_or(|c| self.caller_id.as_deref() == Some(c))
            && filter
                .root
                .is_none_or(|r| self.run_id == r || self.root_run_id == Some(r))
    }
}

/// Reads the run history back: finished runs and their results. Object-safe;
/// used as `Arc<dyn RunIndex>`. Stores that persist records implement it
/// next to [`AuditStore`].
#[async_trait]
pub trait RunIndex: Send + Sync + 'static {
    /// Finished runs that pass `filter`, the most recently finished first
    /// (ties: the larger run id first). A battery keeps a page after a
    /// cursor (`filter.after`) as cheap as the first: it seeks to the
    /// cursor in an index on the sort key, it does not skip rows.
    async fn list_runs(&self, filter: &RunFilter) -> Result<Vec<RunSummary>, AuditStoreError>;

    /// A run's terminal result, `None` when no terminal record is on file.
    async fn run_result(&self, run_id: RunId) -> Result<Option<RunResult>, AuditStoreError>;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn unrecorded_runs_count_by_status_and_read_back() {
        let mut u = Unrecorded::default();
        assert_eq!((u.to_string(), u.is_empty()), ("0".to_string(), true));
        for s in [RunStatus::Rejected, RunStatus::Ok, RunStatus::Ok] {
            u.add(s);
        }
        assert_eq!(u.total(), 3);
        assert_eq!(u.to_string(), "3 (ok 2, rejected 1)");
        let json = serde_json::to_string(&u).unwrap();
        assert_eq!(json, r#"{"ok":2,"rejected":1}"#);
        assert_eq!(serde_json::from_str::<Unrecorded>(&json).unwrap(), u);
        assert!(serde_json::from_str::<Unrecorded>(r#"{"fine":1}"#).is_err());
        // Stats without the field (an older writer) read as none.
        let stats: AuditStats =
            serde_json::from_str(r#"{"records":1,"terminal_records":1,"batches":1}"#).unwrap();
        assert!(stats.unrecorded.is_empty());
    }

    /// A batch that owes publishes goes to the spool as JSON lines when
    /// the store cannot be written: its `publish` record must encode (an
    /// internally tagged variant cannot hold a bare list) and read back.
    #[test]
    fn a_publish_record_encodes_as_json_and_reads_back() {
        let run_id = RunId::new();
        let intent = PublishIntent {
            key: format!("{run_id}-0-hook"),
            run_id,
            index: 0,
            name: "hook".into(),
            kind: "webhook".into(),
            target: serde_json::json!({ "url": "https://example.com/in" }),
            shown: "webhook https://example.com/…".into(),
            body: "the digest".into(),
            skipped: None,
            schedule: "daily".into(),
            skill: "digest".into(),
            timeout_ms: 30_000,
            at_ms: 1,
        };
        let record = AuditRecord {
            run_id,
            seq: 7,
            at_ms: 1,
            entry: AuditEntry::Publish(vec![intent].into()),
        };
        let line = serde_json::to_string(&record).unwrap();
        assert!(
            line.contains(r#""record":"publish","intents":[{"#),
            "{line}"
        );
        let back: AuditRecord = serde_json::from_str(&line).unwrap();
        assert_eq!(back, record);
    }
}
