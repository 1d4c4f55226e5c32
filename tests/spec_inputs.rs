//! `Invocation.inputs` fill the manifest's `{{inputs.NAME}}` placeholders
//! in `prompt` and `system` (strings as is, other JSON compact); a missing
//! input is refused at submit, before any run.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use agentvisor::ports::model::Role;
use agentvisor::{Invocation, RunStatus, SubmitError};
use serde_json::json;
use support::RecordingModel;

const TEMPLATED: &str = r#"
name: weather
model: recorded
system: "You forecast for {{inputs.city}}."
prompt: "Forecast {{ inputs.days }} days for {{inputs.city}} with {{inputs.opts}}."
script:
  - { text: "sunny" }
"#;

#[tokio::test(start_paused = true)]
async fn inputs_fill_the_prompt_and_the_system_prompt() {
    let spec = support::spec(TEMPLATED);
    let model = RecordingModel::new(&spec);
    let (host, _store) =
        support::host_from(support::builder().model("recorded", model.clone())).await;
    for (city, days) in [("Oslo", 3), ("Lima", 5)] {
        let mut inv = Invocation::default();
        inv.inputs.insert("city".into(), json!(city));
        inv.inputs.insert("days".into(), json!(days));
        inv.inputs
            .insert("opts".into(), json!({"units": "C", "hourly": false}));
        let r = host.execute(&spec, inv).await.unwrap();
        assert_eq!(r.status, RunStatus::Ok, "{r:?}");
    }
    for (i, (city, days)) in [("Oslo", 3), ("Lima", 5)].into_iter().enumerate() {
        let request = model.request(i);
        let system = request.iter().find(|m| m.role == Role::System).unwrap();
        assert_eq!(system.content, format!("You forecast for {city}."));
        let user = request.iter().find(|m| m.role == Role::User).unwrap();
        assert_eq!(
            user.content,
            format!("Forecast {days} days for {city} with {{\"hourly\":false,\"units\":\"C\"}}.")
        );
    }
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_missing_input_is_refused_before_the_run() {
    let spec = support::spec(TEMPLATED);
    let model = RecordingModel::new(&spec);
    let (host, _store) =
        support::host_from(support::builder().model("recorded", model.clone())).await;
    let mut inv = Invocation::default();
    inv.inputs.insert("city".into(), json!("Oslo"));
    let err = host.submit(&spec, inv.clone()).await.err().unwrap();
    assert!(
        matches!(err, SubmitError::MissingInput(ref m) if m.name == "days"),
        "{err}"
    );
    assert!(err.to_string().contains("{{inputs.days}}"), "{err}");
    let err = host.submit_streaming(&spec, inv).await.err().unwrap();
    assert!(matches!(err, SubmitError::MissingInput(_)));
    assert_eq!(model.calls(), 0);
    assert_eq!(host.live_runs(), 0);
    host.shutdown().await;
}
