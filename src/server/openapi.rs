//! `GET /openapi.json`: the OpenAPI 3 document, derived by `utoipa` from
//! the handlers' `#[utoipa::path]` attributes and the bodies' `ToSchema`
//! types, so it cannot drift from what the handlers take and answer.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::api;
use super::catalog;
use super::error;
use super::schedules;

#[derive(OpenApi)]
#[openapi(
    info(title = "agentvisor", description = "Submit, watch and steer supervised LLM agent runs."),
    paths(
        super::runs::submit,
        super::listing::list_runs,
        super::runs::get_run,
        super::runs::records,
        super::streams::run_events,
        super::streams::host_events,
        super::control::steer,
        super::control::extend,
        super::control::kill,
        super::control::cancel,
        super::control::approve,
        super::control::deny,
        super::forks::fork_run,
        super::forks::diff_runs,
        super::sessions::create,
        super::sessions::get_session,
        super::sessions::send_message,
        super::sessions::close,
        super::sessions::remove,
        super::runs::agents,
        super::schedules::list,
        super::schedules::run,
        super::schedules::pause,
        super::schedules::resume,
        super::schedules::reload,
        super::healthz,
        super::readyz,
    ),
    components(schemas(
        api::SubmitRun, api::RunView, api::LiveView, api::RunList, api::RunItem,
        api::SteerBody, api::ExtendBody, api::KillBody, api::ApprovalBody, api::Accepted,
        api::ApprovalDecision, api::PendingView, api::ForkBody,
        api::AgentView, api::AgentList, catalog::FailedManifest, api::Health, error::ErrorBody, error::ErrorDetail,
        api::CreateSession, api::MessageBody, api::BusyMode, api::SessionStatus,
        api::SessionView, api::SessionMessageView,
        schedules::ScheduleItem, schedules::ScheduleList, schedules::PauseBody,
        schedules::ScheduleFired, schedules::ReloadView,
    )),
    modifiers(&Bearer),
)]
struct ApiDoc;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI document as JSON text.
pub fn openapi_json() -> String {
    ApiDoc::openapi().to_pretty_json().unwrap_or_default()
}

pub(crate) async fn serve_openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], openapi_json()).into_response()
}
