//! What the runtime tells about itself: the kernel's counters and
//! histograms (`telemetry`) and, with the `otel` feature, OpenTelemetry
//! traces of runs (`otel`). Both import only ports.

#[cfg(feature = "otel")]
pub mod otel;
pub mod telemetry;
