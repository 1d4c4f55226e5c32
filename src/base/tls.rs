//! The TLS every outbound HTTP client of the crate uses (the providers',
//! the publishers').

/// rustls on the `ring` provider with the webpki roots, HTTP/1.1 by ALPN.
/// Given to reqwest ready-made, so no process-wide crypto provider is
/// needed or installed. `None` only if ring lacked every safe protocol
/// version, which it does not.
pub(crate) fn client_config() -> Option<rustls::ClientConfig> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Some(config)
}
