//! A checkpoint in parts, as the database batteries (SQLite, PostgreSQL)
//! keep it: a header that does not grow with the run, and four lists of
//! entries that do. Both batteries split and rebuild checkpoints here, so
//! they hold the same bytes for the same save; each keeps the parts in its
//! own tables (see their module docs).
//!
//! The header is the checkpoint's JSON less its manifest, invocation and
//! lists. The lists, each entry one JSON value at its place (`seq`, from
//! 0): [`START`] the manifest (seq 0) and the invocation (seq 1), written
//! with a save written whole; [`MESSAGES`] the transcript; [`STEPS`] the
//! step records; [`DECISIONS`] the critic decisions. A save that keeps
//! what the run's previous save holds ([`Unchanged`]) carries only the
//! entries past it, each list from its `from`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::ports::checkpoint::{Checkpoint, EncodedJson, ParkedCalls, Unchanged};
use crate::ports::run::{RunId, Usage};

/// The list of the manifest and the invocation.
pub(crate) const START: u8 = 0;
/// The list of the transcript's messages.
pub(crate) const MESSAGES: u8 = 1;
/// The list of the step records.
pub(crate) const STEPS: u8 = 2;
/// The list of the critic decisions.
pub(crate) const DECISIONS: u8 = 3;
/// Lists 1 to 3, in the order of [`Parts::lists`].
pub(crate) const GROWING: [u8; 3] = [MESSAGES, STEPS, DECISIONS];

/// A checkpoint's header: all of it but the manifest, the invocation and
/// the lists.
#[derive(Serialize, Deserialize)]
struct Header {
    run_id: RunId,
    agent: Arc<str>,
    iteration: u32,
    usage: Usage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cost_micros: Option<u64>,
    resumes: u32,
    started_at: u64,
    saved_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    parked: Option<ParkedCalls>,
}

/// What a save writes of one growing list.
pub(crate) struct Entries {
    /// The entries before it are kept (0 in a save written whole).
    pub(crate) from: usize,
    /// The entries from `from` on, encoded.
    pub(crate) entries: Vec<String>,
}

impl Entries {
    /// `list` from `from` on, encoded.
    fn of<T: Serialize>(list: &[T], from: usize) -> Result<Self, serde_json::Error> {
        let from = from.min(list.len());
        let entries = list[from..]
            .iter()
            .map(serde_json::to_string)
            .collect::<Result<_, _>>()?;
        Ok(Entries { from, entries })
    }

    /// How many entries the list has after the save.
    pub(crate) fn len(&self) -> usize {
        self.from + self.entries.len()
    }
}

/// One save, in parts.
pub(crate) struct Parts {
    /// The [`Header`], as JSON.
    pub(crate) header: String,
    /// The run's first checkpoint: it may create the run's row (see
    /// `Checkpointer::save`).
    pub(crate) first: bool,
    /// Set for a save written whole: the manifest and the invocation
    /// (list 0). A save without them keeps the run's entries before each
    /// list's `from`.
    pub(crate) start: Option<[String; 2]>,
    /// The transcript, the steps and the critic decisions (lists 1 to 3).
    pub(crate) lists: [Entries; 3],
}

impl Parts {
    /// `c`, keeping what `keep` says of the run's previous save: written
    /// whole when that is nothing (and always for a run's first save).
    pub(crate) fn of(c: &Checkpoint, keep: Unchanged) -> Result<Self, serde_json::Error> {
        let keep = if c.is_first() {
            Unchanged::default()
        } else {
            keep.within(c)
        };
        let header = Header {
            run_id: c.run_id,
            agent: c.agent.clone(),
            iteration: c.iteration,
            usage: c.usage,
            cost_micros: c.cost_micros,
            resumes: c.resumes,
            started_at: c.started_at,
            saved_at: c.saved_at,
            parked: c.parked.clone(),
        };
        Ok(Parts {
            header: serde_json::to_string(&header)?,
            first: c.is_first(),
            start: keep
                .is_nothing()
                .then(|| [c.spec.text().to_string(), c.invocation.text().to_string()]),
            lists: [
                Entries::of(&c.transcript, keep.messages)?,
                Entries::of(&c.steps, keep.steps)?,
                Entries::of(&c.critic, keep.critic)?,
            ],
        })
    }

    /// The entries of lists 1 to 3 the run has after the save.
    pub(crate) fn counts(&self) -> [usize; 3] {
        self.lists.each_ref().map(Entries::len)
    }
}

/// A run's entries as read, list by list (0 to 3), in order.
pub(crate) type Lists = [Vec<String>; 4];

/// Adds an entry read at (`list`, `seq`) to `lists`, read in `(list, seq)`
/// order. One out of place (an unknown list, a gap) is left out: the
/// checkpoint is then found incomplete by [`assemble`].
pub(crate) fn push_entry(lists: &mut Lists, list: i64, seq: i64, body: String) {
    if let Some(l) = usize::try_from(list).ok().and_then(|i| lists.get_mut(i)) {
        if seq == l.len() as i64 {
            l.push(body);
        }
    }
}

/// A checkpoint from its header and entries; `counts`: the entries of
/// lists 1 to 3 its row says it has.
pub(crate) fn assemble(
    header: &str,
    entries: Option<Lists>,
    counts: [i64; 3],
) -> Result<Checkpoint, String> {
    let [start, messages, steps, decisions] = entries.unwrap_or_default();
    let found = [messages.len(), steps.len(), decisions.len()].map(|n| n as i64);
    if start.len() != 2 || found != counts {
        return Err(format!(
            "its entries are incomplete: {} of 2 start entries, {found:?} of {counts:?} messages, steps and decisions",
            start.len(),
        ));
    }
    let header: Header = serde_json::from_str(header).map_err(|e| e.to_string())?;
    let mut start = start.into_iter();
    let mut encoded = || EncodedJson::from_text(start.next().unwrap_or_default());
    let (spec, invocation) = (encoded(), encoded());
    fn decode<T: serde::de::DeserializeOwned>(list: Vec<String>) -> Result<Vec<T>, String> {
        list.iter()
            .map(|e| serde_json::from_str(e).map_err(|e| e.to_string()))
            .collect()
    }
    Ok(Checkpoint {
        run_id: header.run_id,
        agent: header.agent,
        spec: spec.map_err(|e| e.to_string())?,
        invocation: invocation.map_err(|e| e.to_string())?,
        transcript: Arc::new(decode(messages)?),
        iteration: header.iteration,
        steps: decode(steps)?,
        usage: header.usage,
        cost_micros: header.cost_micros,
        critic: decode(decisions)?,
        resumes: header.resumes,
        started_at: header.started_at,
        saved_at: header.saved_at,
        parked: header.parked,
        unchanged: Unchanged::default(),
    })
}
