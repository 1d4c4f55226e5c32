//! Model batteries: the [`ChatModel`] implementations a host can plug in,
//! the layers around them, and the one resolver that turns a manifest's
//! `model:` into a model.
//!
//! - [`scripted`]: plays a manifest's `script`, one entry per model call, so
//!   tests, benches and demos provoke every behaviour (tool loops, hangs,
//!   provider errors, usage) deterministically and without a network.
//! - [`openai`]: Chat Completions, for OpenAI and every compatible server
//!   (llama.cpp, vLLM, Ollama, LM Studio).
//! - [`anthropic`]: the Messages API.
//! - [`retry`]: the one retry layer (jittered backoff, `retry-after`, the
//!   run's deadline, a heartbeat per retry).
//! - [`breaker`]: the circuit breaker per endpoint + model.
//! - [`chaos`]: wraps a model and, at a seeded random rate, makes calls
//!   slow, hang, fail with a 429 or answer with malformed tool arguments
//!   (`agentvisor soak --chaos`).
//!
//! # Model specs
//!
//! `scripted`, `openai:MODEL`, `anthropic:MODEL`, `ollama:MODEL`
//! (OpenAI-compatible at `http://127.0.0.1:11434/v1`), or a tier name
//! (`fast`, `smart`, …) that the host's [`ProviderConfig::tiers`] maps to
//! one of those (default tier: `fast`). A name the host registered with
//! `HostBuilder::model` wins over all of these.
//!
//! The base URL is the manifest's `base_url`, else `OPENAI_BASE_URL` /
//! `ANTHROPIC_BASE_URL`, else the public endpoint, written as the official
//! SDKs write it: an OpenAI base ends in `/v1` (`http://127.0.0.1:8080/v1`;
//! requests go to `{base}/chat/completions`), an Anthropic base is the host,
//! with or without a trailing `/v1` (`http://127.0.0.1:4011` and
//! `http://127.0.0.1:4011/v1` both reach `/v1/messages`). A manifest that
//! names no model runs on the default tier only if something configures it
//! (see [`ResolveError::NoModel`]). The key is read from the
//! variable the manifest's `api_key_env` names (which must then be set),
//! else from `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`; no key is fine (local
//! servers). A key is never printed, logged or put in an error.
//!
//! Every HTTP model is built as `Retrying(CircuitBreaking(provider))` and
//! cached per endpoint + model + key variable, so the agents and runs of a
//! host share one connection pool and one breaker per endpoint.
//!
//! A provider answers one call and nothing more: it must not know about
//! actors, runs' state or budgets. Those live in `crate::actors`, which see
//! providers only through the port.

#[cfg(feature = "anthropic")]
pub mod anthropic;
pub mod breaker;
pub mod chaos;
#[cfg(any(feature = "openai", feature = "anthropic"))]
mod http;
#[cfg(feature = "openai")]
pub mod openai;
pub mod retry;
pub mod scripted;
#[cfg(any(feature = "openai", feature = "anthropic"))]
mod sse;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use dashmap::DashMap;

#[cfg(feature = "anthropic")]
pub use anthropic::{AnthropicConfig, AnthropicModel};
pub use breaker::{Breaker, BreakerPolicy, CircuitBreaking, CircuitState};
#[cfg(any(feature = "openai", feature = "anthropic"))]
pub use http::{Secret, StreamMode};
#[cfg(feature = "openai")]
pub use openai::{OpenAiConfig, OpenAiModel};
pub use retry::{RetryPolicy, Retrying};
pub use scripted::ScriptedModel;

use crate::ports::model::ChatModel;
use crate::spec::AgentSpec;

/// The tier a manifest that names no model (and has no script) runs on.
pub const DEFAULT_TIER: &str = "fast";

/// Where `ollama:MODEL` points.
pub const OLLAMA_BASE_URL: &str = "http://127.0.0.1:11434/v1";

/// The tiers a host knows unless told otherwise: `fast` →
/// `openai:gpt-4o-mini`, `smart` → `openai:gpt-4o`.
pub fn default_tiers() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("fast".to_string(), "openai:gpt-4o-mini".to_string()),
        ("smart".to_string(), "openai:gpt-4o".to_string()),
    ])
}

/// The model a spec names: its `model`, or when that is empty, `scripted`
/// for a spec with a script and the default tier for one without.
pub fn effective_model(spec: &AgentSpec) -> &str {
    match spec.model.trim() {
        "" if spec.script.is_empty() => DEFAULT_TIER,
        "" => "scripted",
        m => m,
    }
}

/// A parsed model spec.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelSpec {
    /// The scripted model (plays the manifest's `script`).
    Scripted,
    /// An OpenAI-compatible server.
    OpenAi(String),
    /// Anthropic.
    Anthropic(String),
    /// Ollama's OpenAI-compatible endpoint.
    Ollama(String),
}

impl ModelSpec {
    /// Parses `scripted` or `PROVIDER:MODEL`; `None` for anything else (a
    /// tier or a registered name).
    pub fn parse(text: &str) -> Option<ModelSpec> {
        let text = text.trim();
        if text == "scripted" {
            return Some(ModelSpec::Scripted);
        }
        let (provider, model) = text.split_once(':')?;
        let model = model.trim();
        if model.is_empty() {
            return None;
        }
        match provider.trim() {
            "openai" => Some(ModelSpec::OpenAi(model.to_string())),
            "anthropic" => Some(ModelSpec::Anthropic(model.to_string())),
            "ollama" => Some(ModelSpec::Ollama(model.to_string())),
            _ => None,
        }
    }
}

/// What [`ResolveError::NoModel`] tells the user to do.
pub const HOW_TO_SET_A_MODEL: &str = "set `model:` in the manifest (e.g. `model: ollama:llama3.2` or `model: openai:gpt-4o-mini`), pass `--model SPEC`, map the `fast` tier with `AGENTVISOR_TIERS=fast=SPEC`, or point `OPENAI_BASE_URL` at an OpenAI-compatible server (with `OPENAI_API_KEY` for the public OpenAI API)";

/// Why a model spec could not be made into a model.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResolveError {
    /// The manifest names no model and nothing configures the default tier
    /// (no `AGENTVISOR_TIERS` mapping, no `OPENAI_BASE_URL` or
    /// `OPENAI_API_KEY`): the run would call the public OpenAI endpoint
    /// without a key, which cannot work.
    #[error("no model configured for agent `{agent}`: {HOW_TO_SET_A_MODEL}")]
    NoModel {
        /// The agent's name.
        agent: String,
    },
    /// A manifest names a tier that only the built-in default maps (to the
    /// public OpenAI API), and nothing configures OpenAI (no
    /// `OPENAI_BASE_URL`, no `OPENAI_API_KEY`, no `base_url`): the run
    /// would call OpenAI without a key, which cannot work.
    #[error("agent `{agent}` names model tier `{tier}`, which nothing configures: by the built-in default it would call `{target}` at the public OpenAI API, without a key. {HOW_TO_SET_A_MODEL}")]
    UnconfiguredTier {
        /// The agent's name.
        agent: String,
        /// The tier.
        tier: String,
        /// What the built-in default maps it to.
        target: String,
    },
    /// A tier maps to something that is neither a model spec nor another
    /// tier (`fast=llama3.2`, without its provider).
    #[error("model tier `{tier}` maps to `{target}`, which is not a model: a tier maps to `scripted`, `openai:MODEL`, `anthropic:MODEL`, `ollama:MODEL` or another tier (fix the mapping, in `AGENTVISOR_TIERS` for the command line)")]
    BadTier {
        /// The tier whose mapping is wrong (the last one followed).
        tier: String,
        /// What it maps to.
        target: String,
    },
    /// Neither a provider spec, a tier nor a registered name.
    #[error("unknown model `{0}`")]
    Unknown(String),
    /// Tiers that map onto each other in a loop.
    #[error("model tier `{0}` maps onto itself")]
    TierLoop(String),
    /// `api_key_env` names a variable that is not set.
    #[error("`api_key_env` names `{0}`, which is not set")]
    MissingKey(String),
    /// The model's provider is compiled out: its cargo feature is off.
    #[error("model `{model}` needs agentvisor built with the `{feature}` feature")]
    FeatureOff {
        /// The model spec, after tiers.
        model: String,
        /// The cargo feature that brings its provider.
        feature: &'static str,
    },
}

/// One tier followed: `tier` maps to `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierStep {
    /// The tier.
    pub tier: String,
    /// What it maps to (a spec, another tier, or a registered name).
    pub to: String,
    /// The mapping is the built-in default (nothing configured it).
    pub built_in: bool,
}

/// Where a manifest's model resolves (see [`ModelResolver::explain`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explained {
    /// What the manifest (or `--model`) names.
    pub named: String,
    /// The tiers followed, in order.
    pub chain: Vec<TierStep>,
    /// The model spec at the end of them.
    pub spec: String,
    /// The base URL calls go to and where it comes from (`None`: not an
    /// HTTP model).
    pub base_url: Option<(String, String)>,
    /// The variable the key is read from, and whether it is set.
    pub key: Option<(String, bool)>,
    /// The tier is only mapped by the built-in default and nothing
    /// configures its provider: a run is refused.
    pub unconfigured: bool,
}

impl std::fmt::Display for Explained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "model:    {}", self.named)?;
        for s in &self.chain {
            let origin = if s.built_in {
                "the built-in default; `AGENTVISOR_TIERS` changes it"
            } else {
                "configured"
            };
            writeln!(f, "tier:     `{}` -> `{}` ({origin})", s.tier, s.to)?;
        }
        writeln!(f, "resolves: {}", self.spec)?;
        if let Some((url, from)) = &self.base_url {
            writeln!(f, "base URL: {url} (from {from})")?;
        }
        if let Some((name, set)) = &self.key {
            writeln!(
                f,
                "key:      {name} ({})",
                if *set { "set" } else { "not set" }
            )?;
        }
        if self.unconfigured {
            writeln!(
                f,
                "refused:  nothing configures this tier, and OpenAI without a key cannot answer. {HOW_TO_SET_A_MODEL}"
            )?;
        }
        Ok(())
    }
}

/// How a host resolves and wraps models. Every field has a default.
#[derive(Clone, Debug)]
pub struct ProviderConfig {
    /// Tier name → model spec (default: [`default_tiers`]).
    pub tiers: BTreeMap<String, String>,
    /// The retry layer's settings.
    pub retry: RetryPolicy,
    /// The circuit breakers' settings.
    pub breaker: BreakerPolicy,
    /// When set, environment lookups (base URLs, keys) read this map
    /// instead of the process environment (embedded hosts, tests).
    pub env: Option<Arc<HashMap<String, String>>>,
    /// When set, every agent runs on this model spec (or tier), whatever
    /// its manifest names (the CLI's `--model`); a manifest's script is
    /// then ignored unless this says `scripted`.
    pub model_override: Option<String>,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig {
            tiers: default_tiers(),
            retry: RetryPolicy::default(),
            breaker: BreakerPolicy::default(),
            env: None,
            model_override: None,
        }
    }
}

impl ProviderConfig {
    fn var(&self, name: &str) -> Option<String> {
        match &self.env {
            Some(map) => map.get(name).cloned(),
            None => std::env::var(name).ok(),
        }
        .filter(|v| !v.trim().is_empty())
    }
}

/// Resolves model specs for one host and caches the HTTP models it builds
/// (see the module doc).
#[derive(Default)]
pub struct ModelResolver {
    config: ProviderConfig,
    cache: DashMap<String, Arc<dyn ChatModel>>,
}

impl std::fmt::Debug for ModelResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelResolver")
            .field("config", &self.config)
            .field("cached", &self.cache.len())
            .finish()
    }
}

impl ModelResolver {
    /// A resolver with these settings. The provider keys its environment
    /// holds are registered as secrets (see [`crate::secrets`]), whether or
    /// not a run uses them: a model or tool that echoes any of them is
    /// redacted.
    pub fn new(config: ProviderConfig) -> Self {
        for name in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"] {
            if let Some(key) = config.var(name) {
                crate::secrets::register_from(name, &key);
            }
        }
        ModelResolver {
            config,
            cache: DashMap::new(),
        }
    }

    /// Its settings.
    pub fn config(&self) -> &ProviderConfig {
        &self.config
    }

    /// Follows tiers from `name` to what they map to (a spec or a
    /// registered name); `name` itself when it is no tier.
    pub fn follow_tiers(&self, name: &str) -> Result<String, ResolveError> {
        let mut current = name.trim().to_string();
        for _ in 0..8 {
            match self.config.tiers.get(&current) {
                Some(next) if ModelSpec::parse(&current).is_none() => {
                    current = next.trim().to_string()
                }
                _ => return Ok(current),
            }
        }
        Err(ResolveError::TierLoop(name.to_string()))
    }

    /// The model spec an agent runs on: the host's override, else what its
    /// manifest names (see [`effective_model`]).
    pub fn model_of<'a>(&'a self, spec: &'a AgentSpec) -> &'a str {
        match &self.config.model_override {
            Some(m) if !m.trim().is_empty() => m.trim(),
            _ => effective_model(spec),
        }
    }

    /// Tier mappings from `NAME=SPEC` pairs separated by commas or
    /// whitespace (`fast=ollama:llama3.2,smart=openai:gpt-4o`), over the
    /// defaults; `Err` names the first pair that is not `NAME=SPEC`.
    pub fn parse_tiers(text: &str) -> Result<BTreeMap<String, String>, String> {
        let mut tiers = default_tiers();
        for pair in text
            .split([',', ' ', '\n'])
            .filter(|p| !p.trim().is_empty())
        {
            match pair.split_once('=') {
                Some((name, spec)) if !name.trim().is_empty() && !spec.trim().is_empty() => {
                    tiers.insert(name.trim().to_string(), spec.trim().to_string());
                }
                _ => return Err(format!("bad tier mapping `{pair}` (use NAME=SPEC)")),
            }
        }
        Ok(tiers)
    }

    /// The tiers followed from `name`, each with what it maps to and
    /// whether that is the built-in default mapping; the last `to` is the
    /// spec (or registered name) the chain ends at.
    pub fn tier_chain(&self, name: &str) -> Result<Vec<TierStep>, ResolveError> {
        let defaults = default_tiers();
        let mut chain = Vec::new();
        let mut current = name.trim().to_string();
        for _ in 0..8 {
            match self.config.tiers.get(&current) {
                Some(next) if ModelSpec::parse(&current).is_none() => {
                    let next = next.trim().to_string();
                    chain.push(TierStep {
                        built_in: defaults.get(&current) == Some(&next),
                        tier: std::mem::replace(&mut current, next.clone()),
                        to: next,
                    });
                }
                _ => return Ok(chain),
            }
        }
        Err(ResolveError::TierLoop(name.to_string()))
    }

    /// When `named` is a tier that only built-in default mappings take to
    /// the public OpenAI API and nothing configures OpenAI for `spec` (no
    /// `base_url`, no `OPENAI_BASE_URL`, no `OPENAI_API_KEY`): the spec it
    /// would call.
    fn unconfigured_tier(&self, named: &str, spec: &AgentSpec) -> Option<String> {
        let chain = self.tier_chain(named).ok()?;
        let last = chain.last()?;
        let c = &self.config;
        let unconfigured = chain.iter().all(|s| s.built_in)
            && matches!(ModelSpec::parse(&last.to), Some(ModelSpec::OpenAi(_)))
            && spec.base_url.is_none()
            && spec.api_key_env.is_none()
            && c.var("OPENAI_BASE_URL").is_none()
            && c.var("OPENAI_API_KEY").is_none();
        unconfigured.then(|| last.to.clone())
    }

    /// Where `spec`'s model resolves, said for a person (`agentvisor run
    /// --explain`): the tiers followed (and whether each mapping is the
    /// built-in default), the provider, its base URL and its key's
    /// variable (whether it is set, never its value). A model registered
    /// with the host is not known here.
    pub fn explain(&self, spec: &AgentSpec) -> Result<Explained, ResolveError> {
        let named = self.model_of(spec).to_string();
        let chain = self.tier_chain(&named)?;
        let target = chain.last().map_or(named.clone(), |s| s.to.clone());
        let parsed = ModelSpec::parse(&target);
        if parsed.is_none() {
            if let Some(last) = chain.last() {
                return Err(ResolveError::BadTier {
                    tier: last.tier.clone(),
                    target,
                });
            }
        }
        let (base_var, key_var, default_base) = match &parsed {
            Some(ModelSpec::OpenAi(_)) => (
                Some("OPENAI_BASE_URL"),
                Some("OPENAI_API_KEY"),
                Some("https://api.openai.com/v1"),
            ),
            Some(ModelSpec::Anthropic(_)) => (
                Some("ANTHROPIC_BASE_URL"),
                Some("ANTHROPIC_API_KEY"),
                Some("https://api.anthropic.com"),
            ),
            Some(ModelSpec::Ollama(_)) => (None, None, Some(OLLAMA_BASE_URL)),
            _ => (None, None, None),
        };
        let base_url = default_base.map(|d| {
            match (&spec.base_url, base_var.and_then(|v| self.config.var(v))) {
                (Some(b), _) => (b.clone(), "the manifest's `base_url`".to_string()),
                (None, Some(b)) => (b, format!("`{}`", base_var.unwrap_or_default())),
                (None, None) => (d.to_string(), "the default".to_string()),
            }
        });
        let key = match (&spec.api_key_env, key_var) {
            (Some(name), _) => Some(name.clone()),
            (None, Some(name)) if base_url.is_some() => Some(name.to_string()),
            _ => None,
        }
        .map(|name| {
            let set = self.config.var(&name).is_some();
            (name, set)
        });
        Ok(Explained {
            named,
            chain,
            spec: target,
            base_url,
            key,
            unconfigured: self.unconfigured_tier(self.model_of(spec), spec).is_some(),
        })
    }

    /// What a caller may name, for error messages.
    pub fn known(&self) -> Vec<String> {
        let mut known = vec![
            "scripted".to_string(),
            "openai:MODEL".to_string(),
            "anthropic:MODEL".to_string(),
            "ollama:MODEL".to_string(),
        ];
        known.extend(self.config.tiers.keys().cloned());
        known
    }

    /// The model for `spec` (`model` already followed through the tiers
    /// by the caller or not: it is followed again here).
    pub fn resolve(&self, spec: &AgentSpec) -> Result<Arc<dyn ChatModel>, ResolveError> {
        let named = self.model_of(spec);
        if let Some(target) = self.unconfigured_tier(named, spec) {
            if named == DEFAULT_TIER && spec.model.trim().is_empty() {
                return Err(ResolveError::NoModel {
                    agent: spec.name.clone(),
                });
            }
            return Err(ResolveError::UnconfiguredTier {
                agent: spec.name.clone(),
                tier: named.to_string(),
                target,
            });
        }
        let chain = self.tier_chain(named)?;
        let target = chain.last().map_or(named.to_string(), |s| s.to.clone());
        let parsed = ModelSpec::parse(&target).ok_or_else(|| match chain.last() {
            Some(last) => ResolveError::BadTier {
                tier: last.tier.clone(),
                target: target.clone(),
            },
            None => ResolveError::Unknown(named.to_string()),
        })?;
        match parsed {
            ModelSpec::Scripted => Ok(Arc::new(ScriptedModel::new(spec.script.clone()))),
            #[cfg(not(feature = "openai"))]
            ModelSpec::OpenAi(_) | ModelSpec::Ollama(_) => Err(ResolveError::FeatureOff {
                model: target,
                feature: "openai",
            }),
            #[cfg(not(feature = "anthropic"))]
            ModelSpec::Anthropic(_) => Err(ResolveError::FeatureOff {
                model: target,
                feature: "anthropic",
            }),
            #[cfg(any(feature = "openai", feature = "anthropic"))]
            http => self.resolve_http(spec, http),
        }
    }

    /// An HTTP provider's model, wrapped and cached (see the module doc).
    #[cfg(any(feature = "openai", feature = "anthropic"))]
    fn resolve_http(
        &self,
        spec: &AgentSpec,
        parsed: ModelSpec,
    ) -> Result<Arc<dyn ChatModel>, ResolveError> {
        let c = &self.config;
        let (provider, model, default_base, base_var, key_var) = match &parsed {
            #[cfg(feature = "openai")]
            ModelSpec::OpenAi(m) => (
                "openai",
                m,
                openai::DEFAULT_BASE_URL,
                Some("OPENAI_BASE_URL"),
                Some("OPENAI_API_KEY"),
            ),
            #[cfg(feature = "anthropic")]
            ModelSpec::Anthropic(m) => (
                "anthropic",
                m,
                anthropic::DEFAULT_BASE_URL,
                Some("ANTHROPIC_BASE_URL"),
                Some("ANTHROPIC_API_KEY"),
            ),
            #[cfg(feature = "openai")]
            ModelSpec::Ollama(m) => ("ollama", m, OLLAMA_BASE_URL, None, None),
            // `resolve` answers for the scripted model and the compiled-out.
            _ => return Err(ResolveError::Unknown(spec.model.clone())),
        };
        let base_url = spec
            .base_url
            .clone()
            .or_else(|| base_var.and_then(|v| c.var(v)))
            .unwrap_or_else(|| default_base.to_string());
        let base_url = http::trim_base(&base_url);
        let key_name = match &spec.api_key_env {
            Some(name) => Some(name.as_str()),
            None => key_var,
        };
        let api_key = match key_name {
            Some(name) => match c.var(name) {
                Some(v) => Secret::new(v),
                None if spec.api_key_env.is_some() => {
                    return Err(ResolveError::MissingKey(name.to_string()))
                }
                None => None,
            },
            None => None,
        };
        // The cache key names the key's variable, never the key.
        let cache_key = format!("{provider} {model} {base_url} {}", key_name.unwrap_or("-"));
        if let Some(m) = self.cache.get(&cache_key) {
            return Ok(m.clone());
        }
        let name = format!("{provider}:{model}");
        let inner: Arc<dyn ChatModel> = match parsed {
            #[cfg(feature = "anthropic")]
            ModelSpec::Anthropic(_) => {
                let mut cfg = AnthropicConfig::new(model.clone(), base_url);
                cfg.api_key = api_key;
                Arc::new(AnthropicModel::new(cfg))
            }
            #[cfg(feature = "openai")]
            _ => {
                let mut cfg = OpenAiConfig::new(model.clone(), base_url);
                cfg.name = name.clone();
                cfg.api_key = api_key;
                cfg.priced = provider != "ollama";
                Arc::new(OpenAiModel::new(cfg))
            }
            #[cfg(not(feature = "openai"))]
            _ => return Err(ResolveError::Unknown(spec.model.clone())),
        };
        let breaker = Arc::new(Breaker::new(name, c.breaker));
        let wrapped: Arc<dyn ChatModel> = Arc::new(Retrying::new(
            Arc::new(CircuitBreaking::new(inner, breaker)),
            c.retry,
        ));
        Ok(self.cache.entry(cache_key).or_insert(wrapped).clone())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!(ModelSpec::parse("scripted"), Some(ModelSpec::Scripted));
        assert_eq!(
            ModelSpec::parse("openai:gpt-4o-mini"),
            Some(ModelSpec::OpenAi("gpt-4o-mini".into()))
        );
        assert_eq!(
            ModelSpec::parse("ollama:llama3.2:3b"),
            Some(ModelSpec::Ollama("llama3.2:3b".into()))
        );
        assert_eq!(ModelSpec::parse("openai:"), None);
        assert_eq!(ModelSpec::parse("fast"), None);
        assert_eq!(ModelSpec::parse("gemini:x"), None);
    }

    fn resolver(env: &[(&str, &str)]) -> ModelResolver {
        let mut c = ProviderConfig {
            env: Some(Arc::new(
                env.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )),
            ..ProviderConfig::default()
        };
        c.tiers.insert("cheap".into(), "fast".into());
        c.tiers.insert("loop".into(), "loop2".into());
        c.tiers.insert("loop2".into(), "loop".into());
        ModelResolver::new(c)
    }

    #[cfg(feature = "openai")]
    #[test]
    fn tiers_resolve_and_models_are_shared() {
        let r = resolver(&[]);
        let mut spec = AgentSpec::new("a", "cheap");
        let m = r.resolve(&spec).unwrap();
        assert_eq!(m.name(), "openai:gpt-4o-mini");
        spec.model = "openai:gpt-4o-mini".into();
        assert!(Arc::ptr_eq(&m, &r.resolve(&spec).unwrap()));
        spec.model = "loop".into();
        assert!(matches!(r.resolve(&spec), Err(ResolveError::TierLoop(_))));
        spec.model = "nope".into();
        assert!(matches!(r.resolve(&spec), Err(ResolveError::Unknown(_))));
        spec.model = "ollama:qwen2.5".into();
        let o = r.resolve(&spec).unwrap();
        assert_eq!((o.name(), o.price_id()), ("ollama:qwen2.5", None));
    }

    #[cfg(feature = "openai")]
    #[test]
    fn a_tier_nothing_configures_is_refused_and_a_bad_mapping_names_itself() {
        let r = resolver(&[]);
        // Only the built-in default maps `fast`, to OpenAI, with no key.
        let e = r.resolve(&AgentSpec::new("a", "fast")).err().unwrap();
        assert!(
            matches!(&e, ResolveError::UnconfiguredTier { tier, target, .. } if tier == "fast" && target == "openai:gpt-4o-mini"),
            "{e:?}"
        );
        let x = r.explain(&AgentSpec::new("a", "smart")).unwrap();
        assert!(x.unconfigured && x.chain[0].built_in, "{x:?}");
        assert_eq!(x.spec, "openai:gpt-4o");
        let text = x.to_string();
        assert!(
            text.contains("`smart` -> `openai:gpt-4o` (the built-in default"),
            "{text}"
        );
        assert!(text.contains("https://api.openai.com/v1"), "{text}");
        assert!(text.contains("OPENAI_API_KEY (not set)"), "{text}");
        // A key, or a base URL, configures it.
        assert!(resolver(&[("OPENAI_API_KEY", "sk-12345678")])
            .resolve(&AgentSpec::new("a", "fast"))
            .is_ok());
        let x = resolver(&[("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")])
            .explain(&AgentSpec::new("a", "fast"))
            .unwrap();
        assert!(!x.unconfigured);
        assert_eq!(
            x.base_url,
            Some(("http://127.0.0.1:9/v1".into(), "`OPENAI_BASE_URL`".into()))
        );
        // A mapping to no model names the tier and what it maps to.
        let mut c = ProviderConfig {
            env: Some(Arc::default()),
            ..ProviderConfig::default()
        };
        c.tiers.insert("fast".into(), "llama3.2".into());
        let r = ModelResolver::new(c);
        for e in [
            r.resolve(&AgentSpec::new("a", "fast")).err().unwrap(),
            r.explain(&AgentSpec::new("a", "fast")).err().unwrap(),
        ] {
            assert_eq!(
                e,
                ResolveError::BadTier {
                    tier: "fast".into(),
                    target: "llama3.2".into()
                }
            );
            assert!(e
                .to_string()
                .starts_with("model tier `fast` maps to `llama3.2`, which is not a model"));
        }
    }

    #[cfg(not(feature = "openai"))]
    #[test]
    fn a_compiled_out_provider_names_its_feature() {
        let r = resolver(&[]);
        for model in ["cheap", "ollama:qwen2.5"] {
            let e = r
                .resolve(&AgentSpec::new("a", model))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("the `openai` feature"), "{e}");
        }
    }

    #[cfg(not(feature = "anthropic"))]
    #[test]
    fn a_compiled_out_anthropic_names_its_feature() {
        let e = resolver(&[])
            .resolve(&AgentSpec::new("a", "anthropic:claude"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(
            e,
            "model `anthropic:claude` needs agentvisor built with the `anthropic` feature"
        );
    }

    #[cfg(feature = "openai")]
    #[test]
    fn a_named_key_variable_must_be_set() {
        let r = resolver(&[("MY_KEY", "k-1")]);
        let mut spec = AgentSpec::new("a", "openai:gpt-4o");
        spec.api_key_env = Some("MY_KEY".into());
        assert!(r.resolve(&spec).is_ok());
        spec.api_key_env = Some("OTHER_KEY".into());
        let e = r
            .resolve(&spec)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("OTHER_KEY"), "{e}");
        spec.api_key_env = None;
        assert!(r.resolve(&spec).is_ok(), "no key is fine by default");
    }

    /// A model whose every capability is set one way or the other.
    struct Probe {
        on: bool,
    }

    #[async_trait::async_trait]
    impl ChatModel for Probe {
        fn name(&self) -> &str {
            "probe"
        }

        async fn complete(
            &self,
            _: crate::ports::model::ChatRequest,
        ) -> Result<crate::ports::model::ChatResponse, crate::ports::model::ModelError> {
            Ok(Default::default())
        }

        fn admit(&self) -> Result<(), crate::ports::model::ModelError> {
            if self.on {
                Ok(())
            } else {
                Err(crate::ports::model::ModelError::Quota("probe".into()))
            }
        }

        fn price_id(&self) -> Option<&str> {
            self.on.then_some("probe-1")
        }

        fn answers_at_once(&self) -> bool {
            self.on
        }

        fn reports_retries(&self) -> bool {
            self.on
        }

        fn streams(&self) -> bool {
            self.on
        }

        fn needs_input(&self) -> bool {
            self.on
        }
    }

    /// Every wrapper of a model, around `inner`, with its name.
    fn every_wrapper(inner: Arc<dyn ChatModel>) -> Vec<(&'static str, Arc<dyn ChatModel>)> {
        let breaker = Arc::new(Breaker::new("probe", BreakerPolicy::default()));
        let chaos = chaos::ChaosConfig {
            rate: 0.0,
            seed: 1,
            slow: std::time::Duration::ZERO,
        };
        vec![
            (
                "retry",
                Arc::new(Retrying::new(inner.clone(), RetryPolicy::default())),
            ),
            (
                "breaker",
                Arc::new(CircuitBreaking::new(inner.clone(), breaker)),
            ),
            (
                "chaos",
                Arc::new(chaos::ChaosModel::new(inner.clone(), chaos).unwrap()),
            ),
            (
                "session",
                Arc::new(crate::host::sessions::SessionModel::new(inner.clone(), 0)),
            ),
            ("fork", crate::fork::fork_model(Vec::new(), inner)),
        ]
    }

    #[test]
    fn every_wrapper_forwards_every_capability() {
        for on in [true, false] {
            let inner: Arc<dyn ChatModel> = Arc::new(Probe { on });
            for (wrapper, m) in every_wrapper(inner.clone()) {
                assert_eq!(m.admit().is_ok(), on, "{wrapper}: admit");
                assert_eq!(m.price_id(), inner.price_id(), "{wrapper}: price_id");
                assert_eq!(m.answers_at_once(), on, "{wrapper}: answers_at_once");
                assert_eq!(m.streams(), on, "{wrapper}: streams");
                assert_eq!(m.needs_input(), on, "{wrapper}: needs_input");
                // The retry layer reports its retries whatever it wraps.
                let retries = on || wrapper == "retry";
                assert_eq!(m.reports_retries(), retries, "{wrapper}: reports_retries");
                let name = if wrapper == "chaos" {
                    "chaos(probe)"
                } else {
                    "probe"
                };
                assert_eq!(m.name(), name, "{wrapper}: name");
            }
        }
    }
}
