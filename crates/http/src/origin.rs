//! What a web page could make a browser send to the API: a request from another site's
//! page (cross-site request forgery), and one to a name the page's site rebound to a
//! loopback address (DNS rebinding). Neither needs a token when authentication is off,
//! which is how `agentloop dev` runs on a developer's machine.

use http::header::{HOST, ORIGIN};
use http::{HeaderMap, Method, Uri};
use tonic::Status;

/// Refuses, before the API sees it:
/// - on a loopback listener, a request whose host is not a loopback name or address;
/// - a request that changes state (not GET or HEAD) whose `Origin` is not this server.
///
/// A client that is not a browser sends no `Origin` and is not concerned.
pub(crate) fn check(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    loopback: bool,
) -> Result<(), Status> {
    let host = headers
        .get(HOST)
        .and_then(|host| host.to_str().ok())
        .or_else(|| uri.authority().map(http::uri::Authority::as_str));
    if loopback
        && let Some(host) = host
        && !is_loopback_name(host)
    {
        return Err(Status::permission_denied(format!(
            "host {host:?} is not a loopback name: this server listens on loopback only"
        )));
    }
    if matches!(*method, Method::GET | Method::HEAD) {
        return Ok(());
    }
    let Some(origin) = headers.get(ORIGIN) else {
        return Ok(());
    };
    let same = origin
        .to_str()
        .ok()
        .zip(host)
        .is_some_and(|(origin, host)| {
            origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .is_some_and(|origin| origin.eq_ignore_ascii_case(host))
        });
    match same {
        true => Ok(()),
        false => Err(Status::permission_denied(
            "a request from another site's page is refused",
        )),
    }
}

/// `localhost`, a name under `.localhost`, `127.0.0.0/8` or `[::1]`, with or without a
/// port.
fn is_loopback_name(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
    };
    let name = name.to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(host: &str, origin: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_str(host).unwrap());
        if let Some(origin) = origin {
            headers.insert(ORIGIN, HeaderValue::from_str(origin).unwrap());
        }
        headers
    }

    fn allowed(method: Method, host: &str, origin: Option<&str>, loopback: bool) -> bool {
        check(
            &method,
            &Uri::from_static("/"),
            &headers(host, origin),
            loopback,
        )
        .is_ok()
    }

    #[test]
    fn a_rebound_name_cannot_reach_a_loopback_listener() {
        for host in [
            "127.0.0.1:50080",
            "localhost:50080",
            "[::1]:50080",
            "app.localhost",
        ] {
            assert!(allowed(Method::GET, host, None, true), "{host}");
        }
        for host in [
            "evil.example:50080",
            "10.0.0.1:50080",
            "127.0.0.1.evil.example",
        ] {
            assert!(!allowed(Method::GET, host, None, true), "{host}");
        }
        // Beyond loopback the names are the operator's (and auth is on).
        assert!(allowed(Method::GET, "api.example", None, false));
    }

    #[test]
    fn another_sites_page_cannot_change_state() {
        let host = "127.0.0.1:50080";
        assert!(
            allowed(Method::POST, host, None, true),
            "curl sends no Origin"
        );
        assert!(allowed(
            Method::POST,
            host,
            Some("http://127.0.0.1:50080"),
            true
        ));
        assert!(!allowed(
            Method::POST,
            host,
            Some("http://evil.example"),
            true
        ));
        assert!(!allowed(Method::POST, host, Some("null"), true));
        assert!(!allowed(
            Method::POST,
            host,
            Some("http://127.0.0.1:9999"),
            true
        ));
        // Reading is not changing: the browser keeps another site from reading the answer.
        assert!(allowed(
            Method::GET,
            host,
            Some("http://evil.example"),
            true
        ));
    }
}
