//! OpenTelemetry traces (the `otel` feature): a run's spans, exported over
//! OTLP/HTTP (protobuf) to a collector, configured by the standard `OTEL_*`
//! environment variables.
//!
#![doc = include_str!("../../docs/otel.md")]

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing::Subscriber;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The service name when `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`
/// name none.
pub const DEFAULT_SERVICE_NAME: &str = "agentvisor";

/// How long one export may take when `OTEL_EXPORTER_OTLP_TIMEOUT` says
/// nothing (the specification's default).
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why traces could not be set up or flushed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OtelError {
    /// An `OTEL_*` variable has a value this exporter cannot follow.
    #[error("{var}: {message}")]
    Config {
        /// The variable.
        var: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The exporter could not be built (a bad endpoint URL, no HTTP client).
    #[error("the OTLP exporter cannot be built: {0}")]
    Exporter(String),
    /// Buffered spans could not be exported at shutdown.
    #[error("traces were not all exported: {0}")]
    Shutdown(String),
}

/// An OTLP trace pipeline: a tracer provider with a batch exporter. Make
/// its [`layer`](Traces::layer) part of the process's `tracing`
/// subscriber; [`shutdown`](Traces::shutdown) (or dropping it) exports what
/// is still buffered.
#[derive(Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    shut: bool,
}

impl Traces {
    /// A pipeline as the `OTEL_*` variables describe it (see the module
    /// docs), or `None` when they configure no trace exporter.
    pub fn from_env() -> Result<Option<Traces>, OtelError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// A pipeline exporting to `endpoint`, the full OTLP/HTTP traces URL
    /// (`http://collector:4318/v1/traces`); the other `OTEL_*` variables
    /// still apply.
    pub fn to_endpoint(endpoint: &str) -> Result<Traces, OtelError> {
        let env = |k: &str| std::env::var(k).ok();
        Self::build(Some(endpoint), &env)
    }

    fn from_lookup(env: impl Fn(&str) -> Option<String>) -> Result<Option<Traces>, OtelError> {
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match env("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
            None | Some("") | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(OtelError::Config {
                    var: "OTEL_TRACES_EXPORTER",
                    message: format!("`{other}` is not supported (only `otlp` and `none`)"),
                })
            }
        }
        let named = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        if named("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
            && named("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
        {
            return Ok(None);
        }
        // The exporter reads the endpoint variables itself.
        Self::build(None, &env).map(Some)
    }

    fn build(
        endpoint: Option<&str>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Traces, OtelError> {
        for var in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            match env(var).as_deref().map(str::trim) {
                None | Some("") | Some("http/protobuf") => {}
                Some(other) => {
                    return Err(OtelError::Config {
                        var,
                        message: format!("`{other}` is not supported (only `http/protobuf`)"),
                    })
                }
            }
        }
        let timeout = export_timeout(env)?;
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(timeout)
            .with_http_client(http_client(timeout)?);
        if let Some(url) = endpoint {
            exporter = exporter.with_endpoint(url);
        }
        let exporter = exporter
            .build()
            .map_err(|e| OtelError::Exporter(e.to_string()))?;
        let named_in_attributes = env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| {
            a.split(',')
                .any(|kv| kv.trim().starts_with("service.name="))
        });
        let mut resource = Resource::builder();
        if env("OTEL_SERVICE_NAME").is_none() && !named_in_attributes {
            resource = resource.with_service_name(DEFAULT_SERVICE_NAME);
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        let scope = opentelemetry::InstrumentationScope::builder("agentvisor")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let tracer = provider.tracer_with_scope(scope);
        Ok(Traces {
            provider,
            tracer,
            shut: false,
        })
    }

    /// The layer that turns agentvisor's spans and events (target
    /// `agentvisor`, level `info` and above) into OpenTelemetry spans and
    /// span events. Other crates' spans are left out; for a layer of your
    /// own choosing, use [`tracer`](Traces::tracer).
    pub fn layer<S>(&self) -> impl Layer<S>
    where
        S: Subscriber + for<'span> LookupSpan<'span>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.tracer.clone())
            // Busy/idle time per span costs two clock reads at every enter
            // and exit (a run's span is entered once per handler).
            .with_tracked_inactivity(false)
            // Every span is made in one file (`actors::run::spans`): its
            // location, thread and target say nothing about the run.
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_filter(filter())
    }

    /// The tracer behind [`layer`](Traces::layer).
    pub fn tracer(&self) -> SdkTracer {
        self.tracer.clone()
    }

    /// Exports the spans still buffered and stops the pipeline. Call it
    /// outside an async context (it waits for the export).
    pub fn shutdown(mut self) -> Result<(), OtelError> {
        self.shut = true;
        self.provider
            .shutdown()
            .map_err(|e| OtelError::Shutdown(e.to_string()))
    }
}

impl Drop for Traces {
    fn drop(&mut self) {
        if !self.shut {
            let _ = self.provider.shutdown();
        }
    }
}

/// What [`Traces::layer`] passes on: agentvisor's spans and events at
/// `info` and above.
pub fn filter() -> Targets {
    Targets::new().with_target("agentvisor", LevelFilter::INFO)
}

/// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT`
/// (milliseconds), else [`DEFAULT_EXPORT_TIMEOUT`].
fn export_timeout(env: &dyn Fn(&str) -> Option<String>) -> Result<Duration, OtelError> {
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ] {
        if let Some(v) = env(var).filter(|v| !v.trim().is_empty()) {
            return v
                .trim()
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| OtelError::Config {
                    var,
                    message: format!("`{v}` is not a number of milliseconds"),
                });
        }
    }
    Ok(DEFAULT_EXPORT_TIMEOUT)
}

/// The exporter's HTTP client: blocking (the SDK exports from a thread of
/// its own, with no async runtime), rustls on `ring` with the webpki roots
/// handed over ready-made as the providers' client is, so no process-wide
/// crypto provider is needed. Built on a thread of its own: a blocking
/// client must not be made inside an async context.
fn http_client(timeout: Duration) -> Result<reqwest::blocking::Client, OtelError> {
    std::thread::spawn(move || {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        reqwest::blocking::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .tls_backend_preconfigured(tls)
            .build()
            .map_err(|e| e.to_string())
    })
    .join()
    .map_err(|_| OtelError::Exporter("building the HTTP client panicked".into()))?
    .map_err(OtelError::Exporter)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn lookup<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn no_endpoint_means_no_exporter() {
        assert!(Traces::from_lookup(lookup(&[])).unwrap().is_none());
        let blank = [("OTEL_EXPORTER_OTLP_ENDPOINT", " ")];
        assert!(Traces::from_lookup(lookup(&blank)).unwrap().is_none());
    }

    #[test]
    fn disabled_or_none_means_no_exporter() {
        let disabled = [
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
        ];
        assert!(Traces::from_lookup(lookup(&disabled)).unwrap().is_none());
        let none = [
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
        ];
        assert!(Traces::from_lookup(lookup(&none)).unwrap().is_none());
    }

    #[test]
    fn unsupported_settings_are_named() {
        let grpc = [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
        ];
        let e = Traces::from_lookup(lookup(&grpc)).unwrap_err();
        assert!(
            matches!(
                e,
                OtelError::Config {
                    var: "OTEL_EXPORTER_OTLP_PROTOCOL",
                    ..
                }
            ),
            "{e}"
        );
        let zipkin = [
            ("OTEL_TRACES_EXPORTER", "zipkin"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
        ];
        let e = Traces::from_lookup(lookup(&zipkin)).unwrap_err();
        assert!(e.to_string().contains("zipkin"), "{e}");
        let timeout = [("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")];
        let e = export_timeout(&lookup(&timeout)).unwrap_err();
        assert!(e.to_string().contains("OTEL_EXPORTER_OTLP_TIMEOUT"), "{e}");
    }

    #[test]
    fn the_traces_timeout_wins_over_the_general_one() {
        let both = [
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "5000"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "250"),
        ];
        assert_eq!(
            export_timeout(&lookup(&both)).unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            export_timeout(&lookup(&[])).unwrap(),
            DEFAULT_EXPORT_TIMEOUT
        );
    }
}
