//! Who may talk to the server: the checks every request passes before a handler
//! sees it.
//!
//! A local server is reachable from every web page the user opens: a hostile
//! page can POST "simple" cross-site requests blind, and with DNS rebinding
//! (its own name resolving to 127.0.0.1) read the answers too. So:
//!
//! - **Host**: only names that cannot be rebound are accepted: IP literals (a
//!   page cannot make a browser send `Host: 127.0.0.1` for its own name),
//!   `localhost` / `*.localhost` (browsers resolve them to loopback themselves),
//!   the name given to `--host`, and names allowed with `--allowed-host`
//!   (`*`: any, for a server behind a trusted proxy). Anything else: 403.
//! - **Origin**: browsers send it on every cross-origin request and on every
//!   POST; a request from a foreign origin is refused (403) unless the origin is
//!   allowed with `--cors-origin`. CORS preflights are answered only for those.
//! - **Content-Type**: JSON endpoints refuse bodies declared as anything but
//!   JSON (415), so the form and `text/plain` bodies a page may send without a
//!   preflight fail even where a browser omits `Origin`. A body without a type,
//!   or `application/x-www-form-urlencoded` (what `curl -d` sends), is accepted
//!   only without an `Origin` header: it then comes from a program, not a page.
//! - **API key**: compared in constant time ([`key_matches`]).

use axum::http::{header, HeaderMap, HeaderValue, Method};

/// Access settings (the `--allowed-host` and `--cors-origin` flags).
#[derive(Debug, Clone, Default)]
pub struct AccessConfig {
    /// Extra `Host` names to accept (lower-case, without port); `*` accepts any.
    pub allowed_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`) whose pages may call the API; `*`: any.
    pub cors_origins: Vec<String>,
}

/// Why a request was refused before reaching its handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The `Host` header names a host this server does not answer for (403).
    Host(String),
    /// The request comes from a web page of a foreign origin (403).
    Origin(String),
    /// The body is not declared as JSON (415).
    ContentType(String),
}

impl Refusal {
    /// The message sent to the client.
    pub fn message(&self) -> String {
        match self {
            Refusal::Host(h) => format!(
                "host '{h}' is not allowed (DNS rebinding protection); \
                 start the server with --allowed-host {h} to accept it"
            ),
            Refusal::Origin(o) => format!(
                "cross-origin requests from '{o}' are not allowed; \
                 start the server with --cors-origin {o} to accept them"
            ),
            Refusal::ContentType(t) => {
                format!("unsupported Content-Type '{t}': send the body as application/json")
            }
        }
    }
}

/// The host name of a `Host` header value (no port, no IPv6 brackets, lower case).
fn host_name(host: &str) -> String {
    let h = host.trim();
    let name = if let Some(rest) = h.strip_prefix('[') {
        // `[::1]:8080`: the address between the brackets.
        rest.split(']').next().unwrap_or("")
    } else {
        match h.rsplit_once(':') {
            Some((n, port)) if port.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => h,
        }
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether a request with this `Host` value may be answered; `bound` is the
/// `--host` value the server listens on.
pub fn host_allowed(host: &str, bound: &str, cfg: &AccessConfig) -> bool {
    let name = host_name(host);
    if name.is_empty() {
        return false;
    }
    name.parse::<std::net::IpAddr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || name == host_name(bound)
        || cfg
            .allowed_hosts
            .iter()
            .any(|a| a == "*" || host_name(a) == name)
}

/// Whether `origin` (an `Origin` header) is allowed by `--cors-origin`.
pub fn cors_allowed(origin: &str, cfg: &AccessConfig) -> bool {
    let o = origin.trim().trim_end_matches('/');
    cfg.cors_origins
        .iter()
        .any(|a| a == "*" || a.trim_end_matches('/').eq_ignore_ascii_case(o))
}

/// Whether `origin` is the server's own (a page it served, e.g. the status
/// page): `http(s)://` plus the request's `Host`.
fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else { return false };
    let o = origin.trim().to_ascii_lowercase();
    let host = host.trim().to_ascii_lowercase();
    o.strip_prefix("http://")
        .or_else(|| o.strip_prefix("https://"))
        .is_some_and(|rest| rest == host)
}

/// Whether a declared body type is JSON (`application/json`, `…+json`).
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Checks a request's `Host`, `Origin` and (for bodies) `Content-Type`.
pub fn check(
    method: &Method,
    headers: &HeaderMap,
    bound: &str,
    cfg: &AccessConfig,
) -> Result<(), Refusal> {
    let text =
        |name: header::HeaderName| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    let host = text(header::HOST);
    if let Some(h) = host {
        if !host_allowed(h, bound, cfg) {
            return Err(Refusal::Host(host_name(h)));
        }
    }
    let origin = text(header::ORIGIN);
    if let Some(o) = origin {
        if !cors_allowed(o, cfg) && !same_origin(o, host) {
            return Err(Refusal::Origin(o.to_string()));
        }
    }
    if *method == Method::POST || *method == Method::PUT || *method == Method::PATCH {
        match text(header::CONTENT_TYPE) {
            Some(t) if is_json(t) => {}
            // `curl -d` and scripts that forget the header: programs, not pages.
            None if origin.is_none() => {}
            Some(t)
                if origin.is_none()
                    && t.trim()
                        .to_ascii_lowercase()
                        .starts_with("application/x-www-form-urlencoded") => {}
            Some(t) => return Err(Refusal::ContentType(t.to_string())),
            None => return Err(Refusal::ContentType(String::new())),
        }
    }
    Ok(())
}

/// Whether a request is a CORS preflight (`OPTIONS` with
/// `Access-Control-Request-Method`).
pub fn is_preflight(method: &Method, headers: &HeaderMap) -> bool {
    *method == Method::OPTIONS
        && headers.contains_key(header::ORIGIN)
        && headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// The CORS headers of an answer to `origin` when it is allowed (preflights
/// also get the methods, headers and cache time).
pub fn cors_headers(
    origin: Option<&HeaderValue>,
    preflight: Option<&HeaderMap>,
    cfg: &AccessConfig,
) -> Vec<(header::HeaderName, HeaderValue)> {
    let Some(origin) = origin else {
        return Vec::new();
    };
    if !origin.to_str().is_ok_and(|o| cors_allowed(o, cfg)) {
        return Vec::new();
    }
    let mut out = vec![
        (header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone()),
        (header::VARY, HeaderValue::from_static("Origin")),
    ];
    if let Some(req) = preflight {
        out.push((
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        ));
        if let Some(h) = req.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
            out.push((header::ACCESS_CONTROL_ALLOW_HEADERS, h.clone()));
        }
        out.push((
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        ));
    }
    out
}

/// Compares a presented key with the server's in time that depends only on
/// their lengths, not on where they differ (no byte-by-byte timing oracle).
pub fn key_matches(presented: &str, key: &str) -> bool {
    let (a, b) = (presented.as_bytes(), key.as_bytes());
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    // Keep the optimizer from turning the fold into an early exit.
    std::hint::black_box(diff) == 0
}

/// Whether the request presents `key` (`Authorization: Bearer KEY` or
/// `x-api-key: KEY`); both headers are always compared, in constant time.
pub fn authorized(h: &HeaderMap, key: &str) -> bool {
    let bearer = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let x_key = h
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let b = bearer.is_some_and(|p| key_matches(p, key));
    let x = x_key.is_some_and(|p| key_matches(p, key));
    b | x
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(hosts: &[&str], origins: &[&str]) -> AccessConfig {
        AccessConfig {
            allowed_hosts: hosts.iter().map(|s| s.to_string()).collect(),
            cors_origins: origins.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn hosts() {
        let c = cfg(&[], &[]);
        for ok in [
            "localhost:11435",
            "LOCALHOST",
            "127.0.0.1:1",
            "[::1]:11435",
            "[::1]",
            "192.168.1.5:11435",
            "app.localhost:80",
        ] {
            assert!(host_allowed(ok, "127.0.0.1", &c), "{ok}");
        }
        for bad in [
            "evil.example:11435",
            "localhost.evil.example",
            "",
            "127.0.0.1.nip.io",
        ] {
            assert!(!host_allowed(bad, "127.0.0.1", &c), "{bad}");
        }
        assert!(host_allowed("box.lan:1", "box.lan", &c));
        assert!(host_allowed(
            "Box.LAN:1",
            "0.0.0.0",
            &cfg(&["box.lan"], &[])
        ));
        assert!(host_allowed("anything:1", "0.0.0.0", &cfg(&["*"], &[])));
    }

    #[test]
    fn origins_and_types() {
        let c = cfg(&[], &["https://app.example"]);
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:8".parse().unwrap());
        h.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        assert!(matches!(
            check(&Method::POST, &h, "127.0.0.1", &c),
            Err(Refusal::ContentType(_))
        ));
        h.insert(
            header::CONTENT_TYPE,
            "application/json; charset=utf-8".parse().unwrap(),
        );
        assert_eq!(check(&Method::POST, &h, "127.0.0.1", &c), Ok(()));
        h.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert!(matches!(
            check(&Method::GET, &h, "127.0.0.1", &c),
            Err(Refusal::Origin(_))
        ));
        h.insert(header::ORIGIN, "https://app.example".parse().unwrap());
        assert_eq!(check(&Method::POST, &h, "127.0.0.1", &c), Ok(()));
        h.insert(header::ORIGIN, "http://127.0.0.1:8".parse().unwrap());
        assert_eq!(check(&Method::GET, &h, "127.0.0.1", &c), Ok(()));
        // Form bodies: fine from curl, refused from a page.
        h.insert(
            header::CONTENT_TYPE,
            "application/x-www-form-urlencoded".parse().unwrap(),
        );
        assert!(check(&Method::POST, &h, "127.0.0.1", &c).is_err());
        h.remove(header::ORIGIN);
        assert_eq!(check(&Method::POST, &h, "127.0.0.1", &c), Ok(()));
    }

    #[test]
    fn keys() {
        assert!(key_matches("secret", "secret"));
        assert!(!key_matches("secreT", "secret"));
        assert!(!key_matches("secret1", "secret"));
        assert!(!key_matches("", "secret"));
        let mut h = HeaderMap::new();
        assert!(!authorized(&h, "k"));
        h.insert(header::AUTHORIZATION, "Bearer k".parse().unwrap());
        assert!(authorized(&h, "k"));
        assert!(!authorized(&h, "other"));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "k".parse().unwrap());
        assert!(authorized(&h, "k"));
    }
}
