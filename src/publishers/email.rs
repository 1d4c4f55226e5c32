//! The `email` destination: one message over SMTP (lettre, on rustls).
//!
//! TLS: port 465 speaks TLS from the first byte; with a login, STARTTLS is
//! required (a password never crosses in the clear); without one, STARTTLS
//! is used when the server offers it. The port defaults to 587 with a
//! login, 25 without. The message's `Message-ID` is made of the intent's
//! key, so a message sent again after a crash is recognisably the same.

use lettre::message::header::ContentType;
use lettre::message::Mailbox;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use serde_json::Value;

use super::Destinations;
use crate::ports::outbox::{Delivered, PublishError, PublishIntent};

impl Destinations {
    /// `email`: one message to every `to`.
    pub(super) async fn email(&self, intent: &PublishIntent) -> Result<Delivered, PublishError> {
        let host = self.needed(intent, "host")?;
        let from = self.needed(intent, "from")?;
        let username = self.value(intent, "username")?;
        let password = self.value(intent, "password")?;
        let port = match intent.target.get("port").and_then(Value::as_u64) {
            Some(p) => u16::try_from(p)
                .map_err(|_| PublishError::Permanent(format!("`port` {p} is not a port")))?,
            None if username.is_some() => 587,
            None => 25,
        };
        let to: Vec<String> = intent
            .target
            .get("to")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if to.is_empty() {
            return Err(PublishError::Permanent(
                "the `email` destination has no recipient (`to`)".into(),
            ));
        }
        let mailbox = |a: &str, key: &str| -> Result<Mailbox, PublishError> {
            a.parse()
                .map_err(|e| PublishError::Permanent(format!("`{key}` `{a}`: {e}")))
        };
        let subject = self
            .value(intent, "title")?
            .unwrap_or_else(|| format!("{}: {}", intent.schedule, intent.skill));
        let mut builder = Message::builder()
            .from(mailbox(&from, "from")?)
            .subject(subject)
            .message_id(Some(format!("<{}@agentvisor>", intent.key)));
        for t in &to {
            builder = builder.to(mailbox(t, "to")?);
        }
        let message = builder
            .header(ContentType::TEXT_PLAIN)
            .body(intent.body.clone())
            .map_err(|e| PublishError::Permanent(format!("the message cannot be built: {e}")))?;
        let params = TlsParameters::new(host.clone())
            .map_err(|e| PublishError::Permanent(format!("TLS for {host}: {e}")))?;
        let tls = if port == 465 {
            Tls::Wrapper(params)
        } else if username.is_some() {
            Tls::Required(params)
        } else {
            Tls::Opportunistic(params)
        };
        let mut transport = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host.as_str())
            .port(port)
            .tls(tls);
        if let Some(user) = username {
            transport = transport.credentials(Credentials::new(user, password.unwrap_or_default()));
        }
        let shown = format!("smtp {host}:{port}");
        match transport.build().send(message).await {
            Ok(_) => Ok(Delivered {
                detail: Some(format!("sent to {} recipient(s)", to.len())),
            }),
            Err(e) => {
                let text = crate::secrets::redact_string(format!("{shown}: {e}"));
                if e.is_permanent() {
                    Err(PublishError::Permanent(text))
                } else {
                    Err(PublishError::Transient(text))
                }
            }
        }
    }
}
