//! Command-line flags of `clb-webhook`, each with a `CLB_WEBHOOK_*` environment fallback (in the
//! library so that the deployment manifests can be checked against them).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use super::CertificateFiles;
use crate::translate::DEFAULT_CLASS;
use crate::translate::TranslatorConfig;

/// Mutating admission webhook: gives the pods that clb's LoadBalancer Services select the
/// readiness gate `clb.azure.com/programmed` (docs/readiness-gate.md).
#[derive(Debug, Clone, Parser)]
#[command(name = "clb-webhook", version)]
pub struct Args {
    /// Address of the HTTPS listener the API server calls (`POST /mutate-pods`).
    #[arg(long, env = "CLB_WEBHOOK_LISTEN", default_value = "0.0.0.0:9443")]
    pub listen: SocketAddr,
    /// PEM file of the serving certificate chain (leaf first), re-read when it changes.
    #[arg(long, env = "CLB_WEBHOOK_TLS_CERT")]
    pub tls_cert: PathBuf,
    /// PEM file of the serving certificate's private key, re-read when it changes.
    #[arg(long, env = "CLB_WEBHOOK_TLS_KEY")]
    pub tls_key: PathBuf,
    /// How often the certificate files are re-read (at least 1s): a renewed certificate is
    /// presented within about this long.
    #[arg(long, env = "CLB_WEBHOOK_TLS_RELOAD_INTERVAL", default_value = "10s",
          value_name = "DURATION", value_parser = parse_reload_interval)]
    pub tls_reload_interval: Duration,
    /// Serve `/metrics`, `/healthz` and `/readyz` (plain HTTP) on this address.
    #[arg(long, env = "CLB_WEBHOOK_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// The `spec.loadBalancerClass` clb serves (the watcher's `--class`).
    #[arg(long, env = "CLB_WEBHOOK_LOAD_BALANCER_CLASS", default_value = DEFAULT_CLASS)]
    pub class: String,
    /// Whether LoadBalancer Services without a `loadBalancerClass` are clb's (the watcher's
    /// `--claim-unclassed`).
    #[arg(long, env = "CLB_WEBHOOK_CLAIM_UNCLASSED", default_value_t = true,
          action = clap::ArgAction::Set)]
    pub claim_unclassed: bool,
}

impl Args {
    /// The certificate files.
    pub fn certificate_files(&self) -> CertificateFiles {
        CertificateFiles {
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
        }
    }

    /// The class rules, as the watcher's translator takes them.
    pub fn class_config(&self) -> TranslatorConfig {
        TranslatorConfig {
            class: self.class.clone(),
            claim_unclassed: self.claim_unclassed,
            ..TranslatorConfig::default()
        }
    }
}

/// A duration of at least 1 s.
fn parse_reload_interval(s: &str) -> Result<Duration, String> {
    let d = clb_telemetry::flags::parse_duration(s)?;
    if d < Duration::from_secs(1) {
        return Err(format!("{s:?} is shorter than 1s"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_required_flags() {
        let a = Args::try_parse_from(["clb-webhook", "--tls-cert=c.pem", "--tls-key=k.pem"])
            .expect("parses");
        assert_eq!(a.listen, "0.0.0.0:9443".parse().unwrap());
        assert_eq!(a.tls_reload_interval, Duration::from_secs(10));
        assert_eq!(a.class_config(), TranslatorConfig::default());
        assert!(a.metrics_listen.is_none());
        assert!(Args::try_parse_from(["clb-webhook", "--tls-cert=c.pem"]).is_err());
        let interval = |flag: &str| {
            Args::try_parse_from(["clb-webhook", "--tls-cert=c.pem", "--tls-key=k.pem", flag])
                .map(|a| a.tls_reload_interval)
        };
        assert_eq!(
            interval("--tls-reload-interval=1m").unwrap(),
            Duration::from_secs(60)
        );
        let e = interval("--tls-reload-interval=60")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"60\" has no unit"), "{e}");
        assert!(interval("--tls-reload-interval=500ms").is_err());
        assert!(interval("--tls-reload-interval=0s").is_err());
        let a = Args::try_parse_from([
            "clb-webhook",
            "--tls-cert=c.pem",
            "--tls-key=k.pem",
            "--claim-unclassed=false",
            "--class=example.com/lb",
        ])
        .unwrap();
        let c = a.class_config();
        assert!(!c.claim_unclassed);
        assert_eq!(c.class, "example.com/lb");
    }
}
