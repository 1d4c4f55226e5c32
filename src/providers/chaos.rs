//! The chaos model: a [`ChatModel`] wrapper that, per model call and with a
//! given probability, injects one fault a real provider shows, so a soak
//! (`agentvisor soak --chaos RATE`) proves the runtime survives them:
//!
//! - **slow**: the call first waits [`ChaosConfig::slow`] (keep it well under
//!   the run's stall timeout), then answers normally;
//! - **hang**: the call never answers; the critic must kill the run
//!   `stalled`;
//! - **rate limited**: the call fails with [`ModelError::RateLimited`] (a
//!   429); without a retry layer the run ends `error`/`rate_limited`;
//! - **malformed tool call**: the call answers with one tool call whose
//!   arguments are not JSON; the run gets a tool error and carries on.
//!
//! Each fault is equally likely once a call is picked.
//!
//! # Guarantees
//!
//! - **Reproducible.** Draws come from a seeded splitmix64 sequence (a
//!   shared atomic counter, no lock): the same seed gives the same sequence
//!   of decisions, so the same number of faults of each kind for the same
//!   number of calls. Which run gets which draw depends on scheduling.
//! - **Stateless per run.** A malformed answer takes the place of the inner
//!   model's answer without consuming it: its call id starts with
//!   [`MALFORMED_ID_PREFIX`], and the next call of the run is passed to the
//!   inner model with its `call_index` lowered by the malformed answers
//!   already in the transcript. A scripted run therefore still plays its
//!   whole script after a malformed call. Each malformed argument text is
//!   different, so repeated faults never look like a runaway loop.
//! - **Counted.** [`ChaosModel::counts`] says how many calls were made and
//!   how many faults of each kind were injected, which is what explains a
//!   soak's non-`ok` statuses.
//! - **Cancel-safe** like the model it wraps: `slow` is a tokio sleep and
//!   `hang` a pending future.
//!
//! This module knows nothing about actors, runs or retries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::ports::model::{
    ChatModel, ChatRequest, ChatResponse, Message, ModelError, ModelWrapper, Role, ToolCallRequest,
};

/// The id prefix of an injected malformed tool call.
pub const MALFORMED_ID_PREFIX: &str = "chaos_";

/// The splitmix64 increment (the golden ratio in 64 bits).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// How much chaos, and of what.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChaosConfig {
    /// The probability that a model call gets a fault, in `0..=1`.
    pub rate: f64,
    /// The seed of the decision sequence.
    pub seed: u64,
    /// How long a slow call waits before it answers.
    pub slow: Duration,
}

/// A fault the chaos model injects into one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// Wait [`ChaosConfig::slow`], then answer.
    Slow,
    /// Never answer.
    Hang,
    /// Fail with a 429.
    RateLimited,
    /// Answer with a tool call whose arguments are not JSON.
    MalformedToolCall,
}

impl Fault {
    /// Every fault, in the order a draw picks them.
    pub const ALL: [Fault; 4] = [
        Fault::Slow,
        Fault::Hang,
        Fault::RateLimited,
        Fault::MalformedToolCall,
    ];
}

/// What a chaos model has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChaosCounts {
    /// Model calls made.
    pub calls: u64,
    /// Calls that waited before answering.
    pub slow: u64,
    /// Calls that never answered.
    pub hang: u64,
    /// Calls that failed with a 429.
    pub rate_limited: u64,
    /// Calls answered with a malformed tool call.
    pub malformed: u64,
}

impl ChaosCounts {
    /// Faults of every kind.
    pub fn faults(&self) -> u64 {
        self.slow + self.hang + self.rate_limited + self.malformed
    }
}

/// Why a chaos model could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ChaosError {
    /// The rate is not a probability.
    #[error("the chaos rate must be a number from 0 to 1, not {0}")]
    Rate(f64),
}

/// A [`ChatModel`] that injects faults into another (see the module doc).
pub struct ChaosModel {
    inner: Arc<dyn ChatModel>,
    name: String,
    rate: f64,
    slow: Duration,
    /// The splitmix64 state.
    state: AtomicU64,
    calls: AtomicU64,
    injected: [AtomicU64; 4],
}

impl std::fmt::Debug for ChaosModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChaosModel")
            .field("name", &self.name)
            .field("rate", &self.rate)
            .field("slow", &self.slow)
            .field("counts", &self.counts())
            .finish_non_exhaustive()
    }
}

impl ChaosModel {
    /// Wraps `inner`. Refuses a rate outside `0..=1` (or not a number).
    pub fn new(inner: Arc<dyn ChatModel>, config: ChaosConfig) -> Result<Self, ChaosError> {
        if !(0.0..=1.0).contains(&config.rate) {
            return Err(ChaosError::Rate(config.rate));
        }
        Ok(ChaosModel {
            name: format!("chaos({})", inner.name()),
            inner,
            rate: config.rate,
            slow: config.slow,
            state: AtomicU64::new(config.seed),
            calls: AtomicU64::new(0),
            injected: Default::default(),
        })
    }

    /// Calls made and faults injected so far.
    pub fn counts(&self) -> ChaosCounts {
        let n = |f: Fault| self.injected[f as usize].load(Ordering::Relaxed);
        ChaosCounts {
            calls: self.calls.load(Ordering::Relaxed),
            slow: n(Fault::Slow),
            hang: n(Fault::Hang),
            rate_limited: n(Fault::RateLimited),
            malformed: n(Fault::MalformedToolCall),
        }
    }

    /// The next number of the splitmix64 sequence.
    fn next(&self) -> u64 {
        let mut z = self
            .state
            .fetch_add(GOLDEN, Ordering::Relaxed)
            .wrapping_add(GOLDEN);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Decides the fate of one call (and counts it).
    fn draw(&self) -> Option<Fault> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        // The top 53 bits as a uniform number in [0, 1).
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        if u >= self.rate {
            return None;
        }
        let fault = Fault::ALL[(self.next() >> 62) as usize];
        self.injected[fault as usize].fetch_add(1, Ordering::Relaxed);
        Some(fault)
    }

    /// A tool call whose arguments are cut off mid-object, naming the
    /// request's first tool.
    fn malformed(&self, request: &ChatRequest) -> ChatResponse {
        let nonce = self.next() % 1_000_000;
        ChatResponse {
            text: String::new(),
            tool_calls: vec![ToolCallRequest {
                id: format!("{MALFORMED_ID_PREFIX}{}_{nonce}", request.call_index).into(),
                name: request
                    .tools
                    .first()
                    .map_or_else(|| "unknown".into(), |t| t.name.as_str().into()),
                arguments: format!("{{\"chaos\": {nonce}, \"a\":").into(),
            }],
            usage: Default::default(),
            finish_reason: Some("tool_calls".into()),
        }
    }
}

/// Malformed answers this wrapper already gave in a transcript.
fn malformed_answers(messages: &[Message]) -> u32 {
    messages
        .iter()
        .filter(|m| {
            m.role == Role::Assistant
                && m.tool_calls
                    .iter()
                    .any(|c| c.id.starts_with(MALFORMED_ID_PREFIX))
        })
        .count() as u32
}

/// A fault-injecting wrapper stays transparent: every capability is the
/// wrapped model's; only its name says chaos.
#[async_trait]
impl ModelWrapper for ChaosModel {
    fn inner(&self) -> &dyn ChatModel {
        &*self.inner
    }

    fn name(&self) -> &str {
        &self.name
    }

    async fn complete(&self, mut request: ChatRequest) -> Result<ChatResponse, ModelError> {
        match self.draw() {
            None => {}
            Some(Fault::Slow) => tokio::time::sleep(self.slow).await,
            Some(Fault::Hang) => return std::future::pending().await,
            Some(Fault::RateLimited) => return Err(ModelError::RateLimited { retry_after: None }),
            Some(Fault::MalformedToolCall) => return Ok(self.malformed(&request)),
        }
        let skipped = malformed_answers(&request.messages);
        request.call_index = request.call_index.saturating_sub(skipped);
        self.inner.complete(request).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::ports::model::ToolSpec;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// Answers with the call index it was given, and remembers it.
    #[derive(Default)]
    struct Echo {
        seen: Mutex<Vec<u32>>,
    }

    #[async_trait]
    impl ChatModel for Echo {
        fn name(&self) -> &str {
            "echo"
        }

        async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
            self.seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(request.call_index);
            Ok(ChatResponse {
                text: request.call_index.to_string(),
                ..Default::default()
            })
        }
    }

    fn chaos(rate: f64, seed: u64) -> Result<ChaosModel, ChaosError> {
        ChaosModel::new(
            Arc::new(Echo::default()),
            ChaosConfig {
                rate,
                seed,
                slow: Duration::from_millis(100),
            },
        )
    }

    fn request(messages: Vec<Message>, call_index: u32) -> ChatRequest {
        let tools: Arc<[ToolSpec]> = Arc::from(vec![ToolSpec {
            name: "add".into(),
            description: String::new(),
            parameters: serde_json::json!({"type": "object"}),
        }]);
        ChatRequest::new(Arc::new(messages), tools, call_index)
    }

    #[test]
    fn rates_outside_zero_to_one_are_refused() {
        for bad in [-0.1, 1.01, 2.0, f64::NAN, f64::INFINITY] {
            assert!(chaos(bad, 1).is_err(), "{bad}");
        }
        for good in [0.0, 0.5, 1.0] {
            assert!(chaos(good, 1).is_ok(), "{good}");
        }
    }

    #[test]
    fn injection_rate_and_kinds_follow_the_rate() -> TestResult {
        let n = 200_000u64;
        let model = chaos(0.2, 42)?;
        for _ in 0..n {
            model.draw();
        }
        let c = model.counts();
        assert_eq!(c.calls, n);
        // 0.2 of 200 000 = 40 000, sd ≈ 179: allow 5 sd.
        let faults = c.faults() as f64;
        assert!((faults - 40_000.0).abs() < 900.0, "{c:?}");
        // Each kind a quarter of the faults (sd ≈ 87): allow 5 sd.
        for kind in [c.slow, c.hang, c.rate_limited, c.malformed] {
            assert!((kind as f64 - faults / 4.0).abs() < 450.0, "{c:?}");
        }
        Ok(())
    }

    #[test]
    fn the_same_seed_gives_the_same_decisions() -> TestResult {
        let (a, b, c) = (chaos(0.3, 7)?, chaos(0.3, 7)?, chaos(0.3, 8)?);
        let run = |m: &ChaosModel| (0..1000).map(|_| m.draw()).collect::<Vec<_>>();
        let (ra, rb, rc) = (run(&a), run(&b), run(&c));
        assert_eq!(ra, rb);
        assert_ne!(ra, rc);
        assert_eq!(a.counts(), b.counts());
        Ok(())
    }

    #[test]
    fn rate_zero_never_and_rate_one_always_injects() -> TestResult {
        let (never, always) = (chaos(0.0, 1)?, chaos(1.0, 1)?);
        for _ in 0..10_000 {
            assert_eq!(never.draw(), None);
            assert!(always.draw().is_some());
        }
        Ok(())
    }

    #[tokio::test]
    async fn malformed_answers_are_not_json_and_do_not_consume_the_script() -> TestResult {
        let echo = Arc::new(Echo::default());
        let model = ChaosModel::new(
            echo.clone(),
            ChaosConfig {
                rate: 1.0,
                seed: 3,
                slow: Duration::ZERO,
            },
        )?;
        let bad = model.malformed(&request(Vec::new(), 0));
        let call = &bad.tool_calls[0];
        assert_eq!(&*call.name, "add");
        assert!(call.id.starts_with(MALFORMED_ID_PREFIX));
        assert!(serde_json::from_str::<serde_json::Value>(&call.arguments).is_err());
        let again = model.malformed(&request(Vec::new(), 0));
        assert_ne!(again.tool_calls[0].arguments, call.arguments);

        // Two malformed turns in the transcript: call 2 reaches the inner
        // model as call 0.
        let pass = ChaosModel::new(
            echo.clone(),
            ChaosConfig {
                rate: 0.0,
                seed: 3,
                slow: Duration::ZERO,
            },
        )?;
        let turn = |r: ChatResponse| Message {
            role: Role::Assistant,
            content: r.text,
            tool_calls: r.tool_calls,
            tool_call_id: None,
            attachments: Vec::new(),
        };
        let transcript = vec![
            Message::text(Role::User, "hi"),
            turn(bad),
            Message::text(Role::Tool, "error: bad arguments"),
            turn(again),
        ];
        assert_eq!(
            ChatModel::complete(&pass, request(transcript, 2))
                .await?
                .text,
            "0"
        );
        assert_eq!(
            ChatModel::complete(&pass, request(Vec::new(), 1))
                .await?
                .text,
            "1"
        );
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn faults_behave_as_named() -> TestResult {
        // Seeded so the first draws cover every kind; find one of each.
        let model = chaos(1.0, 11)?;
        let mut seen = std::collections::HashSet::new();
        for i in 0..64 {
            let before = model.counts();
            let started = tokio::time::Instant::now();
            let answer = tokio::time::timeout(
                Duration::from_secs(3600),
                ChatModel::complete(&model, request(Vec::new(), i)),
            )
            .await;
            let after = model.counts();
            let fault = if after.hang > before.hang {
                assert!(answer.is_err(), "a hang answered");
                Fault::Hang
            } else if after.slow > before.slow {
                assert!(started.elapsed() >= Duration::from_millis(100));
                assert_eq!(answer?.as_ref().map(|r| r.text.clone()), Ok(i.to_string()));
                Fault::Slow
            } else if after.rate_limited > before.rate_limited {
                assert_eq!(answer?, Err(ModelError::RateLimited { retry_after: None }));
                Fault::RateLimited
            } else {
                let r = answer??;
                assert!(r.tool_calls[0].id.starts_with(MALFORMED_ID_PREFIX));
                Fault::MalformedToolCall
            };
            seen.insert(fault);
        }
        assert_eq!(seen.len(), 4, "{seen:?}");
        assert_eq!(model.counts().calls, 64);
        assert_eq!(ChatModel::name(&model), "chaos(echo)");
        Ok(())
    }
}
