//! Authentication and tenants (docs/http-api.md, "Authentication and tenants").
//!
//! The `[[server.api_keys]]` of the configuration become a [`KeyRing`] when the server
//! starts: only the sha256 of each key is kept, and a presented key is compared with every
//! stored hash in constant time. A request's key (`Authorization: Bearer KEY` or
//! `x-api-key: KEY`) yields its [`Principal`]: an admin, or a tenant bound to one account and
//! optionally to some owner spaces. Every route declares its [`Access`] in
//! [`super::ROUTES`]; the [`gate`] middleware of each route authenticates, refuses
//! admin-only routes to tenants, and hands the principal to the handler as a request
//! extension. With no keys configured, every caller is the admin (single-user mode).
//!
//! [`Principal`] holds the pure tenancy rules (which URIs, owner spaces and search filters
//! a caller may use); [`super::scope::Scope`] applies them to the store.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ce_core::config::{ServerConfig, check_api_key};
use ce_core::{Classify, CoreError, CtxUri, ErrorCode, OwnerSpace, sha256_hex};
use ce_index::vector::SearchFilter;
use ce_store::StoreError;

use super::error::ApiError;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, without a key (`/healthz`, `/readyz`).
    Open,
    /// Any key; the handler scopes the request to the key's [`Principal`].
    Tenant,
    /// Admin keys only (outbox, status, reindex, metrics).
    Admin,
}

/// The caller, as its API key says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// Sees and may change everything (an admin key, or any caller when no key is set).
    Admin,
    /// Bound to one account.
    Tenant(Tenant),
}

/// What a tenant key may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// The account: the first URI segment of every node it may address.
    pub account_id: String,
    /// The owner spaces it sees within the account; `None`: all of them.
    pub owner_spaces: Option<BTreeSet<OwnerSpace>>,
}

/// A request the caller's key does not allow.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AuthError {
    /// No key in the request.
    #[error("missing API key: send `Authorization: Bearer <key>` or `x-api-key: <key>`")]
    MissingKey,
    /// An `Authorization` header of another scheme than `Bearer`.
    #[error("unsupported authorization scheme: send `Authorization: Bearer <key>`")]
    BadScheme,
    /// A key the server does not know.
    #[error("unknown API key")]
    UnknownKey,
    /// A known key without the right.
    #[error("{0}")]
    Forbidden(String),
    /// A node the caller may not see: answered exactly like a node that does not exist.
    #[error("node {uri} not found")]
    Hidden {
        /// The node asked for.
        uri: CtxUri,
    },
}

impl Classify for AuthError {
    fn code(&self) -> ErrorCode {
        match self {
            AuthError::MissingKey | AuthError::BadScheme | AuthError::UnknownKey => {
                ErrorCode::Unauthenticated
            }
            AuthError::Forbidden(_) => ErrorCode::Forbidden,
            AuthError::Hidden { .. } => ErrorCode::NotFound,
        }
    }

    fn is_retryable(&self) -> bool {
        match self {
            AuthError::MissingKey
            | AuthError::BadScheme
            | AuthError::UnknownKey
            | AuthError::Forbidden(_)
            | AuthError::Hidden { .. } => false,
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            // The very answer of a miss, so that a hidden node cannot be told from none.
            AuthError::Hidden { uri } => ApiError::from(StoreError::NodeNotFound { uri }),
            other => ApiError::classified(&other),
        }
    }
}

impl Principal {
    /// Whether this is the admin.
    pub fn is_admin(&self) -> bool {
        matches!(self, Principal::Admin)
    }

    /// The tenant's account (`None` for the admin).
    pub fn account_id(&self) -> Option<&str> {
        match self {
            Principal::Admin => None,
            Principal::Tenant(t) => Some(&t.account_id),
        }
    }

    /// Whether visibility depends on a node's owner space, so that checks must read it.
    pub fn restricts_spaces(&self) -> bool {
        matches!(
            self,
            Principal::Tenant(Tenant {
                owner_spaces: Some(_),
                ..
            })
        )
    }

    /// Whether `uri` lies in the caller's account (the root `ctx://` does not).
    pub fn in_account(&self, uri: &CtxUri) -> bool {
        match self {
            Principal::Admin => true,
            Principal::Tenant(t) => !uri.is_root() && uri.account_id() == t.account_id,
        }
    }

    /// Whether the caller sees nodes of owner space `owner` (in its account).
    pub fn may_own(&self, owner: &OwnerSpace) -> bool {
        match self {
            Principal::Admin
            | Principal::Tenant(Tenant {
                owner_spaces: None, ..
            }) => true,
            Principal::Tenant(Tenant {
                owner_spaces: Some(s),
                ..
            }) => s.contains(owner),
        }
    }

    /// Whether the caller sees the node at `uri` owned by `owner`.
    pub fn visible(&self, uri: &CtxUri, owner: &OwnerSpace) -> bool {
        self.in_account(uri) && self.may_own(owner)
    }

    /// Reads: a URI outside the caller's account is [`AuthError::Hidden`] (404, like a miss).
    pub fn check_read(&self, uri: &CtxUri) -> Result<(), AuthError> {
        if self.in_account(uri) {
            Ok(())
        } else {
            Err(AuthError::Hidden { uri: uri.clone() })
        }
    }

    /// Writes: a URI outside the caller's account is [`AuthError::Forbidden`] (403; it
    /// says nothing about whether the node exists).
    pub fn check_write(&self, uri: &CtxUri) -> Result<(), AuthError> {
        match self {
            Principal::Tenant(t) if !self.in_account(uri) => Err(AuthError::Forbidden(format!(
                "{uri} is outside account {:?} of this API key",
                t.account_id
            ))),
            Principal::Admin | Principal::Tenant(_) => Ok(()),
        }
    }

    /// Writes that would leave a node in owner space `owner`: [`AuthError::Forbidden`]
    /// unless the caller sees that space.
    pub fn check_owner(&self, uri: &CtxUri, owner: &OwnerSpace) -> Result<(), AuthError> {
        if self.may_own(owner) {
            Ok(())
        } else {
            Err(AuthError::Forbidden(format!(
                "{uri} would be in owner space {owner}, outside the owner spaces of this API key"
            )))
        }
    }

    /// Routes for the admin only.
    pub fn require_admin(&self) -> Result<(), AuthError> {
        if self.is_admin() {
            Ok(())
        } else {
            Err(AuthError::Forbidden(
                "this route needs an admin API key".into(),
            ))
        }
    }

    /// Forces a search filter into the caller's scope: the account becomes the caller's,
    /// and a restricted key's owner spaces become the filter's (or the subset it asks
    /// for). A filter that asks for another account (by `account_id`, `subtree` or
    /// `parent_uri`) or for an owner space the key lacks is refused with 403 rather than
    /// silently changed.
    pub fn scope_filter(&self, filter: &mut SearchFilter) -> Result<(), AuthError> {
        let Principal::Tenant(t) = self else {
            return Ok(());
        };
        let forbidden = |what: String| {
            AuthError::Forbidden(format!(
                "search {what}, outside account {:?} of this API key",
                t.account_id
            ))
        };
        if let Some(a) = &filter.account_id
            && *a != t.account_id
        {
            return Err(forbidden(format!("asks for account {a:?}")));
        }
        for (name, uri) in [
            ("subtree", &filter.subtree),
            ("parent_uri", &filter.parent_uri),
        ] {
            if let Some(u) = uri
                && !u.is_root()
                && u.account_id() != t.account_id
            {
                return Err(forbidden(format!("asks for {name} {u}")));
            }
        }
        filter.account_id = Some(t.account_id.clone());
        if let Some(spaces) = &t.owner_spaces {
            match &filter.owner_spaces {
                Some(asked) => {
                    for o in asked {
                        let ok = o.parse::<OwnerSpace>().is_ok_and(|o| spaces.contains(&o));
                        if !ok {
                            return Err(AuthError::Forbidden(format!(
                                "search asks for owner space {o:?}, outside the owner spaces of this API key"
                            )));
                        }
                    }
                }
                None => {
                    filter.owner_spaces = Some(spaces.iter().map(ToString::to_string).collect());
                }
            }
        }
        Ok(())
    }
}

/// The configured API keys, as hashes.
#[derive(Default)]
pub struct KeyRing {
    /// `(sha256_hex(key), principal)`.
    keys: Vec<(String, Principal)>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRing")
            .field("keys", &self.keys.len())
            .finish()
    }
}

impl KeyRing {
    /// No keys: single-user mode, every caller is the admin.
    pub fn open() -> Self {
        KeyRing::default()
    }

    /// The keys of `config`, reading `key_env` variables through `env`. A variable that is
    /// unset or holds an unusable key, or two entries holding the same key, is an
    /// `invalid_config` error naming the entry.
    pub fn from_config(
        config: &ServerConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, CoreError> {
        config.validate()?;
        let mut keys: Vec<(String, Principal)> = Vec::with_capacity(config.api_keys.len());
        for (i, k) in config.api_keys.iter().enumerate() {
            let bad = |field: &str, reason: String| CoreError::InvalidConfig {
                key: format!("server.api_keys[{i}].{field}"),
                reason,
            };
            let secret = match (&k.key, &k.key_env) {
                (Some(key), _) => key.clone(),
                (None, Some(var)) => {
                    let v = env(var).ok_or_else(|| {
                        bad("key_env", format!("environment variable {var} is not set"))
                    })?;
                    check_api_key(&v)
                        .map_err(|r| bad("key_env", format!("the key in {var} {r}")))?;
                    v
                }
                (None, None) => return Err(bad("key", "is missing".into())),
            };
            let principal = if k.admin {
                Principal::Admin
            } else {
                let spaces = k
                    .owner_spaces()
                    .map_err(|e| bad("owner_spaces", e.to_string()))?;
                Principal::Tenant(Tenant {
                    account_id: k.account_id.clone().unwrap_or_default(),
                    owner_spaces: (!spaces.is_empty()).then(|| spaces.into_iter().collect()),
                })
            };
            let hash = sha256_hex(secret.as_bytes());
            if let Some(j) = keys.iter().position(|(h, _)| *h == hash) {
                let field = if k.key.is_some() { "key" } else { "key_env" };
                return Err(bad(
                    field,
                    format!("holds the same key as server.api_keys[{j}]"),
                ));
            }
            keys.push((hash, principal));
        }
        Ok(KeyRing { keys })
    }

    /// Whether keys are configured (else single-user mode).
    pub fn is_enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key is configured.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The principal of the request's key (the admin in single-user mode).
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, AuthError> {
        if !self.is_enabled() {
            return Ok(Principal::Admin);
        }
        self.identify(presented_key(headers)?)
    }

    /// The principal of `key`. Every stored hash is compared, in constant time, so the time
    /// taken says nothing about which key (or how much of one) matched.
    pub fn identify(&self, key: &str) -> Result<Principal, AuthError> {
        let hash = sha256_hex(key.as_bytes());
        let mut found = None;
        for (h, p) in &self.keys {
            if constant_time_eq(h.as_bytes(), hash.as_bytes()) {
                found = Some(p);
            }
        }
        found.cloned().ok_or(AuthError::UnknownKey)
    }
}

/// The key of a request: `Authorization: Bearer KEY`, else `x-api-key: KEY`.
fn presented_key(headers: &HeaderMap) -> Result<&str, AuthError> {
    if let Some(v) = headers.get(header::AUTHORIZATION) {
        let v = v.to_str().map_err(|_| AuthError::UnknownKey)?.trim();
        let (scheme, key) = v.split_once(' ').ok_or(AuthError::BadScheme)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(AuthError::BadScheme);
        }
        return Ok(key.trim());
    }
    match headers.get("x-api-key") {
        Some(v) => Ok(v.to_str().map_err(|_| AuthError::UnknownKey)?.trim()),
        None => Err(AuthError::MissingKey),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    // Both are sha256 hex digests: the length is public.
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Refuses to serve `addr` when it is not a loopback address and no key is configured,
/// unless `server.allow_unauthenticated` says so.
pub fn check_bind(
    addr: SocketAddr,
    keys: &KeyRing,
    config: &ServerConfig,
) -> Result<(), CoreError> {
    if keys.is_enabled() || addr.ip().is_loopback() || config.allow_unauthenticated {
        return Ok(());
    }
    Err(CoreError::InvalidConfig {
        key: "server.api_keys".into(),
        reason: format!(
            "ce serve would listen on {addr}, not a loopback address, without API keys, so \
             every caller would see every account: configure [[server.api_keys]], bind \
             127.0.0.1, or set server.allow_unauthenticated = true"
        ),
    })
}

/// What the [`gate`] of one route needs.
#[derive(Debug, Clone)]
pub struct Gate {
    keys: Arc<KeyRing>,
    access: Access,
}

impl Gate {
    /// The gate of a route of `access`.
    pub fn new(keys: Arc<KeyRing>, access: Access) -> Self {
        Gate { keys, access }
    }

    /// The principal the route runs for (`None` for open routes), or why not.
    pub fn admit(&self, headers: &HeaderMap) -> Result<Option<Principal>, AuthError> {
        match self.access {
            Access::Open => Ok(None),
            Access::Tenant => self.keys.authenticate(headers).map(Some),
            Access::Admin => {
                let p = self.keys.authenticate(headers)?;
                p.require_admin()?;
                Ok(Some(p))
            }
        }
    }
}

/// The middleware of every route: authenticates, checks the route's [`Access`], and puts
/// the [`Principal`] into the request's extensions (`Extension<Principal>` in handlers).
pub async fn gate(State(g): State<Gate>, mut req: Request, next: Next) -> Response {
    match g.admit(req.headers()) {
        Ok(principal) => {
            if let Some(p) = principal {
                req.extensions_mut().insert(p);
            }
            next.run(req).await
        }
        Err(e) => {
            let unauthenticated = e.code() == ErrorCode::Unauthenticated;
            let mut res = ApiError::from(e).into_response();
            if unauthenticated {
                res.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            res
        }
    }
}

#[cfg(test)]
mod tests {
    use ce_core::config::ApiKeyConfig;

    use super::*;

    const KEY_A: &str = "key-of-account-a-0001";
    const KEY_ADMIN: &str = "key-of-the-admin-0001";

    fn ring() -> KeyRing {
        let config = ServerConfig {
            allow_unauthenticated: false,
            allowed_hosts: Vec::new(),
            api_keys: vec![
                ApiKeyConfig {
                    key_env: Some("CE_TEST_KEY_A".into()),
                    account_id: Some("a".into()),
                    owner_spaces: vec!["user:u1".into(), "shared".into()],
                    ..ApiKeyConfig::default()
                },
                ApiKeyConfig {
                    key: Some(KEY_ADMIN.into()),
                    admin: true,
                    ..ApiKeyConfig::default()
                },
            ],
        };
        KeyRing::from_config(&config, |v| (v == "CE_TEST_KEY_A").then(|| KEY_A.into()))
            .expect("ring")
    }

    fn u(s: &str) -> CtxUri {
        CtxUri::parse(s).expect("uri")
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("header"));
        }
        h
    }

    #[test]
    fn keys_map_to_principals_from_either_header() {
        let r = ring();
        let a = r
            .authenticate(&headers(&[("authorization", &format!("Bearer {KEY_A}"))]))
            .expect("bearer");
        assert_eq!(a.account_id(), Some("a"));
        assert!(a.restricts_spaces());
        assert_eq!(
            r.authenticate(&headers(&[("x-api-key", KEY_ADMIN)])),
            Ok(Principal::Admin)
        );
        assert_eq!(
            r.authenticate(&headers(&[("authorization", &format!("bearer  {KEY_A} "))])),
            Ok(a)
        );
        assert_eq!(
            r.authenticate(&HeaderMap::new()),
            Err(AuthError::MissingKey)
        );
        assert_eq!(
            r.authenticate(&headers(&[("authorization", "Basic abc")])),
            Err(AuthError::BadScheme)
        );
        assert_eq!(
            r.authenticate(&headers(&[("x-api-key", "key-of-account-a-0002")])),
            Err(AuthError::UnknownKey)
        );
        assert_eq!(
            KeyRing::open().authenticate(&HeaderMap::new()),
            Ok(Principal::Admin)
        );
        assert!(!format!("{r:?}").contains(KEY_ADMIN));
    }

    #[test]
    fn environment_keys_are_checked_at_start() {
        let config = |var: &str| ServerConfig {
            allow_unauthenticated: false,
            allowed_hosts: Vec::new(),
            api_keys: vec![
                ApiKeyConfig {
                    key: Some(KEY_A.into()),
                    admin: true,
                    ..ApiKeyConfig::default()
                },
                ApiKeyConfig {
                    key_env: Some(var.into()),
                    account_id: Some("b".into()),
                    ..ApiKeyConfig::default()
                },
            ],
        };
        let env = |v: &str| match v {
            "SAME" => Some(KEY_A.to_owned()),
            "SHORT" => Some("abc".to_owned()),
            _ => None,
        };
        for (var, want) in [
            (
                "UNSET",
                "server.api_keys[1].key_env: environment variable UNSET is not set",
            ),
            (
                "SHORT",
                "server.api_keys[1].key_env: the key in SHORT is shorter",
            ),
            (
                "SAME",
                "server.api_keys[1].key_env: holds the same key as server.api_keys[0]",
            ),
        ] {
            let e = KeyRing::from_config(&config(var), env).expect_err(var);
            assert!(e.to_string().contains(want), "{var}: {e}");
            assert_eq!(e.code(), ErrorCode::InvalidConfig);
        }
    }

    #[test]
    fn tenancy_rules() {
        let a = ring().identify(KEY_A).expect("a");
        let node = u("ctx://a/users/u1/x");
        assert!(a.visible(&node, &OwnerSpace::User("u1".into())));
        assert!(!a.visible(&node, &OwnerSpace::User("u2".into())));
        assert!(!a.visible(&u("ctx://b/x"), &OwnerSpace::Shared));
        assert!(!a.in_account(&CtxUri::root()));
        assert!(a.check_read(&node).is_ok());
        let hidden = a.check_read(&u("ctx://b/x")).expect_err("other account");
        assert_eq!(hidden.code(), ErrorCode::NotFound);
        let e = ApiError::from(hidden);
        assert_eq!(
            e.message,
            ApiError::from(StoreError::NodeNotFound {
                uri: u("ctx://b/x")
            })
            .message
        );
        assert_eq!(
            a.check_write(&u("ctx://b/x")).expect_err("write").code(),
            ErrorCode::Forbidden
        );
        assert_eq!(
            a.check_write(&CtxUri::root()).expect_err("root").code(),
            ErrorCode::Forbidden
        );
        assert_eq!(
            a.require_admin().expect_err("admin").code(),
            ErrorCode::Forbidden
        );
        assert!(Principal::Admin.check_write(&u("ctx://b/x")).is_ok());
    }

    #[test]
    fn search_filters_are_forced_into_the_scope() {
        let a = ring().identify(KEY_A).expect("a");
        let mut f = SearchFilter::default();
        a.scope_filter(&mut f).expect("scoped");
        assert_eq!(f.account_id.as_deref(), Some("a"));
        assert_eq!(
            f.owner_spaces,
            Some(vec!["user:u1".to_owned(), "shared".to_owned()])
        );
        let refused = |f: SearchFilter| {
            let mut f = f;
            a.scope_filter(&mut f).expect_err("refused").code()
        };
        for f in [
            SearchFilter {
                account_id: Some("b".into()),
                ..SearchFilter::default()
            },
            SearchFilter {
                subtree: Some(u("ctx://b")),
                ..SearchFilter::default()
            },
            SearchFilter {
                parent_uri: Some(u("ctx://b/docs")),
                ..SearchFilter::default()
            },
            SearchFilter {
                owner_spaces: Some(vec!["user:u2".into()]),
                ..SearchFilter::default()
            },
        ] {
            assert_eq!(refused(f), ErrorCode::Forbidden);
        }
        let mut narrower = SearchFilter {
            owner_spaces: Some(vec!["user:u1".into()]),
            account_id: Some("a".into()),
            ..SearchFilter::default()
        };
        a.scope_filter(&mut narrower).expect("own space");
        assert_eq!(narrower.owner_spaces, Some(vec!["user:u1".to_owned()]));
        let mut admin = SearchFilter::default();
        Principal::Admin.scope_filter(&mut admin).expect("admin");
        assert_eq!(admin, SearchFilter::default());
    }

    #[test]
    fn only_loopback_may_serve_without_keys() {
        let open = ServerConfig::default();
        let any: SocketAddr = "0.0.0.0:7420".parse().expect("addr");
        let local: SocketAddr = "127.0.0.1:7420".parse().expect("addr");
        assert!(check_bind(local, &KeyRing::open(), &open).is_ok());
        let e = check_bind(any, &KeyRing::open(), &open).expect_err("refused");
        assert!(
            e.to_string().contains("server.allow_unauthenticated"),
            "{e}"
        );
        assert!(check_bind(any, &ring(), &open).is_ok());
        let allowed = ServerConfig {
            allow_unauthenticated: true,
            ..ServerConfig::default()
        };
        assert!(check_bind(any, &KeyRing::open(), &allowed).is_ok());
    }
}
