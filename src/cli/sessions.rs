//! `agentvisor sessions list|show`: the chat sessions in the database.
//!
//! - `sessions list [--limit N] [--json]`: sessions, the most recently
//!   updated first; `--json` prints one array of session metadata (`id`,
//!   `agent`, `state`, `caller_id`, `created_at`, `updated_at`, `prompts`,
//!   `messages`, `model_calls`, `usage`, `last_run_id`, and `on_busy` when
//!   the session keeps one (a server's); the stored manifest
//!   is left out).
//! - `sessions show ID [--json]`: the session's metadata, then its history
//!   in order; `--json` prints `{"session": …, "messages": [{"seq", "role",
//!   "content", "run_id", "at_ms"}, …]}`.
//!
//! Exit codes: 0 on success; 1 when `show` finds no such session; 2 when
//! the database is missing or cannot be opened, `--db :memory:`, or a
//! malformed session id. These commands never create a database.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde::Serialize;

use agentvisor::ports::session::{SessionMessage, SessionMeta, SessionStore};

use super::runs::utc;
use super::{Db, Named};

/// The database's sessions.
type Sessions = Named<dyn SessionStore>;

/// Flags of `agentvisor sessions`.
#[derive(Args, Debug)]
pub(crate) struct SessionsArgs {
    #[command(subcommand)]
    command: SessionsCommand,
}

#[derive(Subcommand, Debug)]
enum SessionsCommand {
    /// List sessions, the most recently updated first.
    List(ListArgs),
    /// Show one session: its metadata, then its history.
    Show(ShowArgs),
}

#[derive(Args, Debug)]
struct ListArgs {
    /// At most this many sessions.
    #[arg(long, value_name = "N", default_value_t = 20, allow_hyphen_values = true, value_parser = super::flags::whole_u32(1, super::flags::MAX_LIST as u32))]
    limit: u32,
    /// Print one JSON array.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ShowArgs {
    /// The session id (as `sessions list` prints it).
    id: String,
    /// Print `{"session": …, "messages": […]}`.
    #[arg(long)]
    json: bool,
}

/// A session's metadata as printed: without its stored manifest.
#[derive(Serialize)]
struct Listed<'a> {
    #[serde(flatten)]
    meta: &'a SessionMeta,
}

fn without_manifest(meta: &SessionMeta) -> serde_json::Value {
    let mut v = serde_json::to_value(Listed { meta }).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.remove("manifest");
    }
    v
}

pub(crate) async fn sessions(a: SessionsArgs, db: &Db) -> ExitCode {
    if *db == Db::Memory {
        return super::refuse("--db :memory: keeps no sessions; name a database file");
    }
    let opened = match super::open_existing(db).await {
        Ok(o) => o,
        Err(code) => return code,
    };
    let Some(store) = opened.sessions() else {
        return ExitCode::from(2);
    };
    let code = match a.command {
        SessionsCommand::List(l) => list(&store, l).await,
        SessionsCommand::Show(s) => show(&store, s).await,
    };
    opened.close().await;
    code
}

async fn list(store: &Sessions, a: ListArgs) -> ExitCode {
    let sessions = match store.list(a.limit as usize).await {
        Ok(s) => s,
        Err(e) => return super::refuse(format!("{}: {e}", store.name)),
    };
    if a.json {
        let all: Vec<serde_json::Value> = sessions.iter().map(without_manifest).collect();
        outln!("{}", serde_json::to_string(&all).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    if sessions.is_empty() {
        outln!("no sessions in {}", store.name);
        return ExitCode::SUCCESS;
    }
    outln!(
        "{:<32}  {:<16}  {:<8}  {:>7}  {:<20}",
        "SESSION",
        "AGENT",
        "STATE",
        "PROMPTS",
        "UPDATED (UTC)"
    );
    for s in &sessions {
        outln!(
            "{:<32}  {:<16}  {:<8}  {:>7}  {:<20}",
            s.id,
            s.agent,
            s.state,
            s.prompts,
            utc(s.updated_at)
        );
    }
    ExitCode::SUCCESS
}

async fn show(store: &Sessions, a: ShowArgs) -> ExitCode {
    if let Err(e) = agentvisor::session::check_session_id(&a.id) {
        return super::refuse(e);
    }
    let fail = |e: agentvisor::ports::session::SessionStoreError| {
        super::refuse(format!("{}: {e}", store.name))
    };
    let meta = match store.get(&a.id).await {
        Ok(Some(m)) => m,
        Ok(None) => {
            errln!("error: no session {} in {}", a.id, store.name);
            return ExitCode::from(1);
        }
        Err(e) => return fail(e),
    };
    let messages = match store.messages(&a.id).await {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    if a.json {
        #[derive(Serialize)]
        struct Shown<'a> {
            session: serde_json::Value,
            messages: &'a [SessionMessage],
        }
        let shown = Shown {
            session: without_manifest(&meta),
            messages: &messages,
        };
        outln!("{}", serde_json::to_string(&shown).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    outln!("session {}", meta.id);
    outln!("  agent:    {}", meta.agent);
    outln!("  state:    {}", meta.state);
    outln!("  caller:   {}", meta.caller_id.as_deref().unwrap_or("-"));
    outln!("  created:  {} UTC", utc(meta.created_at));
    outln!("  updated:  {} UTC", utc(meta.updated_at));
    outln!(
        "  prompts:  {} ({} messages, {} model calls)",
        meta.prompts,
        meta.messages,
        meta.model_calls
    );
    outln!(
        "  tokens:   {} in, {} out",
        meta.usage.input_tokens,
        meta.usage.output_tokens
    );
    if let Some(run) = meta.last_run_id {
        outln!("  last run: {run}");
    }
    outln!("messages:");
    for m in &messages {
        let role = serde_json::to_value(m.message.role)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        outln!("  {:>4}  {role:<9}  {}", m.seq, m.message.content);
    }
    ExitCode::SUCCESS
}
