//! Outbound HTTP: the one way the service builds a `reqwest` client. reqwest is built with rustls
//! but no crypto provider (so the build needs no aws-lc C toolchain); building a client before a
//! provider is installed would panic, so every client comes from [`client_builder`], which installs
//! ring's provider first.

use std::sync::Once;

/// Install ring as the process's rustls crypto provider, once. Harmless when one is installed.
pub fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // An error means another provider was installed first, which serves just as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A `reqwest` client builder with the crypto provider installed and the service's user agent.
pub fn client_builder() -> reqwest::ClientBuilder {
    install_crypto_provider();
    reqwest::Client::builder().user_agent(concat!("pes-server/", env!("CARGO_PKG_VERSION")))
}
