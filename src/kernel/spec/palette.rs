//! Palettes as manifests write them — sub-agents (`agents:`, [`SubAgentRef`])
//! and the skills of a skills repository (`skills:`, [`SkillPalette`]) —
//! and as they are read ([`SubAgent`], one per tool: `agent__NAME` or
//! `skill__NAME`); `AgentSpec::from_file` reads them.
//!
//! # Skills as tools
//!
//! `skills: { repo: PATH, offer: [NAME, …] }` offers skills of the skills
//! repository at `PATH` (relative to the manifest, as `agents:` paths
//! are) as tools `skill__NAME`. Each is a sub-agent whose manifest is
//! built from the skill here, once, when the manifest loads:
//!
//! - its system prompt is the `SKILL.md` body (includes inserted); the
//!   tool's argument `input` is the child run's prompt;
//! - its name and description are the skill's (an offer's `description`
//!   wins); `max_tokens` is the front matter's, and its turns
//!   (`limits.max_iterations`) the front matter's `max_turns`, else 20, as
//!   a scheduled run's;
//! - its model: the offer's `model`, else `scripted` when the offer gives
//!   a `script`, else the front matter's `model_hint`, else the parent's
//!   own model (with the parent's `base_url` and `api_key_env`, which go
//!   with the parent's model only);
//! - its MCP servers: those of the parent's that the skill's
//!   `mcp_servers` names (a name the parent does not start is refused
//!   here), or all of the parent's when it names none — as a schedule's
//!   servers are given to its skill; it gets none of the parent's `tools`.
//!
//! An unknown key, a repository that does not open (its own checks
//! included), a name that is no skill of it, a name offered twice, or a
//! child that would run on the scripted model without a `script` are
//! refused here, naming the key.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize};

use super::mcp::McpSpec;
use super::{AgentSpec, ScriptEntry, SpecError};

/// The prefix of a sub-agent's tool name (`agent__NAME`).
pub const AGENT_TOOL_PREFIX: &str = "agent__";

/// The prefix of an offered skill's tool name (`skill__NAME`).
pub const SKILL_TOOL_PREFIX: &str = "skill__";

/// A palette entry as a manifest writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SubAgentRef {
    /// The manifest's path.
    File(String),
    /// The path, and what the tool tells the model.
    Described {
        /// The manifest's path.
        file: String,
        /// The tool's description (default: the child manifest's).
        #[serde(default)]
        description: Option<String>,
    },
}

impl SubAgentRef {
    pub(super) fn file(&self) -> &str {
        match self {
            SubAgentRef::File(f) | SubAgentRef::Described { file: f, .. } => f,
        }
    }

    pub(super) fn description(&self) -> Option<&str> {
        match self {
            SubAgentRef::File(_) => None,
            SubAgentRef::Described { description, .. } => description.as_deref(),
        }
    }
}

/// A manifest's `skills:`: skills of a skills repository offered as
/// tools `skill__NAME` (see the module doc).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkillPalette {
    /// The skills repository (the folder of its `agentvisor.yaml`),
    /// relative to the manifest.
    pub repo: String,
    /// The skills offered, each a tool `skill__NAME`.
    #[serde(deserialize_with = "offered_skills")]
    pub offer: Vec<OfferedSkill>,
}

/// One skill a manifest offers: its name (`digest`), or
/// `{ skill: digest, description: …, model: …, script: […] }`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfferedSkill {
    /// The skill's name in the repository (the tool is `skill__NAME`).
    pub skill: String,
    /// What the tool tells the model (default: the skill's `description`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The child run's model, over the skill's `model_hint` and the
    /// parent's model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The scripted model's responses for the child run (tests, examples):
    /// with a script and no `model`, the child runs on `scripted`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub script: Vec<ScriptEntry>,
}

/// An offer as written: a name, or the keys of [`OfferedSkill`] (whose
/// unknown keys are refused by name, with their line).
pub(super) fn offered_skills<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<OfferedSkill>, D::Error> {
    struct Entry(OfferedSkill);
    impl<'de> Deserialize<'de> for Entry {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = OfferedSkill;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a skill's name, or { skill, description, model, script }")
                }
                fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<OfferedSkill, E> {
                    Ok(OfferedSkill {
                        skill: v.to_string(),
                        ..OfferedSkill::default()
                    })
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    map: A,
                ) -> Result<OfferedSkill, A::Error> {
                    OfferedSkill::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                }
            }
            d.deserialize_any(Visit).map(Entry)
        }
    }
    Ok(Vec::<Entry>::deserialize(d)?
        .into_iter()
        .map(|e| e.0)
        .collect())
}

/// What a palette entry runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaletteKind {
    /// A sub-agent's manifest (`agents:`): the tool `agent__NAME`.
    #[default]
    Agent,
    /// A skill of a skills repository (`skills:`): the tool `skill__NAME`.
    Skill,
}

impl PaletteKind {
    /// Its tools' name prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            PaletteKind::Agent => AGENT_TOOL_PREFIX,
            PaletteKind::Skill => SKILL_TOOL_PREFIX,
        }
    }

    fn is_agent(&self) -> bool {
        *self == PaletteKind::Agent
    }
}

/// A palette entry, read: a sub-agent, or an offered skill as the
/// sub-agent it runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubAgent {
    /// Its name in the palette (the tool is `agent__NAME` or `skill__NAME`).
    pub name: String,
    /// What the tool tells the model.
    pub description: String,
    /// Its manifest (an offered skill's: built from the skill).
    pub spec: Arc<AgentSpec>,
    /// What it runs: a sub-agent, or a skill.
    #[serde(default, skip_serializing_if = "PaletteKind::is_agent")]
    pub kind: PaletteKind,
}

impl SubAgent {
    /// The name of its tool (`agent__NAME`, `skill__NAME`).
    pub fn tool_name(&self) -> String {
        format!("{}{}", self.kind.prefix(), self.name)
    }
}

/// How deep manifests may name sub-agents' manifests when they are read.
const MAX_PALETTE_NESTING: usize = 8;

impl AgentSpec {
    /// Whether `name` is a tool of the agent's palette: `agent__NAME` of
    /// one of its `agents`, or `skill__NAME` of a skill its `skills`
    /// offers.
    pub(super) fn palette_offers(&self, name: &str) -> bool {
        name.strip_prefix(AGENT_TOOL_PREFIX)
            .is_some_and(|n| self.agents.contains_key(n))
            || name.strip_prefix(SKILL_TOOL_PREFIX).is_some_and(|n| {
                self.skills
                    .as_ref()
                    .is_some_and(|s| s.offer.iter().any(|o| o.skill == n))
            })
    }

    /// Whether the manifest has a palette (`agents` or `skills`).
    pub(super) fn has_palette(&self) -> bool {
        !self.agents.is_empty() || self.skills.is_some()
    }

    /// Reads the palette this manifest names, relative to `dir`: the
    /// sub-agents' manifests (`agents:`), then the offered skills
    /// (`skills:`). `stack` holds the files being read (a manifest that
    /// names itself, directly or not, is refused).
    pub(super) fn read_palette(
        &mut self,
        dir: &Path,
        stack: &mut Vec<std::path::PathBuf>,
        path: Option<&str>,
    ) -> Result<(), SpecError> {
        let mut read = self.read_sub_agents(dir, stack, path)?;
        read.extend(self.read_skills(dir, path)?);
        self.sub_agents = read;
        Ok(())
    }

    /// Reads the manifests this one names under `agents:`, relative to
    /// `dir`.
    fn read_sub_agents(
        &self,
        dir: &Path,
        stack: &mut Vec<std::path::PathBuf>,
        path: Option<&str>,
    ) -> Result<Vec<SubAgent>, SpecError> {
        let invalid = |message: String| SpecError::Invalid {
            path: path.map(str::to_string),
            message,
        };
        let mut read = Vec::with_capacity(self.agents.len());
        for (name, entry) in &self.agents {
            if !is_palette_name(name) {
                return Err(invalid(format!(
                    "agents: `{name}` is not a usable sub-agent name (1-57 of A-Z a-z 0-9 _ -)"
                )));
            }
            let file = dir.join(entry.file());
            let canonical = std::fs::canonicalize(&file).map_err(|e| {
                invalid(format!(
                    "agents.{name}: cannot read sub-agent manifest {}: {e}",
                    file.display()
                ))
            })?;
            if stack.contains(&canonical) {
                return Err(invalid(format!(
                    "agents.{name}: {} names a manifest that is already being read (an agent cannot delegate to itself)",
                    file.display()
                )));
            }
            if stack.len() >= MAX_PALETTE_NESTING {
                return Err(invalid(format!(
                    "agents.{name}: sub-agent manifests nest more than {MAX_PALETTE_NESTING} deep"
                )));
            }
            stack.push(canonical);
            let child = Self::from_file_in(&file, stack);
            stack.pop();
            let child = child.map_err(|e| {
                invalid(format!(
                    "agents.{name}: the sub-agent's manifest is not usable: {e}"
                ))
            })?;
            let description = entry
                .description()
                .map(str::to_string)
                .or_else(|| child.description.clone())
                .unwrap_or_else(|| {
                    format!(
                        "Delegates a task to the `{}` agent and returns its answer.",
                        child.name
                    )
                });
            read.push(SubAgent {
                name: name.clone(),
                description,
                spec: Arc::new(child),
                kind: PaletteKind::Agent,
            });
        }
        Ok(read)
    }

    /// Reads the skills this manifest offers under `skills:` from their
    /// repository (relative to `dir`), each as the sub-agent it runs (see
    /// the module doc).
    fn read_skills(&self, dir: &Path, path: Option<&str>) -> Result<Vec<SubAgent>, SpecError> {
        let Some(palette) = &self.skills else {
            return Ok(Vec::new());
        };
        let invalid = |message: String| SpecError::Invalid {
            path: path.map(str::to_string),
            message,
        };
        if palette.offer.is_empty() {
            return Err(invalid(
                "`skills.offer` is empty: list the skills to offer as tools".into(),
            ));
        }
        let root = dir.join(&palette.repo);
        let repo = crate::skills::SkillsRepo::open(&root).map_err(|e| {
            invalid(format!(
                "`skills.repo`: the skills repository {} is not usable: {e}",
                root.display()
            ))
        })?;
        let mut seen = std::collections::HashSet::new();
        let mut read = Vec::with_capacity(palette.offer.len());
        for offer in &palette.offer {
            let name = &offer.skill;
            if !seen.insert(name.as_str()) {
                return Err(invalid(format!("`skills.offer` lists `{name}` twice")));
            }
            if !is_palette_name(name) {
                return Err(invalid(format!(
                    "`skills.offer`: `{name}` is not a usable tool name (1-57 of A-Z a-z 0-9 _ -)"
                )));
            }
            let Some(skill) = repo.skills.get(name) else {
                let known: Vec<&str> = repo.skills.keys().map(String::as_str).collect();
                return Err(invalid(format!(
                    "`skills.offer`: `{name}` is not a skill of {} (its skills: {})",
                    root.display(),
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )));
            };
            let child = self
                .skill_child(skill, offer)
                .map_err(|m| invalid(format!("`skills.offer` `{name}`: {m}")))?;
            let description = offer
                .description
                .clone()
                .or_else(|| skill.front.description.clone())
                .unwrap_or_else(|| {
                    format!("Runs the `{name}` skill on the input and returns its output.")
                });
            read.push(SubAgent {
                name: name.clone(),
                description,
                spec: Arc::new(child),
                kind: PaletteKind::Skill,
            });
        }
        Ok(read)
    }

    /// The manifest of the child run an offered skill starts (see the
    /// module doc), checked.
    fn skill_child(
        &self,
        skill: &crate::skills::Skill,
        offer: &OfferedSkill,
    ) -> Result<AgentSpec, String> {
        let own = offer
            .model
            .clone()
            .or_else(|| (!offer.script.is_empty()).then(|| "scripted".to_string()))
            .or_else(|| skill.front.model_hint.clone());
        let inherits = own.is_none();
        let model = own.unwrap_or_else(|| self.model.clone());
        if model == "scripted" && offer.script.is_empty() {
            let whose = if inherits {
                "the parent's scripted model"
            } else {
                "the scripted model"
            };
            return Err(format!(
                "it would run on {whose}, which needs a script for it: write `{{ skill: {}, script: [...] }}`",
                skill.name
            ));
        }
        let mut child = AgentSpec::new(skill.name.clone(), model);
        if inherits {
            child.base_url = self.base_url.clone();
            child.api_key_env = self.api_key_env.clone();
        }
        child.description = skill.front.description.clone();
        child.system = skill.prompt.clone();
        child.max_tokens = skill.front.max_tokens;
        child.limits.max_iterations = Some(
            skill
                .front
                .max_turns
                .unwrap_or(crate::skills::DEFAULT_MAX_TURNS),
        );
        child.script = offer.script.clone();
        let parents = self.mcp.as_ref().map_or(&[][..], |m| &m.servers[..]);
        for needed in &skill.front.mcp_servers {
            if !parents.iter().any(|s| &s.name == needed) {
                return Err(format!(
                    "the skill needs the MCP server `{needed}`, which this manifest's `mcp` does not start"
                ));
            }
        }
        let servers: Vec<_> = parents
            .iter()
            .filter(|s| {
                skill.front.mcp_servers.is_empty() || skill.front.mcp_servers.contains(&s.name)
            })
            .cloned()
            .collect();
        if !servers.is_empty() {
            child.mcp = Some(McpSpec { servers });
        }
        child.check("")?;
        Ok(child)
    }

    pub(super) fn from_file_in(
        path: &Path,
        stack: &mut Vec<std::path::PathBuf>,
    ) -> Result<Self, SpecError> {
        let mut spec = Self::read_file(path)?;
        if spec.has_palette() {
            let dir = path.parent().unwrap_or(Path::new("."));
            let shown = path.display().to_string();
            spec.read_palette(dir, stack, Some(&shown))?;
        }
        Ok(spec)
    }
}

/// A palette entry's name: 1-57 of A-Z a-z 0-9 _ - (its tool's name, the
/// prefix added, is at most 64).
fn is_palette_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 57
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
