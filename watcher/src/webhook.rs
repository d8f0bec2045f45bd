//! `clb-webhook`: a mutating admission webhook that gives a pod the readiness gate
//! `clb.azure.com/programmed` (docs/readiness-gate.md).
//!
//! A pod created in a namespace labelled `clb.azure.com/readiness-gate-inject: enabled`, and
//! selected at creation by at least one LoadBalancer Service of clb's class in its namespace, gets
//! two things from the webhook, as one JSON patch:
//! - the readiness gate: `spec.readinessGates[] += {conditionType: clb.azure.com/programmed}`;
//! - the label `clb.azure.com/readiness-gate: "true"`, which the watcher watches pods by.
//!
//! The pod then stays not Ready until the watcher sets the condition `clb.azure.com/programmed` on
//! it (once NRP has the pod's address in the backend pool). The webhook never denies a pod: every
//! answer is `allowed: true`, with or without a patch, and the `MutatingWebhookConfiguration` has
//! `failurePolicy: Ignore`.
//!
//! The parts:
//! - [`admit`] (pure, synchronous): one AdmissionReview request, the namespace's labels and the
//!   namespace's Services → the AdmissionResponse and what happened ([`Outcome`]); which Services
//!   are clb's is [`crate::translate::classify`], the watcher's own rule;
//! - [`review_json`]: the AdmissionReview answer as the API server reads it (`patch` base64);
//! - [`Stores`]: the Services and Namespaces the answers are computed from, kept by kube-runtime
//!   reflectors ([`Stores::reflect`]) or fed by the caller ([`Stores::new`] with stores of one's
//!   own: the stores are the injectable source);
//! - [`Webhook`]: the HTTP handler (`POST /mutate-pods`), [`serve`]: HTTPS with a certificate that
//!   is re-read when its files change ([`CertificateFiles`], [`ReloadingCertificate`]);
//! - [`Args`]: the flags of `clb-webhook`, [`WebhookMetrics`]: its metrics.

mod admission;
mod cli;
mod metrics;
mod serve;
mod stores;
mod tls;

pub use admission::{
    Outcome, admit, escape_pointer_token, gate_patch, review_json, selecting_services, selects,
};
pub use cli::Args;
pub use metrics::WebhookMetrics;
pub use serve::{TlsListener, Webhook, run, serve};
pub use stores::{Stores, reflect_namespaces, reflect_services};
pub use tls::{CertificateFiles, HANDSHAKE_TIMEOUT, ReloadingCertificate};

/// The pod condition type of the readiness gate (`spec.readinessGates[].conditionType`), which the
/// watcher sets to `True` once NRP has the pod.
pub const GATE_CONDITION_TYPE: &str = "clb.azure.com/programmed";

/// The label the webhook puts on a gated pod; the watcher watches the pods that carry it.
pub const GATE_LABEL: &str = "clb.azure.com/readiness-gate";

/// The value of [`GATE_LABEL`] on a gated pod. A pod that carries the label with another value
/// (for example `"false"`) is left alone: that is how a pod opts out.
pub const GATE_LABEL_VALUE: &str = "true";

/// The namespace label that turns the injection on for the pods of a namespace.
pub const INJECT_LABEL: &str = "clb.azure.com/readiness-gate-inject";

/// The value of [`INJECT_LABEL`] that turns the injection on.
pub const INJECT_LABEL_VALUE: &str = "enabled";

/// The path the API server posts AdmissionReviews to (the `MutatingWebhookConfiguration`'s
/// `clientConfig.service.path`).
pub const MUTATE_PATH: &str = "/mutate-pods";

/// The largest AdmissionReview body accepted (the API server's own request limit is 3 MiB; a
/// review carries the object once on CREATE).
pub const MAX_BODY_BYTES: usize = 6 * 1024 * 1024;
