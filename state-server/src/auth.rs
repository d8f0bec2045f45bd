//! Kubernetes-native authentication and authorization of gRPC callers (docs/security.md).
//!
//! Every call but health and reflection carries `authorization: Bearer <token>`: a ServiceAccount
//! token with the audience `clb` (by default). With `--authentication=kubernetes` the server
//! validates it with a `TokenReview` (audience checked) and, with `--authorization=kubernetes`,
//! asks a `SubjectAccessReview` whether the caller may act on the gateway: API group
//! [`API_GROUP`], resource [`RESOURCE`], resource name the gateway, verb per service ([`Verb`]).
//! Both answers are cached for a short TTL in bounded caches ([`TtlCache`]). The Kubernetes API
//! unreachable fails the call closed with `UNAVAILABLE` (nothing is applied): at once when it
//! answers an error or refuses the connection (the reviews' client has no retries:
//! [`review_client`]), after [`REVIEW_TIMEOUT`] when it does not answer; a cached caller keeps
//! working.
//!
//! [`AuthLayer`] authenticates every call in one place (and authorizes Admin calls, which read
//! every gateway); it hands the [`Caller`] to the services in the request's extensions, and the
//! Writer and Worker services authorize per gateway ([`Caller::require`], [`Caller::writer`]).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use clb_core::difftracker::quote;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use tonic::Status;
use tracing::Instrument as _;

/// The audience a token must be issued for, by default.
pub const DEFAULT_AUDIENCE: &str = "clb";
/// The API group of the RBAC rules that grant access to gateways.
pub const API_GROUP: &str = "clb.azure.com";
/// The RBAC resource (its names are the gateways).
pub const RESOURCE: &str = "gateways";
/// The user extra a bound pod token carries: the node its pod runs on.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// The oldest Kubernetes whose pod-bound ServiceAccount tokens carry [`NODE_NAME_EXTRA`] by default
/// (feature gate `ServiceAccountTokenPodNodeInfo`: alpha in 1.29, beta and on by default in 1.30,
/// GA in 1.32): node binding of node agents needs it.
pub const MIN_NODE_BINDING_VERSION: &str = "1.30";
/// Default TTL of a cached review.
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(30);
/// Default bound of each cache.
pub const DEFAULT_CACHE_CAPACITY: usize = 10_000;
/// TTL of a cached refusal (an invalid token, a denied access): short, so a fix takes effect fast.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(5);
/// Longest wait of a call for one review; then the call fails closed with `UNAVAILABLE`, well
/// within the clients' 8 s deadline. The review goes on in the background for up to
/// [`REVIEW_LIMIT`] and its answer, when it comes, is cached: a slow API server does not make
/// every attempt fail, the caller's retry finds the answer.
pub const REVIEW_TIMEOUT: Duration = Duration::from_millis(1500);
/// Longest life of one review in the background (see [`REVIEW_TIMEOUT`]).
pub const REVIEW_LIMIT: Duration = Duration::from_secs(10);

/// `--authentication` / `--authorization`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// No check (only for loopback, or with `--insecure-allow-unauthenticated`).
    #[default]
    None,
    /// TokenReview (authentication) / SubjectAccessReview (authorization).
    Kubernetes,
}

/// The RBAC verbs on `gateways.clb.azure.com`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    /// Writer service, any update under any writer name (the cluster watcher, `clbctl apply/load`):
    /// ClusterRole `clb-writer`.
    Write,
    /// Writer service, only pods at the caller's own node (a node-bound token), as writer
    /// `node-agent/<node>`: ClusterRole `clb-node-writer`.
    WriteNode,
    /// Worker service (`Worker.Sync`): ClusterRole `clb-worker`.
    Work,
    /// Admin service (reads): ClusterRole `clb-reader`.
    Get,
}

impl Verb {
    /// The verb as RBAC spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Write => "write",
            Verb::WriteNode => "write-node",
            Verb::Work => "work",
            Verb::Get => "get",
        }
    }

    /// The ClusterRole of deploy/ that grants the verb.
    pub fn role(self) -> &'static str {
        match self {
            Verb::Write => "clb-writer",
            Verb::WriteNode => "clb-node-writer",
            Verb::Work => "clb-worker",
            Verb::Get => "clb-reader",
        }
    }
}

/// How the server checks callers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfig {
    /// Token validation.
    pub authentication: Mode,
    /// Access decisions (needs `authentication`).
    pub authorization: Mode,
    /// The audience tokens must be issued for.
    pub audience: String,
    /// TTL of a cached positive review.
    pub cache_ttl: Duration,
    /// TTL of a cached negative review.
    pub negative_ttl: Duration,
    /// Most entries in each cache.
    pub cache_capacity: usize,
    /// Longest wait for one review.
    pub review_timeout: Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            authentication: Mode::None,
            authorization: Mode::None,
            audience: DEFAULT_AUDIENCE.to_owned(),
            cache_ttl: DEFAULT_CACHE_TTL,
            negative_ttl: NEGATIVE_TTL,
            cache_capacity: DEFAULT_CACHE_CAPACITY,
            review_timeout: REVIEW_TIMEOUT,
        }
    }
}

impl AuthConfig {
    /// Whether any check needs the Kubernetes API.
    pub fn needs_kubernetes(&self) -> bool {
        self.authentication == Mode::Kubernetes || self.authorization == Mode::Kubernetes
    }
}

/// A map whose entries expire after their TTL and that holds at most `capacity` entries: when
/// full, expired entries go first, then the entry closest to expiry. The clock is passed in
/// (`now`), so tests need no waiting.
#[derive(Debug)]
pub struct TtlCache<K, V> {
    capacity: usize,
    entries: HashMap<K, (V, Instant)>,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    /// An empty cache of at most `capacity` (at least 1) entries.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            entries: HashMap::new(),
        }
    }

    /// The value of `key` if it has not expired at `now`.
    pub fn get(&mut self, key: &K, now: Instant) -> Option<V> {
        match self.entries.get(key) {
            Some((v, expires)) if now < *expires => Some(v.clone()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Stores `value` for `ttl` from `now`, evicting if the cache is full.
    pub fn insert(&mut self, key: K, value: V, ttl: Duration, now: Instant) {
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            self.entries.retain(|_, (_, expires)| now < *expires);
            if self.entries.len() >= self.capacity
                && let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, expires))| *expires)
                    .map(|(k, _)| k.clone())
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(key, (value, now + ttl));
    }

    /// Entries held (expired ones included until evicted).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Who a validated token belongs to (TokenReview's `status.user`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Identity {
    /// E.g. `system:serviceaccount:clb-system:clb-watcher`.
    pub username: String,
    /// The user's UID.
    pub uid: String,
    /// Its groups.
    pub groups: Vec<String>,
    /// Its extra attributes (the bound pod's node among them).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Identity {
    /// The node the token's pod runs on, if the token is bound to a pod.
    pub fn node(&self) -> Option<&str> {
        self.extra
            .get(NODE_NAME_EXTRA)
            .and_then(|v| v.first())
            .map(String::as_str)
            .filter(|n| !n.is_empty())
    }
}

/// What a writer may write, decided per call ([`Caller::writer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteRights {
    /// Anything, under any writer name.
    Any,
    /// Only pods at the locations of this node (as the cluster watcher's topology declares them),
    /// as writer `node-agent/<node>`.
    Node(String),
}

#[derive(Debug, Clone)]
enum TokenOutcome {
    Valid(Arc<Identity>),
    Invalid(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct DecisionKey {
    who: Arc<Identity>,
    verb: Verb,
    gateway: String,
}

/// Counters of the reviews actually sent to the Kubernetes API (cache misses).
#[derive(Debug, Default)]
pub struct ReviewCounts {
    /// TokenReviews created.
    pub token_reviews: AtomicU64,
    /// SubjectAccessReviews created.
    pub access_reviews: AtomicU64,
}

/// The server's authenticator and authorizer.
pub struct Auth {
    config: AuthConfig,
    client: Option<kube::Client>,
    tokens: Mutex<TtlCache<String, TokenOutcome>>,
    decisions: Mutex<TtlCache<DecisionKey, bool>>,
    counts: ReviewCounts,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("config", &self.config)
            .finish()
    }
}

/// A Kubernetes client for the reviews: `config`'s, without kube's retries. kube's default policy
/// answers a `429`/`503`/`504` by retrying inside the request (up to 15 times, with growing
/// delays), so while the API server is down (restarting, overloaded) a review would get no answer
/// at all within the clients' deadline; without them the call fails closed at once with
/// `UNAVAILABLE` naming the answer, and the client's retry asks again.
pub fn review_client(mut config: kube::Config) -> Result<kube::Client, kube::Error> {
    config.default_retry = false;
    kube::Client::try_from(config)
}

/// The Kubernetes API could not answer a review (`what`): fail closed, saying how it failed.
fn unavailable(what: &str, err: &kube::Error) -> Status {
    let how = match err {
        kube::Error::Api(status) => format!(
            "answered the {what} with {} {}: {}",
            status.code,
            if status.reason.is_empty() {
                "(no reason)"
            } else {
                status.reason.as_str()
            },
            quote(&status.message)
        ),
        kube::Error::HyperError(_) | kube::Error::Service(_) => format!(
            "could not be reached for the {what}: {}",
            quote(&error_chain(err))
        ),
        other => format!("failed the {what}: {}", quote(&error_chain(other))),
    };
    Status::unavailable(format!(
        "cannot check the caller: the Kubernetes API {how}; nothing was changed, retry"
    ))
}

/// The review did not finish within the call's wait.
fn no_answer(what: &str, waited: Duration) -> Status {
    Status::unavailable(format!(
        "cannot check the caller: the Kubernetes API has not answered the {what} within \
         {waited:?} (an answer that comes later is cached for the next attempt); nothing was \
         changed, retry"
    ))
}

/// An error with its causes, `: `-separated (a connection error's cause says why: refused, …).
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

/// Runs `review` in a task for at most [`REVIEW_LIMIT`] (the task caches its answer), and waits
/// for it at most `wait`. Any failure is `UNAVAILABLE` (fail closed).
async fn bounded<T: Send + 'static>(
    review: impl Future<Output = Result<T, Status>> + Send + 'static,
    wait: Duration,
    what: &'static str,
) -> Result<T, Status> {
    let limit = REVIEW_LIMIT.max(wait);
    let task = tokio::spawn(
        async move {
            match tokio::time::timeout(limit, review).await {
                Ok(r) => r,
                Err(_) => Err(no_answer(what, limit)),
            }
        }
        .in_current_span(),
    );
    match tokio::time::timeout(wait, task).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(Status::unavailable(format!(
            "cannot check the caller: the {what} was cancelled ({e}); nothing was changed, retry"
        ))),
        Err(_) => Err(no_answer(what, wait)),
    }
}

impl Auth {
    /// Checks as `config` says; `client` is the Kubernetes API (needed when either mode is
    /// `kubernetes`).
    pub fn new(config: AuthConfig, client: Option<kube::Client>) -> Result<Arc<Self>, String> {
        if config.needs_kubernetes() && client.is_none() {
            return Err(
                "--authentication/--authorization=kubernetes needs a Kubernetes client".into(),
            );
        }
        if config.authorization == Mode::Kubernetes && config.authentication != Mode::Kubernetes {
            return Err("--authorization=kubernetes needs --authentication=kubernetes".into());
        }
        Ok(Arc::new(Self {
            tokens: Mutex::new(TtlCache::new(config.cache_capacity)),
            decisions: Mutex::new(TtlCache::new(config.cache_capacity)),
            config,
            client,
            counts: ReviewCounts::default(),
        }))
    }

    /// The configuration.
    pub fn config(&self) -> &AuthConfig {
        &self.config
    }

    /// Reviews sent to the Kubernetes API so far.
    pub fn counts(&self) -> &ReviewCounts {
        &self.counts
    }

    /// Identifies the caller of a request from its `authorization` metadata.
    pub async fn authenticate(
        self: &Arc<Self>,
        headers: &http::HeaderMap,
    ) -> Result<Caller, Status> {
        if self.config.authentication == Mode::None {
            return Ok(Caller {
                identity: None,
                auth: self.clone(),
            });
        }
        let token = bearer(headers)?;
        let identity = self.review_token(token).await?;
        Ok(Caller {
            identity: Some(identity),
            auth: self.clone(),
        })
    }

    async fn review_token(self: &Arc<Self>, token: &str) -> Result<Arc<Identity>, Status> {
        let cached = self
            .tokens
            .lock()
            .unwrap()
            .get(&token.to_owned(), Instant::now());
        let outcome = match cached {
            Some(o) => o,
            None => {
                let (auth, token) = (self.clone(), token.to_owned());
                let review = async move {
                    let o = auth.token_review(&token).await?;
                    let ttl = match o {
                        TokenOutcome::Valid(_) => auth.config.cache_ttl,
                        TokenOutcome::Invalid(_) => auth.config.negative_ttl,
                    };
                    auth.tokens
                        .lock()
                        .unwrap()
                        .insert(token, o.clone(), ttl, Instant::now());
                    Ok(o)
                };
                bounded(review, self.config.review_timeout, "TokenReview").await?
            }
        };
        match outcome {
            TokenOutcome::Valid(id) => Ok(id),
            TokenOutcome::Invalid(why) => Err(Status::unauthenticated(format!(
                "the bearer token was rejected: {why}"
            ))),
        }
    }

    async fn token_review(&self, token: &str) -> Result<TokenOutcome, Status> {
        let client = self.client.clone().expect("checked in Auth::new");
        self.counts.token_reviews.fetch_add(1, Ordering::Relaxed);
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![self.config.audience.clone()]),
            },
            ..Default::default()
        };
        let api = kube::Api::<TokenReview>::all(client);
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| unavailable("TokenReview", &e))?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            let why = status
                .error
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "not authenticated".to_owned());
            return Ok(TokenOutcome::Invalid(format!(
                "TokenReview: {}",
                quote(&why)
            )));
        }
        // The API server checks the audiences it was given; an answer that does not name ours
        // (an authenticator that ignores audiences) is not trusted.
        let audiences = status.audiences.unwrap_or_default();
        if !audiences.contains(&self.config.audience) {
            return Ok(TokenOutcome::Invalid(format!(
                "the token is not valid for the audience {:?} (TokenReview returned audiences \
                 {audiences:?}): use a projected ServiceAccount token with that audience",
                self.config.audience
            )));
        }
        let user = status.user.unwrap_or_default();
        let username = user.username.unwrap_or_default();
        if username.is_empty() {
            return Ok(TokenOutcome::Invalid(
                "TokenReview returned no user name".to_owned(),
            ));
        }
        Ok(TokenOutcome::Valid(Arc::new(Identity {
            username,
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
        })))
    }

    async fn allowed(
        self: &Arc<Self>,
        who: &Arc<Identity>,
        verb: Verb,
        gateway: &str,
    ) -> Result<bool, Status> {
        let key = DecisionKey {
            who: who.clone(),
            verb,
            gateway: gateway.to_owned(),
        };
        if let Some(d) = self.decisions.lock().unwrap().get(&key, Instant::now()) {
            return Ok(d);
        }
        let auth = self.clone();
        let review = async move { auth.access_review(key).await };
        bounded(review, self.config.review_timeout, "SubjectAccessReview").await
    }

    /// Asks a SubjectAccessReview and caches its answer.
    async fn access_review(&self, key: DecisionKey) -> Result<bool, Status> {
        let (who, verb, gateway) = (&key.who, key.verb, &key.gateway);
        let client = self.client.clone().expect("checked in Auth::new");
        self.counts.access_reviews.fetch_add(1, Ordering::Relaxed);
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(who.username.clone()),
                uid: Some(who.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(who.groups.clone()),
                extra: Some(who.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(API_GROUP.to_owned()),
                    resource: Some(RESOURCE.to_owned()),
                    verb: Some(verb.as_str().to_owned()),
                    name: Some(gateway.to_owned()).filter(|g| !g.is_empty()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api = kube::Api::<SubjectAccessReview>::all(client);
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| unavailable("SubjectAccessReview", &e))?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let ttl = if allowed {
            self.config.cache_ttl
        } else {
            self.config.negative_ttl
        };
        self.decisions
            .lock()
            .unwrap()
            .insert(key, allowed, ttl, Instant::now());
        Ok(allowed)
    }
}

/// The bearer token of a request's metadata.
fn bearer(headers: &http::HeaderMap) -> Result<&str, Status> {
    let missing = || {
        Status::unauthenticated(
            "no bearer token: send the metadata `authorization: Bearer <token>` with a \
             ServiceAccount token for the server's audience (--token-file)",
        )
    };
    let value = headers
        .get(http::header::AUTHORIZATION)
        .ok_or_else(missing)?;
    let value = value.to_str().map_err(|_| {
        Status::unauthenticated("the authorization metadata is not printable ASCII")
    })?;
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(Status::unauthenticated(format!(
            "authorization = {}: expected `Bearer <token>`",
            quote(scheme)
        )));
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(Status::unauthenticated(
            "authorization: the bearer token is empty",
        ));
    }
    Ok(token)
}

/// The authenticated caller of one request (in its extensions, put there by [`AuthLayer`]).
#[derive(Debug, Clone)]
pub struct Caller {
    identity: Option<Arc<Identity>>,
    auth: Arc<Auth>,
}

impl Caller {
    /// The caller the [`AuthLayer`] put in a request's extensions; `None` when the server runs
    /// without the layer (the library's plain [`crate::grpc::serve`]), which checks nothing.
    pub fn of(extensions: &http::Extensions) -> Option<&Caller> {
        extensions.get::<Caller>()
    }

    /// The caller's identity (`None` without authentication).
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_deref()
    }

    fn name(&self) -> &str {
        self.identity
            .as_deref()
            .map_or("anonymous", |i| i.username.as_str())
    }

    fn checks(&self) -> Option<&Arc<Identity>> {
        match self.auth.config.authorization {
            Mode::None => None,
            Mode::Kubernetes => self.identity.as_ref(),
        }
    }

    fn denied(&self, action: &str, verb: Verb, gateway: &str) -> Status {
        let name = if gateway.is_empty() {
            "any name (a rule without resourceNames)".to_owned()
        } else {
            format!("name {gateway:?}")
        };
        Status::permission_denied(format!(
            "{} may not {action}: missing permission verb {:?} on resource {:?} of API group \
             {:?}, {name} (granted by ClusterRole {})",
            quote(self.name()),
            verb.as_str(),
            RESOURCE,
            API_GROUP,
            verb.role()
        ))
    }

    /// Fails with `PERMISSION_DENIED` unless the caller may `verb` the gateway (`""`: every
    /// gateway); `UNAVAILABLE` if the Kubernetes API cannot tell.
    pub async fn require(&self, verb: Verb, gateway: &str) -> Result<(), Status> {
        let Some(who) = self.checks() else {
            return Ok(());
        };
        if self.auth.allowed(who, verb, gateway).await? {
            return Ok(());
        }
        let action = match verb {
            Verb::Get => "read the state (Admin)".to_owned(),
            Verb::Work => format!("work on gateway {gateway:?} (Worker.Sync)"),
            Verb::Write | Verb::WriteNode => format!("write gateway {gateway:?}"),
        };
        Err(self.denied(&action, verb, gateway))
    }

    /// What the caller may write to `gateway` as writer `writer`: verb `write` allows anything;
    /// else verb `write-node` allows pods at the node of the caller's bound token, as writer
    /// `node-agent/<node>` only. `PERMISSION_DENIED` names what is missing.
    pub async fn writer(&self, gateway: &str, writer: &str) -> Result<WriteRights, Status> {
        let Some(who) = self.checks() else {
            return Ok(WriteRights::Any);
        };
        if self.auth.allowed(who, Verb::Write, gateway).await? {
            return Ok(WriteRights::Any);
        }
        if !self.auth.allowed(who, Verb::WriteNode, gateway).await? {
            let mut status =
                self.denied(&format!("write gateway {gateway:?}"), Verb::Write, gateway);
            status = Status::permission_denied(format!(
                "{} (a node agent needs verb {:?} instead, ClusterRole {})",
                status.message(),
                Verb::WriteNode.as_str(),
                Verb::WriteNode.role()
            ));
            return Err(status);
        }
        let Some(node) = who.node() else {
            return Err(Status::permission_denied(format!(
                "{} may write only its own node's pods (verb {:?}), but its token names no node \
                 (the TokenReview returned no user extra {NODE_NAME_EXTRA:?}): node binding needs \
                 a projected ServiceAccount token bound to the node agent's pod (a \
                 `serviceAccountToken` projected volume with the server's audience, as deploy/ \
                 mounts it), issued by Kubernetes {MIN_NODE_BINDING_VERSION} or later (feature \
                 ServiceAccountTokenPodNodeInfo, on by default since 1.30); a token not bound to a \
                 pod (a Secret's, or `kubectl create token` without `--bound-object-kind Pod`) \
                 names no node",
                quote(self.name()),
                Verb::WriteNode.as_str()
            )));
        };
        let allowed = format!("node-agent/{node}");
        if writer != allowed {
            return Err(Status::permission_denied(format!(
                "writer = {}: {} is the node agent of node {node:?} and may write only as writer \
                 {allowed:?}",
                quote(writer),
                quote(self.name()),
            )));
        }
        Ok(WriteRights::Node(node.to_owned()))
    }
}

/// The paths that stay open: gRPC health (the kubelet probes it) and reflection.
fn open_path(path: &str) -> bool {
    path.starts_with("/grpc.health.v1.Health/") || path.starts_with("/grpc.reflection.")
}

/// Authenticates every call but health and reflection, and authorizes Admin calls (verb `get` on
/// every gateway); puts the [`Caller`] in the request's extensions. Without an [`Auth`] it passes
/// every call through.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    auth: Option<Arc<Auth>>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl AuthLayer {
    /// A layer checking with `auth` (`None`: nothing is checked).
    pub fn new(auth: Option<Arc<Auth>>) -> Self {
        Self {
            auth,
            metrics: None,
        }
    }

    /// Counts the refused calls in `metrics` (`calls_refused`): the layer's own refusals, and a
    /// service's answer `PERMISSION_DENIED` or `UNAUTHENTICATED` (a Writer call beyond the
    /// caller's rights).
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            auth: self.auth.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// The service of [`AuthLayer`].
#[derive(Debug, Clone)]
pub struct AuthService<S> {
    inner: S,
    auth: Option<Arc<Auth>>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
}

impl<S, B, ResBody> tower::Service<http::Request<B>> for AuthService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let Some(auth) = self.auth.clone() else {
            return Box::pin(inner.call(req));
        };
        if open_path(req.uri().path()) {
            return Box::pin(inner.call(req));
        }
        // Only the credentials cross an await (the body need not be `Sync`).
        let mut credentials = http::HeaderMap::new();
        if let Some(v) = req.headers().get(http::header::AUTHORIZATION) {
            credentials.insert(http::header::AUTHORIZATION, v.clone());
        }
        let admin = req.uri().path().starts_with("/clb.v1.Admin/");
        let metrics = self.metrics.clone();
        let path = req.uri().path().to_owned();
        Box::pin(async move {
            let checked = async {
                let caller = auth.authenticate(&credentials).await?;
                if admin {
                    caller.require(Verb::Get, "").await?;
                }
                Ok::<_, Status>(caller)
            }
            .await;
            match checked {
                Ok(caller) => {
                    req.extensions_mut().insert(caller);
                    let response = inner.call(req).await?;
                    // A service's own refusal (a writer beyond its rights) is a trailers-only
                    // answer: its status is in the headers.
                    let code = response
                        .headers()
                        .get("grpc-status")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<i32>().ok())
                        .map(tonic::Code::from_i32);
                    if let (
                        Some(m),
                        Some(c @ (tonic::Code::PermissionDenied | tonic::Code::Unauthenticated)),
                    ) = (&metrics, code)
                    {
                        m.call_refused(&path, c);
                    }
                    Ok(response)
                }
                Err(status) => {
                    tracing::debug!(path = %path, %status, "call refused");
                    if let Some(m) = &metrics {
                        m.call_refused(&path, status.code());
                    }
                    Ok(status.into_http())
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_expires_entries_after_their_ttl() {
        let t0 = Instant::now();
        let mut c = TtlCache::new(10);
        c.insert("a", 1, Duration::from_secs(30), t0);
        assert_eq!(c.get(&"a", t0 + Duration::from_secs(29)), Some(1));
        assert_eq!(c.get(&"a", t0 + Duration::from_secs(30)), None);
        assert!(c.is_empty(), "an expired entry is dropped when read");
    }

    #[test]
    fn the_cache_is_bounded_evicting_expired_then_the_oldest() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(30);
        let mut c = TtlCache::new(3);
        for (i, k) in ["a", "b", "c"].into_iter().enumerate() {
            c.insert(k, i, ttl, t0 + Duration::from_secs(i as u64));
        }
        // Full: the entry closest to expiry ("a") goes.
        c.insert("d", 3, ttl, t0 + Duration::from_secs(3));
        assert_eq!(c.len(), 3);
        let now = t0 + Duration::from_secs(4);
        assert_eq!(c.get(&"a", now), None);
        assert_eq!(c.get(&"b", now), Some(1));
        // Later, "b" and "c" expired: both go before anything live is evicted.
        let later = t0 + Duration::from_secs(32) + Duration::from_millis(500);
        c.insert("e", 4, ttl, later);
        assert_eq!(c.len(), 2);
        assert_eq!(c.get(&"d", later), Some(3));
        assert_eq!(c.get(&"e", later), Some(4));
        for i in 0..1000 {
            c.insert(["x", "y", "z", "w"][i % 4], i, ttl, later);
            assert!(c.len() <= 3);
        }
    }

    #[test]
    fn bearer_tokens_are_parsed_strictly() {
        let h = |v: &str| {
            let mut m = http::HeaderMap::new();
            m.insert(http::header::AUTHORIZATION, v.parse().unwrap());
            m
        };
        assert_eq!(bearer(&h("Bearer abc")).unwrap(), "abc");
        assert_eq!(bearer(&h("bearer  abc ")).unwrap(), "abc");
        for bad in ["Basic abc", "Bearer", "Bearer   ", "abc"] {
            let e = bearer(&h(bad)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{bad}");
        }
        let e = bearer(&http::HeaderMap::new()).unwrap_err();
        assert!(e.message().contains("no bearer token"), "{}", e.message());
    }

    #[test]
    fn the_node_comes_from_the_bound_token_extra() {
        let mut id = Identity::default();
        assert_eq!(id.node(), None);
        id.extra
            .insert(NODE_NAME_EXTRA.to_owned(), vec!["node-a".to_owned()]);
        assert_eq!(id.node(), Some("node-a"));
    }
}
