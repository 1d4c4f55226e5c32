//! [`Agent`]: a manifest made ready to run on one host — its model resolved,
//! its tool set selected and validated, its limits resolved over the host's
//! defaults. Prepare once, submit many times: every run of an agent shares
//! these, so a run costs only its own state.

use std::sync::Arc;

use crate::dispatch::ToolSet;
use crate::output::OutputSchema;
use crate::ports::checkpoint::EncodedJson;
use crate::ports::model::{CallOptions, ChatModel};
use crate::ports::tool::ToolEffect;
use crate::pricing::Price;
use crate::spec::{AgentSpec, Guards, Limits};

/// A prepared agent. Cheap to clone.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<AgentInner>,
}

struct AgentInner {
    spec: Arc<AgentSpec>,
    name: Arc<str>,
    model_name: Arc<str>,
    tool_names: Arc<[String]>,
    /// The transcript a run starts from when its input is the manifest's
    /// own prompt: built once, shared until a run's first answer.
    default_transcript: std::sync::OnceLock<Arc<Vec<crate::ports::model::Message>>>,
    /// The manifest as JSON, encoded once for every durable run's
    /// checkpoints.
    encoded_spec: std::sync::OnceLock<EncodedJson>,
    /// The manifest as its runs record it (`run.start`): its JSON and id,
    /// made once.
    recorded: std::sync::OnceLock<Option<crate::ports::audit::RecordedManifest>>,
    model: Arc<dyn ChatModel>,
    /// The model's price, looked up once; `None` for a model that costs
    /// nothing or that the price table does not know.
    price: Option<Price>,
    /// The manifest's `output_schema`, compiled once.
    output: Option<Arc<OutputSchema>>,
    /// The manifest's `guard:` and `output_guard:`, compiled once; `None`
    /// when it has neither (its runs check nothing).
    guards: Option<Arc<Guards>>,
    /// The manifest's model call options (sampling, `tool_choice`), built
    /// once; `None` when it sets none.
    options: Option<Arc<CallOptions>>,
    tools: ToolSet,
    /// Shared with every run of the agent that keeps them (a run holds a
    /// pointer, not a copy).
    limits: Arc<Limits>,
    /// Why its runs cannot start (its MCP servers did not): kind, message.
    unusable: Option<(&'static str, String)>,
    /// Its model judges (`critic.policy: judge`, `approval.judge`).
    judges: crate::judge::Judges,
}

impl Agent {
    pub(crate) fn new(
        spec: Arc<AgentSpec>,
        model: Arc<dyn ChatModel>,
        tools: ToolSet,
        limits: Limits,
    ) -> Self {
        Agent {
            inner: Arc::new(AgentInner {
                name: Arc::from(spec.name.as_str()),
                model_name: Arc::from(model.name()),
                default_transcript: std::sync::OnceLock::new(),
                encoded_spec: std::sync::OnceLock::new(),
                recorded: std::sync::OnceLock::new(),
                tool_names: Arc::from(spec.tools.clone()),
                price: model.price_id().and_then(crate::pricing::lookup),
                output: spec
                    .output_schema
                    .clone()
                    .map(|s| Arc::new(OutputSchema::new(s))),
                guards: Guards::of(&spec).map(Arc::new),
                options: spec.call_options().map(Arc::new),
                spec,
                model,
                tools,
                limits: Arc::new(limits),
                unusable: None,
                judges: Default::default(),
            }),
        }
    }

    /// The same agent, whose runs end `error` with `kind` at once (its MCP
    /// servers did not start).
    pub(crate) fn unusable(mut self, kind: &'static str, message: String) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.unusable = Some((kind, message));
        }
        self
    }

    /// The same agent with its model judges (set while it is prepared).
    pub(crate) fn with_judges(mut self, judges: crate::judge::Judges) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.judges = judges;
        }
        self
    }

    /// Its model judges.
    pub(crate) fn judges(&self) -> &crate::judge::Judges {
        &self.inner.judges
    }

    /// Why its runs cannot start, if they cannot.
    pub(crate) fn unusable_reason(&self) -> Option<(&'static str, &str)> {
        self.inner.unusable.as_ref().map(|(k, m)| (*k, m.as_str()))
    }

    /// The manifest.
    pub fn spec(&self) -> &AgentSpec {
        &self.inner.spec
    }

    /// The manifest, shared.
    pub(crate) fn spec_arc(&self) -> Arc<AgentSpec> {
        self.inner.spec.clone()
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The tool names the manifest asks for, shared by every run's record.
    pub(crate) fn tool_names(&self) -> Arc<[String]> {
        self.inner.tool_names.clone()
    }

    pub(crate) fn name_arc(&self) -> Arc<str> {
        self.inner.name.clone()
    }

    /// The model's name, shared.
    pub(crate) fn model_name(&self) -> Arc<str> {
        self.inner.model_name.clone()
    }

    /// The starting transcript of a run whose input is the manifest's own
    /// prompt, made by `make` once and shared by every such run (a run
    /// copies it when it first adds to it).
    pub(crate) fn default_transcript(
        &self,
        make: impl FnOnce() -> Vec<crate::ports::model::Message>,
    ) -> Arc<Vec<crate::ports::model::Message>> {
        self.inner
            .default_transcript
            .get_or_init(|| Arc::new(make()))
            .clone()
    }

    /// The manifest as JSON, encoded on first use and shared by the
    /// checkpoints of every durable run of the agent.
    pub(crate) fn encoded_spec(&self) -> Result<EncodedJson, serde_json::Error> {
        if let Some(e) = self.inner.encoded_spec.get() {
            return Ok(e.clone());
        }
        let e = EncodedJson::encode(&*self.inner.spec)?;
        Ok(self.inner.encoded_spec.get_or_init(|| e).clone())
    }

    /// The manifest as a run's `run.start` record names it, every secret
    /// value the process knows redacted; `None` if it does not encode (it
    /// then goes unrecorded, the run runs).
    pub(crate) fn recorded_manifest(&self) -> Option<crate::ports::audit::RecordedManifest> {
        self.inner
            .recorded
            .get_or_init(|| {
                let json = self.encoded_spec().ok()?;
                // A secret value the process knows never reaches a record,
                // even one a manifest holds as literal text.
                let json = match crate::secrets::redact(json.text()) {
                    std::borrow::Cow::Borrowed(_) => json,
                    std::borrow::Cow::Owned(text) => EncodedJson::from_text(text).ok()?,
                };
                Some(crate::ports::audit::RecordedManifest::of(json))
            })
            .clone()
    }

    /// The model its runs call.
    pub fn model(&self) -> &Arc<dyn ChatModel> {
        &self.inner.model
    }

    /// The schema the final answer must follow, if the manifest gives one.
    pub(crate) fn output(&self) -> Option<&OutputSchema> {
        self.inner.output.as_deref()
    }

    /// The guards its runs' calls and answers pass, if the manifest has any.
    pub(crate) fn guards(&self) -> Option<&Guards> {
        self.inner.guards.as_deref()
    }

    /// The model call options every call of its runs carries.
    pub(crate) fn call_options(&self) -> Option<Arc<CallOptions>> {
        self.inner.options.clone()
    }

    /// The model's price, when it is priced and the table knows it.
    pub(crate) fn price(&self) -> Option<&Price> {
        self.inner.price.as_ref()
    }

    /// The model's price id when the model is priced but the price table
    /// does not know it (its runs cost 0 and get a warning).
    pub(crate) fn unpriced_model(&self) -> Option<&str> {
        match self.inner.price {
            Some(_) => None,
            None => self.inner.model.price_id(),
        }
    }

    /// The tools its runs may call.
    pub fn tools(&self) -> &ToolSet {
        &self.inner.tools
    }

    /// The effect class of tool `name` for this agent: the manifest's
    /// `tools_effects` entry when it has one, else what the tool declares;
    /// `None` for a tool the agent does not have.
    pub fn tool_effect(&self, name: &str) -> Option<ToolEffect> {
        let declared = self.inner.tools.effect(name)?;
        Some(
            self.inner
                .spec
                .tools_effects
                .get(name)
                .copied()
                .unwrap_or(declared),
        )
    }

    /// Every tool of the agent with its effect class (see
    /// [`tool_effect`](Self::tool_effect)), in the order the model sees them.
    pub fn tool_effects(&self) -> Vec<(String, ToolEffect)> {
        self.inner
            .tools
            .specs()
            .iter()
            .filter_map(|t| Some((t.name.clone(), self.tool_effect(&t.name)?)))
            .collect()
    }

    /// The same agent on another model and tool set (a fork's: the
    /// recording in front of the live model and tools). Everything else —
    /// manifest, limits, guards, judges — is the agent's.
    pub(crate) fn rewired(&self, model: Arc<dyn ChatModel>, tools: ToolSet) -> Agent {
        let i = &self.inner;
        Agent {
            inner: Arc::new(AgentInner {
                spec: i.spec.clone(),
                name: i.name.clone(),
                model_name: Arc::from(model.name()),
                tool_names: i.tool_names.clone(),
                default_transcript: std::sync::OnceLock::new(),
                encoded_spec: std::sync::OnceLock::new(),
                recorded: std::sync::OnceLock::new(),
                price: i.price,
                output: i.output.clone(),
                guards: i.guards.clone(),
                options: i.options.clone(),
                model,
                tools,
                limits: i.limits.clone(),
                unusable: i.unusable.clone(),
                judges: i.judges.clone(),
            }),
        }
    }

    /// Its limits (manifest over host defaults).
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// Its limits, shared (what a run that keeps them holds).
    pub(crate) fn shared_limits(&self) -> Arc<Limits> {
        self.inner.limits.clone()
    }
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.name())
            .field("model", &self.model().name())
            .finish()
    }
}
