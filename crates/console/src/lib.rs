//! The operator console: one HTML page, its script and its style sheet, compiled into
//! the binary so that it works offline and the page always matches the API it calls.
//!
//! The page does everything through the public HTTP/JSON API, as any other caller: it
//! has no access of its own, and the server checks its calls as it checks every call.
//! What the page must get right itself is what a browser adds:
//!
//! - **No script but ours runs.** The `Content-Security-Policy` allows scripts, styles
//!   and connections from this origin only: no inline script, no framing, no form
//!   posts. The script builds the page from text nodes, never from HTML, so a tool
//!   output holding `<script>` shows as text.
//! - **The token stays out of URLs.** It is typed into a form, kept in the tab's
//!   `sessionStorage` and sent in the `Authorization` header; the page's own routes are
//!   URL fragments, which no request carries.
//! - **No forged actions.** A state-changing call is a `fetch` with a JSON body (and,
//!   with authentication on, a bearer token), which another site's page cannot make the
//!   browser send with its user's credentials; the HTTP listener also refuses a non-GET
//!   request whose `Origin` is another site.

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY};
use http::{HeaderValue, Response, StatusCode};

/// Where the page is served.
pub const PATH: &str = "/";

/// What the page may load and do: only this origin's script, style and API; nothing
/// inline, no plug-ins, no frames around it, no form posts.
pub const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

const INDEX: &str = include_str!("../assets/index.html");
const SCRIPT: &str = include_str!("../assets/console.js");
const STYLE: &str = include_str!("../assets/console.css");

/// The console's answer to a GET of `path`, or `None` when the path is not one of its
/// files.
pub fn page(path: &str) -> Option<Response<Bytes>> {
    let (content_type, body) = match path {
        "/" | "/index.html" => ("text/html; charset=utf-8", INDEX),
        "/console.js" => ("text/javascript; charset=utf-8", SCRIPT),
        "/console.css" => ("text/css; charset=utf-8", STYLE),
        _ => return None,
    };
    let mut response = Response::new(Bytes::from_static(body.as_bytes()));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert("x-frame-options", HeaderValue::from_static("DENY"));
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    // Revalidated on each load, so a new binary's page is never mixed with an old script.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Some(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_file_is_served_with_its_type_and_the_policy() {
        for (path, kind) in [
            ("/", "text/html"),
            ("/console.js", "text/javascript"),
            ("/console.css", "text/css"),
        ] {
            let Some(response) = page(path) else {
                panic!("{path} is not served");
            };
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or_default()
            };
            assert!(header(CONTENT_TYPE.as_str()).starts_with(kind), "{path}");
            assert_eq!(header(CONTENT_SECURITY_POLICY.as_str()), POLICY, "{path}");
            assert_eq!(header("x-content-type-options"), "nosniff");
            assert!(!response.body().is_empty());
        }
        assert!(page("/v1/invocations").is_none());
        assert!(page("/console.js.map").is_none());
    }

    /// The policy forbids inline script and style, so the page may hold none: each would
    /// be silently blocked in the browser.
    #[test]
    fn the_page_holds_no_inline_script_style_or_handler() {
        let lower = INDEX.to_ascii_lowercase();
        assert_eq!(lower.matches("<script").count(), 1, "one script element");
        assert!(lower.contains(r#"<script src="/console.js" defer></script>"#));
        assert!(!lower.contains("<style"), "no inline style element");
        assert!(!lower.contains(" style="), "no style attribute");
        let handler = lower.match_indices(" on").any(|(at, _)| {
            let rest = &lower[at + 3..];
            let name = rest.split(|c: char| !c.is_ascii_alphabetic()).next();
            name.is_some_and(|name| !name.is_empty() && rest[name.len()..].starts_with('='))
        });
        assert!(!handler, "no inline event handler");
        assert!(lower.contains(r#"<link rel="stylesheet" href="/console.css">"#));
    }

    /// The script builds the page from text: no API of the DOM that parses HTML.
    #[test]
    fn the_script_never_parses_html() {
        for parser in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
            "DOMParser",
        ] {
            assert!(!SCRIPT.contains(parser), "console.js uses {parser}");
        }
    }

    /// The token is sent as a header and kept for the tab only, never put in a URL.
    #[test]
    fn the_token_travels_in_a_header_only() {
        assert!(SCRIPT.contains("sessionStorage"));
        assert!(!SCRIPT.contains("localStorage"));
        assert!(SCRIPT.contains("'Authorization'"));
        assert!(!SCRIPT.contains("access_token"));
    }
}
