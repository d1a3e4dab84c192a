//! What `dynrt serve` checks of every request before a handler sees it, and adds to every
//! answer: the request head's size, the `Host` (DNS rebinding), the `Origin` (cross-site
//! pages) and CORS, the API key, the content type of a body; then errors in OpenAI's shape
//! whatever produced them, `Retry-After` on 429 and 503, and one access-log line.
//!
//! A web page the user visits can send requests to a server on their machine: a
//! `text/plain` POST needs no CORS preflight, and a page whose name resolves to 127.0.0.1
//! (DNS rebinding) is not even cross-origin to the browser. So a body must say it is JSON
//! (415 otherwise: a page cannot send `application/json` elsewhere without a preflight that
//! this server answers only for `--cors-origins`), a request that names another site in
//! `Origin` is refused (403), and a server bound to a loopback or given address answers only
//! requests whose `Host` names it (403), unless `--allowed-host` says more.

use super::serve_api::ApiError;
use super::serve_metrics::Metrics;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

/// The longest request target answered (414 above), bytes.
pub const MAX_URI_BYTES: usize = 8 << 10;
/// The most header bytes (names and values) answered (431 above).
pub const MAX_HEADER_BYTES: usize = 32 << 10;
/// The most header fields answered (431 above).
pub const MAX_HEADERS: usize = 100;

/// `text` cut to at most `max_bytes` (on a character boundary), with `...` when cut: what
/// an error message or a log line repeats of a client's text.
pub fn truncated(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_string();
    }
    let end = (0..=max_bytes)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    format!("{}...", &text[..end])
}

/// Who sent a request, for the per-client budgets and the logs: the API key it gave (as a
/// hash: keys are never kept or logged), or its address when the server has no keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Client {
    /// A key's partition ([`cache_partition`]).
    Key(u64),
    /// The peer's address.
    Addr(IpAddr),
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Client::Key(k) => write!(f, "key:{k:016x}"),
            Client::Addr(a) => a.fmt(f),
        }
    }
}

/// The number that keeps one client's cached prompt pages apart from another's: the first
/// bytes of the SHA-256 of its API key, or of its address without keys. Two requests share
/// prefix pages only when this is equal (`serve_api::Server::partition`).
pub fn cache_partition(client: &Client) -> u64 {
    match *client {
        Client::Key(k) => k,
        Client::Addr(a) => {
            let digest = Sha256::digest(a.to_string().as_bytes());
            u64::from_le_bytes(digest[..8].try_into().unwrap_or_default())
        }
    }
}

/// How the guard checks requests (from the command line).
#[derive(Debug, Default)]
pub struct Policy {
    /// SHA-256 of each accepted API key; empty: no key needed.
    pub key_hashes: Vec<[u8; 32]>,
    /// Origins (`scheme://host[:port]`) allowed cross-origin, `*` for all.
    pub cors_origins: Vec<String>,
    /// Host names (without port) requests may name, beside the bound address's; `None`:
    /// any (the server listens on every interface, or `--allowed-host '*'`).
    pub hosts: Option<Vec<String>>,
}

impl Policy {
    /// The policy of a server bound to `bind` (the `--host` given) with `extra_hosts`
    /// (`--allowed-host`), `cors_origins` and `keys`.
    pub fn new(
        bind: &str,
        extra_hosts: &[String],
        cors_origins: &[String],
        keys: &[String],
    ) -> Policy {
        let key_hashes = keys
            .iter()
            .map(|k| Sha256::digest(k.as_bytes()).into())
            .collect();
        let unspecified = bind
            .trim_matches(|c| c == '[' || c == ']')
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_unspecified());
        let hosts = if unspecified || extra_hosts.iter().any(|h| h == "*") {
            None
        } else {
            let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            hosts.push(
                bind.trim_matches(|c| c == '[' || c == ']')
                    .to_ascii_lowercase(),
            );
            hosts.extend(extra_hosts.iter().map(|h| h.to_ascii_lowercase()));
            Some(hosts)
        };
        Policy {
            key_hashes,
            cors_origins: cors_origins.to_vec(),
            hosts,
        }
    }

    /// Whether requests need a key.
    pub fn needs_key(&self) -> bool {
        !self.key_hashes.is_empty()
    }

    /// The client of a request: its key's partition when it gave a key this server
    /// accepts, else `Err` with what to say (no keys: its address).
    fn authenticate(&self, headers: &HeaderMap, peer: IpAddr) -> Result<Client, ApiError> {
        if !self.needs_key() {
            return Ok(Client::Addr(peer));
        }
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
        let Some(given) = given else {
            return Err(unauthorized(
                "this server needs an API key: send `Authorization: Bearer KEY` or `X-Api-Key: KEY`",
            ));
        };
        let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        // Every stored hash is compared in full, whichever matches.
        let found = self
            .key_hashes
            .iter()
            .fold(false, |found, h| found | constant_time_eq(h, &digest));
        if found {
            Ok(Client::Key(u64::from_le_bytes(
                digest[..8].try_into().unwrap_or_default(),
            )))
        } else {
            Err(unauthorized(
                "the API key given is not one this server accepts",
            ))
        }
    }

    /// Whether `host` (the `Host` header, with or without port) names this server.
    fn host_allowed(&self, host: &str) -> bool {
        let Some(hosts) = &self.hosts else {
            return true;
        };
        hosts.iter().any(|h| *h == host_name(host))
    }

    /// Whether a request with `origin` may be answered, and then whether CORS headers
    /// allow a page of that origin to read the answer.
    fn origin(&self, origin: &str, host: Option<&str>) -> (bool, bool) {
        let listed = self.cors_origins.iter().any(|o| o == "*" || o == origin);
        let same = host.is_some_and(|h| {
            origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                == Some(h)
        });
        (listed || same, listed)
    }
}

/// The name in a `Host` header: lower case, without port, without the brackets of an IPv6
/// address.
fn host_name(host: &str) -> String {
    let host = host.trim();
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                name
            } else {
                host
            }
        })
    };
    name.to_ascii_lowercase()
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "invalid_request_error",
        message,
        Some("invalid_api_key"),
    )
}

fn forbidden(message: String, code: &'static str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "invalid_request_error",
        message,
        Some(code),
    )
}

/// Paths answered without a key: the health check and the dashboard's page (its data,
/// `/v1/memory`, needs the key).
fn public(path: &str) -> bool {
    matches!(path, "/health" | "/")
}

/// Whether a content type is JSON (`application/json`, parameters allowed).
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// What the guard knows: its policy, and where it counts the answers.
#[derive(Debug)]
pub struct Guarded {
    /// The checks.
    pub policy: Policy,
    /// Answers by status.
    pub metrics: Arc<Metrics>,
}

/// The guard's state.
pub type Shared = Arc<Guarded>;

/// The middleware: checks, then the handler, then the answer made uniform and logged.
pub async fn guard(State(guarded): State<Shared>, mut request: Request, next: Next) -> Response {
    let policy = &guarded.policy;
    let started = Instant::now();
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let origin = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (response, client) = match check(policy, &mut request, peer, origin.as_deref()) {
        Err(e) => (e.into_response(), None),
        Ok(Checked::Preflight(r)) => (r, None),
        Ok(Checked::Pass(client)) => {
            request.extensions_mut().insert(client);
            (next.run(request).await, Some(client))
        }
    };
    let mut response = uniform(response, &method, &path);
    if let Some(o) = &origin {
        let (_, cors) = policy.origin(o, None);
        if cors {
            add_cors(response.headers_mut(), o);
        }
    }
    guarded.metrics.response(response.status().as_u16());
    log::info!(
        target: "dynrt::access",
        "{} {} {} {} {} {:.1} ms",
        client.map_or_else(|| peer.ip().to_string(), |c| c.to_string()),
        method,
        truncated(&path, 200),
        response.status().as_u16(),
        axum::body::HttpBody::size_hint(response.body())
            .exact()
            .map_or_else(|| "-".to_string(), |n| n.to_string()),
        started.elapsed().as_secs_f64() * 1e3,
    );
    response
}

enum Checked {
    /// The request goes on, from this client.
    Pass(Client),
    /// A CORS preflight, answered here.
    Preflight(Response),
}

fn check(
    policy: &Policy,
    request: &mut Request,
    peer: SocketAddr,
    origin: Option<&str>,
) -> Result<Checked, ApiError> {
    let uri_len = request.uri().to_string().len();
    if uri_len > MAX_URI_BYTES {
        return Err(ApiError::new(
            StatusCode::URI_TOO_LONG,
            "invalid_request_error",
            format!("the request target has {uri_len} bytes, more than the {MAX_URI_BYTES} this server reads"),
            None,
        ));
    }
    let headers = request.headers();
    let header_bytes: usize = headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len())
        .sum();
    if headers.len() > MAX_HEADERS || header_bytes > MAX_HEADER_BYTES {
        return Err(ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "invalid_request_error",
            format!(
                "{} header fields of {header_bytes} bytes: this server reads at most {MAX_HEADERS} \
                 fields of {MAX_HEADER_BYTES} bytes",
                headers.len()
            ),
            None,
        ));
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    if let Some(h) = host {
        if !policy.host_allowed(h) {
            return Err(forbidden(
                format!(
                    "this server does not answer requests for the host `{}`: start it with \
                     --allowed-host NAME to serve that name",
                    truncated(&host_name(h), 64)
                ),
                "host_not_allowed",
            ));
        }
    }
    if let Some(o) = origin {
        let (allowed, _) = policy.origin(o, host);
        if !allowed {
            return Err(forbidden(
                format!(
                    "requests from pages of `{}` are not allowed: start the server with \
                     --cors-origins ORIGIN to allow them",
                    truncated(o, 64)
                ),
                "origin_not_allowed",
            ));
        }
    }
    if request.method() == Method::OPTIONS {
        return Ok(Checked::Preflight(
            (
                StatusCode::NO_CONTENT,
                [(header::ALLOW, "GET, POST, OPTIONS")],
            )
                .into_response(),
        ));
    }
    let path = request.uri().path();
    let client = if public(path) {
        policy
            .authenticate(request.headers(), peer.ip())
            .unwrap_or(Client::Addr(peer.ip()))
    } else {
        policy.authenticate(request.headers(), peer.ip())?
    };
    if path == "/v1/memory" && !policy.needs_key() && !peer.ip().is_loopback() {
        return Err(forbidden(
            "/v1/memory shows every client's requests: without --api-key it answers only \
             this machine"
                .into(),
            "memory_needs_key",
        ));
    }
    if request.method() == Method::POST {
        let content_type = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !is_json(content_type) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                format!(
                    "the body must be JSON sent as `Content-Type: application/json`, not `{}`",
                    truncated(content_type, 64)
                ),
                None,
            ));
        }
    }
    Ok(Checked::Pass(client))
}

/// CORS headers that let a page of `origin` read the answer and send the headers a client
/// of this API sends.
fn add_cors(headers: &mut HeaderMap, origin: &str) {
    if let Ok(v) = HeaderValue::from_str(origin) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    headers.insert(header::VARY, HeaderValue::from_static("Origin"));
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("authorization, content-type, x-api-key"),
    );
    headers.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
}

/// An error answer in OpenAI's shape whoever made it (axum's 405, a body over the limit),
/// with `Retry-After` on 429 and 503.
fn uniform(response: Response, method: &Method, path: &str) -> Response {
    let status = response.status();
    let mut response = if status.is_client_error() || status.is_server_error() {
        let json = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(is_json);
        if json {
            response
        } else {
            let message = match status {
                StatusCode::METHOD_NOT_ALLOWED => format!(
                    "{method} is not allowed on {}: use {}",
                    truncated(path, 100),
                    response
                        .headers()
                        .get(header::ALLOW)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("another method")
                ),
                s => format!(
                    "{} {}",
                    s.as_u16(),
                    s.canonical_reason().unwrap_or("error").to_lowercase()
                ),
            };
            let kind = if status.is_server_error() {
                "server_error"
            } else {
                "invalid_request_error"
            };
            let (mut parts, _) = response.into_parts();
            parts.headers.remove(header::CONTENT_LENGTH);
            let body = ApiError::new(status, kind, message, None)
                .body()
                .to_string();
            parts.headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            Response::from_parts(parts, Body::from(body))
        }
    } else {
        response
    };
    if matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    ) && !response.headers().contains_key(header::RETRY_AFTER)
    {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_lose_their_port_and_brackets() {
        assert_eq!(host_name("LocalHost:8080"), "localhost");
        assert_eq!(host_name("[::1]:80"), "::1");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert_eq!(host_name("evil.example:1234"), "evil.example");
    }

    #[test]
    fn a_loopback_server_answers_only_its_own_names() {
        let p = Policy::new("127.0.0.1", &[], &[], &[]);
        assert!(p.host_allowed("127.0.0.1:8080"));
        assert!(p.host_allowed("localhost"));
        assert!(!p.host_allowed("evil.example:8080"));
        let p = Policy::new("127.0.0.1", &["my.lan".into()], &[], &[]);
        assert!(p.host_allowed("my.lan:80"));
        let p = Policy::new("0.0.0.0", &[], &[], &[]);
        assert!(p.host_allowed("evil.example"));
    }

    #[test]
    fn origins_pass_when_listed_or_the_same_site() {
        let p = Policy::new("127.0.0.1", &[], &["https://app.example".into()], &[]);
        assert_eq!(p.origin("https://app.example", None), (true, true));
        assert_eq!(
            p.origin("http://127.0.0.1:8080", Some("127.0.0.1:8080")),
            (true, false)
        );
        assert_eq!(
            p.origin("https://evil.example", Some("127.0.0.1:8080")),
            (false, false)
        );
        assert_eq!(p.origin("null", Some("127.0.0.1:8080")), (false, false));
    }

    #[test]
    fn keys_are_taken_from_either_header_and_compared_whole() {
        let p = Policy::new("127.0.0.1", &[], &[], &["sesame".into(), "other".into()]);
        let ip = IpAddr::from([127, 0, 0, 1]);
        let mut h = HeaderMap::new();
        assert!(p.authenticate(&h, ip).is_err());
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer sesame"),
        );
        let a = p.authenticate(&h, ip).unwrap();
        let mut h2 = HeaderMap::new();
        h2.insert("x-api-key", HeaderValue::from_static("sesame"));
        assert_eq!(p.authenticate(&h2, ip).unwrap(), a);
        h2.insert("x-api-key", HeaderValue::from_static("sesam"));
        assert!(p.authenticate(&h2, ip).is_err());
        h2.insert("x-api-key", HeaderValue::from_static("other"));
        assert_ne!(p.authenticate(&h2, ip).unwrap(), a);
        assert_ne!(cache_partition(&a), 0);
    }

    #[test]
    fn text_is_cut_on_a_character_boundary() {
        assert_eq!(truncated("abc", 5), "abc");
        assert_eq!(truncated("abcdef", 3), "abc...");
        assert_eq!(truncated("ééé", 3), "é...");
    }
}
